#!/bin/sh
# ackpath A/B (docs/results/cpu.md, "Session 5"): trees prepared with
#   git archive 9ca661b | tar -x -C /tmp/ackpath/base   (+ the built wanxport/*.so copied in)
#   git archive 0a15be5 | tar -x -C /tmp/ackpath/cut1   (stepwise series only)
# and run under the lock: flock /tmp/wanxport-tests.lock sh ackpath-ab.sh OUT.jsonl 6
# The ack-frequency series used a copy of the branch whose bench/transfer.py read
# ack_threshold / max_ack_delay_s from WX_ACK_THRESHOLD / WX_ACK_DELAY_S (not committed).
OUT=$1; ROUNDS=${2:-3}; BASE=/tmp/ackpath/base; PY=/work/wt/workers/.venv/bin/python
cd /tmp
for r in $(seq 1 $ROUNDS); do
  for v in base new; do
    load=$(cut -d' ' -f1 /proc/loadavg)
    if [ $v = base ]; then
      line=$(PYTHONPATH=$BASE $PY -m wanxport bench --paths 4 --size 1GiB --mtu 1500 --baseline all --json | tail -1)
    else
      line=$($PY -m wanxport bench --paths 4 --size 1GiB --mtu 1500 --baseline all --json | tail -1)
    fi
    echo "$line" | $PY -c "import json,sys; d=json.loads(sys.stdin.read()); d['variant']='$v'; d['round']=$r; d['load_1min']=float('$load'); print(json.dumps(d,separators=(',',':')))" >> $OUT
    tail -1 $OUT | $PY -c "import json,sys; d=json.loads(sys.stdin.read()); print(d['round'], d['variant'], round(d['goodput_bps']/1e9,2), d['cpu_s_per_gb'], d['loop_cpu_s_per_gb'], d['cpu_vs_limit'], d['load_1min'])"
  done
done
