#!/usr/bin/env python3
"""Medians per build and shape of raw.txt (run.sh's output)."""
import re, statistics, sys
from collections import defaultdict

rows = defaultdict(lambda: defaultdict(list))
for line in open(sys.argv[1] if len(sys.argv) > 1 else "raw.txt"):
    m = re.match(r"Benchmark(\w+)/Handoff/fsync=off/shape=(\w+)/contenders=16", line)
    if not m:
        continue
    f = line.split()
    metrics = {f[i + 1]: float(f[i]) for i in range(2, len(f) - 1, 2)}
    for k in ("sections/s", "%bound", "cpu-µs/op", "unary/op", "streammsgs/op"):
        rows[(m.group(1), m.group(2))][k].append(metrics[k])
print("build   shape   rounds  sections/s  %bound (min-max)     cpu-µs/op  unary + stream")
for (build, shape), ms in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    med = {k: statistics.median(v) for k, v in ms.items()}
    print(f"{build:7} {shape:7} {len(ms['%bound']):6}  {med['sections/s']:10.0f}  {med['%bound']:5.1f} ({min(ms['%bound']):.1f}-{max(ms['%bound']):.1f})"
          f"   {med['cpu-µs/op']:9.0f}  {med['unary/op']:.2f} + {med['streammsgs/op']:.2f}")
