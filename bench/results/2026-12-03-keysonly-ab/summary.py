import sys,statistics as st,re
rows={}
cur=None
for line in open(sys.argv[1]):
    if line.startswith("=="):
        _,i,b=line.split(); cur=(int(i),b); continue
    if line.startswith("Benchmark") and cur:
        f=line.split()
        d={f[k+1]:float(f[k]) for k in range(4,len(f)-1,2)}
        rows[cur]=d
bins=sorted(set(b for _,b in rows))
for b in bins:
    r=[rows[k]["leasefence/mutex"] for k in sorted(rows) if k[1]==b]
    g=[rows[k]["mutex-guarded-unlock/mutex"] for k in sorted(rows) if k[1]==b]
    print(b, "n=%d"%len(r), "ours/mutex median %.3f (%.3f-%.3f)"%(st.median(r),min(r),max(r)), "guarded/mutex median %.3f"%st.median(g))
if len(bins)==2:
    a,c=bins
    pr=[rows[(i,c)]["leasefence/mutex"]/rows[(i,a)]["leasefence/mutex"] for i in sorted(set(i for i,_ in rows)) if (i,a) in rows and (i,c) in rows]
    print("paired %s/%s of the ratio: median %.3f (%.3f-%.3f)"%(c,a,st.median(pr),min(pr),max(pr)))
