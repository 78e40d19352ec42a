#!/bin/sh
# The simulator's efficiency on the bundled scenarios, main (e4ef9f9, /tmp/cpu4/base) vs this
# branch (virtual time: deterministic, unaffected by load). Usage: sh THIS OUT.jsonl
OUT=$1; PY=/work/wt/workers/.venv/bin/python; S=/work/wt/workers/emulation/scenarios
cd /tmp
for s in clean-2path hetero-8path lossy-long-2path failover-4path east-west-us ack-loss-jitter near-far-6path validate-3path; do
  for v in main cpu4; do
    if [ $v = main ]; then P=/tmp/cpu4/base; else P=; fi
    PYTHONPATH=$P $PY -m wanxport sim $S/$s.toml --size 64MiB --json | tail -1 | $PY -c "
import json,sys; d=json.loads(sys.stdin.read()); print(json.dumps({'scenario':'$s','variant':'$v','efficiency':d.get('efficiency'),'completion_s':d.get('completion_s'),'intact':d.get('intact'),'retransmitted_bytes':sum(p.get('retransmitted_bytes',0) for p in d.get('paths',[]))}))" >> "$OUT"
    tail -1 "$OUT"
  done
done
