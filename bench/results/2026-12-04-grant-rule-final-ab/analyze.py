import statistics, collections, sys
def load(fn):
    d = collections.defaultdict(lambda: collections.defaultdict(list))
    for line in open(fn):
        f = line.split()
        name = f[0].rsplit('-', 1)[0].replace('BenchmarkHandoff/', '').replace('/impl=leasefence', '').replace('BenchmarkUncontended/', 'uncontended/')
        for i in range(2, len(f) - 1, 2):
            try: d[name][f[i+1]].append(float(f[i]))
            except ValueError: pass
    return d
b, h = load('aedba62.txt'), load('head.txt')
print('| row | aedba62 | head | head/base | unary/op base → head | stream/op base → head | n |')
print('|---|---|---|---|---|---|---|')
for row in sorted(b):
    m = 'leasefence/mutex' if row.startswith('uncontended') else 'sections/s'
    bm, hm = statistics.median(b[row][m]), statistics.median(h[row][m])
    u = lambda d, k: statistics.median(d[row][k]) if d[row].get(k) else float('nan')
    print(f"| {row} | {bm:.4g} | {hm:.4g} | {hm/bm:.2f} | {u(b,'unary/op'):.2f} → {u(h,'unary/op'):.2f} | {u(b,'streammsgs/op'):.2f} → {u(h,'streammsgs/op'):.2f} | {len(b[row][m])}/{len(h[row][m])} |")
