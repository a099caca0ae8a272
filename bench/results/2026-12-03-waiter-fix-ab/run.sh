#!/bin/bash
cd /tmp/ab
out=/tmp/ab/ab3.txt; : > $out
for r in 1 2 3 4 5 6; do
  if [ $((r % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
  for v in $order; do
    for pat in 'BenchmarkHandoff/fsync=off/shape=(shared|keeper|each)/contenders=(1|4|16)$/impl=leasefence$' \
               'BenchmarkHandoff/fsync=off/shape=(shared|keeper)/contenders=256/impl=leasefence$' \
               'BenchmarkUncontended/fsync=off' 'BenchmarkGuardedPut/fsync=off' \
               'BenchmarkElectionHandoff/candidates=(1|4)/impl=leasefence$' \
               'BenchmarkReadLock/fsync=off/shape=shared/contenders=(1|4|16)/impl=leasefence'; do
      ./$v.test -test.run xxx -test.bench "$pat" -test.benchtime 1s 2>&1 | grep ^Bench | sed "s/^Benchmark/Benchmark/;s/-2 / /" | sed "s|^\(Benchmark[^ ]*\)|\1/v=$v|" >> $out
    done
  done
done
echo done >> $out
