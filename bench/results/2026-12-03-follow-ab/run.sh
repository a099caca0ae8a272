#!/bin/bash
# A/B: old and new test binaries in alternating rounds.
cd "$(dirname "$0")"
out=${OUT:-raw.txt}; : > $out
rounds=${ROUNDS:-4}
for r in $(seq 1 $rounds); do
  if [ $((r % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
  for v in $order; do
    ./$v.test -test.run xxx -test.bench "${PAT:-BenchmarkHandoff/fsync=off/shape=(shared|each|keeper)/contenders=(4|16|256)$/impl=leasefence$}" -test.benchtime ${BT:-1s} 2>&1 | grep ^Bench | sed "s/-2 / /" | sed "s|^\(Benchmark[^ ]*\)|\1/v=$v|" >> $out
  done
done
echo done >> $out
