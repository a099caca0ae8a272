import sys, re, collections, statistics as st
# per-round paired ratios new/old of sections/s, in file order
seq = collections.defaultdict(lambda: {'old': [], 'new': []})
for line in open(sys.argv[1]):
    if not line.startswith('Bench'): continue
    f = line.split(); m = re.match(r'(.*)/v=(\w+)$', f[0])
    i = f.index('sections/s'); seq[m.group(1)][m.group(2)].append(float(f[i-1]))
for b, d in seq.items():
    rs = [n/o for o, n in zip(d['old'], d['new'])]
    print(f"{b.replace('Benchmark',''):60s} " + ' '.join(f'{r:.2f}' for r in rs) + f"  median {st.median(rs):.3f}")
