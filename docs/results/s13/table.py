import json,glob,statistics as st,sys
d=sys.argv[1]
rows={}
for f in sorted(glob.glob(d+'/r*-*-*.json')):
    name=f.split('/')[-1][:-5]; r,v,i=name.split('-')
    try: j=json.load(open(f))
    except Exception: print(name,'bad'); continue
    cpu=[sum(s[1:])/len(s[1:]) for s in j['rank_step_cpu_s']]
    print(f"{name:12s} eff {j['efficiency']:.3f} steady {j['steady_step_s']:.3f} first {j['first_step_s']:.2f} cpu/step/rank {st.mean(cpu):.3f} correct {j['correct']} engine {j['settings'].get('engine_cpu_s')}")
    rows.setdefault((r,v),[]).append((j['efficiency'],st.mean(cpu)))
for k,v in sorted(rows.items()):
    print(k,'median eff',round(st.median(x[0] for x in v),3),'median cpu',round(st.median(x[1] for x in v),3))
