#!/bin/bash
# Rounds in turns of three builds of bench: head (the code as committed),
# near16 (near16.patch: every waiter up to 16 back follows the queue
# watch) and noread (noread.patch: an upper bound, not a correct lock: a
# far waiter takes a followed key's deletion as proof that everything
# older went, so it never reads again, and the enqueue writes one more
# key, as a marker a correct version of that shape would need).
# Build: go test -c -o DIR/head.test ./bench; apply a patch, build
# DIR/near16.test or DIR/noread.test, revert.
set -eu
DIR=${DIR:-/tmp/prof2}
ROUNDS=${ROUNDS:-6}
PAT='BenchmarkHandoff/fsync=off/shape=(shared|each)/contenders=16$/impl=leasefence'
order=(head near16 noread)
for r in $(seq 1 "$ROUNDS"); do
  for i in 0 1 2; do
    t=${order[$(( (i + r) % 3 ))]}
    echo "# round $r binary $t"
    "$DIR/$t.test" -test.run '^$' -test.bench "$PAT" -test.benchtime 2s | grep '^Benchmark' | sed "s/^Benchmark/Benchmark$t\//"
  done
done
