#!/bin/sh
# Same-run interleaved A/B of the issue-17 must-show command: main (e4ef9f9) vs this branch.
# The base tree is prepared with
#   git archive e4ef9f9 | tar -x -C /tmp/cpu4/base && cp wanxport/*.so /tmp/cpu4/base/wanxport/
# (the C extensions are the same on both sides) and the script runs under the lock:
#   flock /tmp/wanxport-tests.lock nice -n 10 sh docs/results/cpu/cpu4-ab.sh OUT.jsonl ROUNDS
# One JSON report per line, with its variant, round and the 1-minute load when it started.
OUT=$1; ROUNDS=${2:-3}; BASE=/tmp/cpu4/base; PY=/work/wt/workers/.venv/bin/python
cd /tmp
for r in $(seq 1 "$ROUNDS"); do
  for v in main cpu4; do
    load=$(cut -d' ' -f1 /proc/loadavg)
    if [ $v = main ]; then
      line=$(PYTHONPATH=$BASE $PY -m wanxport bench --paths 4 --size 1GiB --mtu 1500 --baseline all --json | tail -1)
    else
      line=$($PY -m wanxport bench --paths 4 --size 1GiB --mtu 1500 --baseline all --json | tail -1)
    fi
    echo "$line" | $PY -c "import json,sys; d=json.loads(sys.stdin.read()); d['ab']={'variant':'$v','round':$r,'load_1min':float('$load')}; print(json.dumps(d,separators=(',',':')))" >> "$OUT"
    tail -1 "$OUT" | $PY -c "import json,sys; d=json.loads(sys.stdin.read()); print(d['ab'], round(d['goodput_bps']/1e9,2), d['cpu_s_per_gb'], d.get('cpu_vs_limit'), d.get('sender_cpu_s_per_gb_by_thread'), d.get('sender_loop_events_per_gb'))"
  done
done
