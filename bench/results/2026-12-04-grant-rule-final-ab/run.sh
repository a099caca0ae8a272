#!/usr/bin/env bash
# Interleaved A/B: base (aedba62) and head; order alternates each round.
set -u
cd /tmp/ab
rows=()
add() { rows+=("^BenchmarkHandoff\$/^fsync=$1\$/^shape=$2\$/^contenders=$3\$/^impl=leasefence\$"); }
for fs in off on; do
  for sh in shared keeper; do for n in 1 4 16 256; do add $fs $sh $n; done; done
  for n in 1 4 16; do add $fs each $n; done
done
for r in $(seq "$1"); do
  if [ $((r % 2)) = 1 ]; then order="base head"; else order="head base"; fi
  for row in "${rows[@]}"; do
    for v in $order; do
      timeout 150 ./$v.test -test.run '^$' -test.bench "$row" -test.benchtime 2s -test.count 1 2>/dev/null | grep -E '^Benchmark' >> $v.txt
    done
  done
  for fs in off on; do
    for v in $order; do
      timeout 150 ./$v.test -test.run '^$' -test.bench "^BenchmarkUncontended\$/^fsync=$fs\$/^work=put\$" -test.benchtime 2000x -test.count 1 2>/dev/null | grep -E '^Benchmark' >> $v.txt
    done
  done
  echo "round $r done $(date +%T)" >> progress.log
done
