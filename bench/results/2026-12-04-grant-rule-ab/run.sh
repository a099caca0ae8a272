#!/usr/bin/env bash
# Interleaved A/B/C: base (aedba62), head, puts; order rotates each round.
set -u
cd /tmp/ab
rows=()
add() { rows+=("^BenchmarkHandoff\$/^fsync=$1\$/^shape=$2\$/^contenders=$3\$/^impl=leasefence\$"); }
for n in 1 4 16 256; do add off shared $n; done
for n in 1 4 16; do add off each $n; done
for n in 4 16 256; do add off keeper $n; done
add on shared 4; add on shared 16; add on each 16; add on keeper 16
for r in $(seq "$1"); do
  case $((r % 3)) in 1) order="base head puts";; 2) order="head puts base";; 0) order="puts base head";; esac
  for row in "${rows[@]}"; do
    for v in $order; do
      timeout 120 ./$v.test -test.run '^$' -test.bench "$row" -test.benchtime 2s -test.count 1 2>/dev/null | grep -E '^Benchmark' >> $v.txt
    done
  done
  for fs in off on; do
    for v in $order; do
      timeout 120 ./$v.test -test.run '^$' -test.bench "^BenchmarkUncontended\$/^fsync=$fs\$/^work=put\$" -test.benchtime 2000x -test.count 1 2>/dev/null | grep -E '^Benchmark' >> $v.txt
    done
  done
  echo "round $r done $(date +%T)" >> progress.log
done
