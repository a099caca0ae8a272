#!/usr/bin/env python3
"""The README's handoff table (stdout) and the bound, uncontended and
after-contention medians (stderr) from a raw go test -bench output."""
import sys, re, statistics as st, collections
vals = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    m = re.match(r'^(Benchmark\S+?)(-\d+)?\s+\d+\s+(.*)$', line)
    if not m: continue
    name, rest = m.group(1), m.group(3).split()
    for i in range(0, len(rest)-1, 2):
        try: vals[name][rest[i+1]].append(float(rest[i]))
        except ValueError: pass
def med(name, unit):
    xs = vals.get(name, {}).get(unit); return st.median(xs) if xs else None
clients = {'shared': 'one shared', 'keeper': 'one shared, Keeper', 'each': 'one each'}
print("| fsync | clients | contenders | leasefence/s | Mutex/s | × Mutex | % of commit bound | requests per handoff (unary + stream messages) | CPU per handoff |")
print("|---|---|---|---|---|---|---|---|---|")
for fs in ['off', 'on']:
    for shape in ['shared', 'keeper', 'each']:
        for n in [1, 4, 16, 256]:
            ours = f"BenchmarkHandoff/fsync={fs}/shape={shape}/contenders={n}/impl=leasefence"
            mtx = f"BenchmarkHandoff/fsync={fs}/shape={'shared' if shape=='keeper' else shape}/contenders={n}/impl=concurrency.Mutex"
            r = med(ours, 'sections/s')
            if r is None: continue
            mr = med(mtx, 'sections/s')
            x = r/mr
            xs = f"{x:.2f}×" if x < 10 else f"{x:.0f}×" if x >= 20 else f"{x:.1f}×"
            print(f"| {fs} | {clients[shape]} | {n} | {r:.0f} | {mr:.{0 if mr>=100 else 1}f} | {xs} | {med(ours,'%bound'):.0f}% | {med(ours,'unary/op'):.0f} + {med(ours,'streammsgs/op'):.1f} | {med(ours,'cpu-µs/op')/1000:.2f} ms |")
# bound spread
for fs in ['off','on']:
    b=[]
    for name in vals:
        if f"fsync={fs}" in name and name.startswith('BenchmarkHandoff') and 'impl=leasefence' in name:
            for rate, pct in zip(vals[name]['sections/s'], vals[name]['%bound']): b.append(100*rate/pct)
    if b: print(f"bound fsync={fs}: min {min(b):.0f} median {st.median(b):.0f} max {max(b):.0f}", file=sys.stderr)
for name in sorted(vals):
    if 'Uncontended' in name or 'AfterContention' in name:
        print(name, {k: round(st.median(v),3) for k,v in vals[name].items()}, file=sys.stderr)
