import re,statistics,collections,sys
d=collections.defaultdict(lambda: {'old':[], 'new':[]})
for line in open(sys.argv[1]):
    if not line.startswith('Benchmark'): continue
    f=line.split()
    name=f[0]; m=re.match(r'(.*)/v=(old|new)$',name)
    if not m: continue
    ns=float(f[2])
    d[m.group(1)][m.group(2)].append(ns)
print("%-75s %9s %9s %7s %s"%("benchmark","old µs","new µs","new/old","paired ratios"))
for k,v in d.items():
    o,n=v['old'],v['new']
    if not o or not n: continue
    pr=[b/a for a,b in zip(o,n)]
    print("%-75s %9.1f %9.1f %7.3f %s"%(k.replace('BenchmarkHandoff/fsync=off/','Handoff/').replace('/impl=leasefence',''),statistics.median(o)/1e3,statistics.median(n)/1e3,statistics.median(n)/statistics.median(o)," ".join("%.2f"%x for x in pr)))
