#!/bin/bash
# A/B: old and new test binaries in alternating rounds; PATS holds one or
# more -test.bench patterns, separated by spaces.
cd "$(dirname "$0")"
out=${OUT:-raw.txt}; : > $out
rounds=${ROUNDS:-4}
for r in $(seq 1 $rounds); do
  if [ $((r % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
  for v in $order; do
    for pat in $PATS; do
      ./$v.test -test.run xxx -test.bench "$pat" -test.benchtime ${BT:-1s} 2>&1 | grep ^Bench | sed "s/-2 / /" | sed "s|^\(Benchmark[^ ]*\)|\1/v=$v|" >> $out
    done
  done
done
echo done >> $out
