import sys, re, statistics as st, collections
rows = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    if not line.startswith('Bench'): continue
    f = line.split()
    name = f[0]; m = re.match(r'(.*)/v=(\w+)$', name); base, v = m.group(1), m.group(2)
    for i in range(1, len(f)-1):
        if f[i+1] in ('sections/s', '%bound', 'cpu-µs/op', 'unary/op', 'streammsgs/op', 'p50-µs', 'p99-µs'):
            rows[base][(v, f[i+1])].append(float(f[i]))
for base in rows:
    r = rows[base]
    def med(v, k): 
        xs = r.get((v, k)); return st.median(xs) if xs else float('nan')
    so, sn = med('old','sections/s'), med('new','sections/s')
    print(f"{base.replace('BenchmarkHandoff/',''):55s} old {so:6.0f}/s {med('old','%bound'):5.1f}% {med('old','cpu-µs/op'):5.0f}cpu {med('old','unary/op'):.2f}+{med('old','streammsgs/op'):.2f} | new {sn:6.0f}/s {med('new','%bound'):5.1f}% {med('new','cpu-µs/op'):5.0f}cpu {med('new','unary/op'):.2f}+{med('new','streammsgs/op'):.2f} | x{sn/so:.3f}  %b range new {min(r[('new','%bound')]):.1f}-{max(r[('new','%bound')]):.1f}")
