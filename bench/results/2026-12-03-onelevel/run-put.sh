#!/bin/bash
# Guarded puts in turns, old (HEAD before the one-level shape) and new, six rounds alternating which binary goes first.
cd /tmp/ab
out=/tmp/ab/put-ab.txt  # copied here as guarded-put-ab.txt; : > $out
for r in 1 2 3 4 5 6; do
  if [ $((r % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
  for v in $order; do
    ./$v.test -test.run xxx -test.bench 'BenchmarkGuardedPut' -test.benchtime 3000x 2>&1 | grep ^Bench | sed "s/-2 / /" | sed "s|^\(Benchmark[^ ]*\)|\1/v=$v|" >> $out
  done
done
echo done >> $out
