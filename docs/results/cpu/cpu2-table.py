import json, sys, statistics as st
rows=[json.loads(l) for l in open(sys.argv[1])]
base = any('limits' in d for d in rows)
hdr=("| round | variant | goodput Gb/s | " + ("iperf3 -u | raw UDP | vs iperf3 | vs raw | " if base else "") + "CPU-s/GB sender | receiver | sender loop | digest | pacer thread | receiver loop | segs/GSO send | pacer sleeps/GB | " + ("AEAD | digest lim | sender/(A+D) | receiver/(A+D) | " if base else "") + "load |")
print(hdr); print("|" + "---|" * (hdr.count("|") - 1))
by={}
for d in rows:
    a=d['ab']; t=d.get('sender_cpu_s_per_gb_by_thread',{}); v=a['variant']
    segs=sum(p['datagrams_sent'] for p in d['paths'])/max(1,sum(p['gso_sends'] for p in d['paths']))
    rec=dict(g=d['goodput_bps']/1e9,s=d['cpu_s_per_gb']['sender'],r=d['cpu_s_per_gb']['receiver'],ls=d['loop_cpu_s_per_gb']['sender'],lr=d['loop_cpu_s_per_gb']['receiver'],p=t.get('pacer'),dg=t.get('digest'),segs=segs)
    cells=[str(a['round']), v, f"{rec['g']:.2f}"]
    if base:
        L=d['limits']; rec['vi']=d.get('goodput_vs_baseline'); rec['vr']=d.get('goodput_vs_raw_udp'); rec['cs']=d['cpu_vs_limit']['sender']; rec['cr']=d['cpu_vs_limit']['receiver']
        cells += [f"{d['baseline_iperf3_udp_bps']/1e9:.2f}", f"{L['raw_udp']['goodput_bps']/1e9:.1f}", f"{rec['vi']:.2f}", f"{rec['vr']:.3f}"]
    cells += [f"{rec['s']:.2f}", f"{rec['r']:.2f}", f"{rec['ls']:.2f}", f"{rec['dg']:.2f}" if rec['dg'] is not None else "–", f"{rec['p']:.2f}" if rec['p'] is not None else "–", f"{rec['lr']:.2f}", f"{segs:.1f}", str(d.get('pacer_sleeps_per_gb','–'))]
    if base:
        cells += [f"{L['aead']['cpu_s_per_gb']:.3f}", f"{L['digest']['cpu_s_per_gb']:.3f}", f"{rec['cs']:.2f}", f"{rec['cr']:.2f}"]
    cells += [str(a['load_1min'])]
    print("| " + " | ".join(cells) + " |")
    if d['intact'] is not True: print("NOT INTACT", a)
    by.setdefault(v,[]).append(rec)
print()
keys=['g','s','r','ls','lr','p','segs'] + (['vi','vr','cs','cr'] if base else [])
print("median | " + " | ".join(keys))
for v,rs in by.items():
    print(v, " | ".join(f"{st.median([x[k] for x in rs if x[k] is not None]):.3f}" if any(x[k] is not None for x in rs) else "–" for k in keys))
