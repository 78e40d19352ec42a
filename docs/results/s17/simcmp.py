"""Efficiency of each scenario, base against new: python simcmp.py BASEDIR NEWDIR (JSONs of simall.sh)."""
import json, glob, os, sys
a, b = sys.argv[1], sys.argv[2]
for f in sorted(glob.glob(a + '/*.json')):
    n = os.path.basename(f)[:-5]
    try:
        x = json.load(open(f)); y = json.load(open(os.path.join(b, n + '.json')))
    except Exception as e:
        print(n, 'missing', e); continue
    ex, ey = x.get('efficiency'), y.get('efficiency')
    rx = sum(p.get('retransmitted_bytes', 0) for p in x['paths']) / 1e6
    ry = sum(p.get('retransmitted_bytes', 0) for p in y['paths']) / 1e6
    print(f"{n:28s} eff {ex} -> {ey}  ({(ey/ex-1)*100 if ex and ey else 0:+.1f}%)  completion {x['completion_s']:.3f} -> {y['completion_s']:.3f}  retx MB {rx:.1f} -> {ry:.1f}  intact {x['intact']} {y['intact']}")
