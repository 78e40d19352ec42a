#!/bin/sh
# A/B of two builds (old: copy each sealed burst into the ring; new: seal into the ring slots),
# swapping the extension and the two Python files between runs: A B A B A B.
# /tmp/wk/old and /tmp/wk/new held the built wanxport/_native*.so, aio/native_lanes.py and
# aio/native_io.py of commits e72e141 (old) and 7a3cd31 (new); run under the lock.
cd /work/wt/workers
out=docs/results/cpu/seal-into-ring-ab.jsonl
for round in 1 2 3; do
  for v in old new; do
    cp /tmp/wk/$v/_native.cpython-311-x86_64-linux-gnu.so wanxport/
    cp /tmp/wk/$v/native_lanes.py /tmp/wk/$v/native_io.py wanxport/aio/
    .venv/bin/wanxport bench --paths 4 --size 1GiB --mtu 1500 --json > /tmp/wk/run.json 2>/tmp/wk/run.err
    python3 -c "
import json,os; r=json.load(open('/tmp/wk/run.json')); r['variant']='$v'; r['loadavg']=[round(x,2) for x in os.getloadavg()]
print(json.dumps(r,separators=(',',':')))" >> $out
    python3 -c "
import json; r=json.loads(open('$out').read().splitlines()[-1]); print(r['variant'], r['intact'], round(r['goodput_bps']/1e9,3), r['cpu_s_per_gb'], r.get('loop_cpu_s_per_gb'), r['loadavg'])"
  done
done
cp /tmp/wk/new/_native.cpython-311-x86_64-linux-gnu.so wanxport/
cp /tmp/wk/new/native_lanes.py /tmp/wk/new/native_io.py wanxport/aio/
