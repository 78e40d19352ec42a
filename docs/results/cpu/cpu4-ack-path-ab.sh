#!/bin/sh
# Core-only A/B of the sender's ACK handling (benchmarks/ack_path.py), rounds interleaved:
# main (e4ef9f9, tree at /tmp/cpu4/base as in cpu4-ab.sh) one ACK at a time, this branch one at a
# time, this branch in batches. Under the lock: flock /tmp/wanxport-tests.lock nice -n 10 sh THIS OUT ROUNDS
OUT=$1; ROUNDS=${2:-3}; PY=/work/wt/workers/.venv/bin/python; B=/work/wt/workers/benchmarks/ack_path.py
ARGS="--size 256MiB --wake-us 5000 --json"
for r in $(seq 1 "$ROUNDS"); do
  for v in main-single cpu4-single cpu4-batch; do
    load=$(cut -d' ' -f1 /proc/loadavg)
    case $v in
      main-single) line=$(PYTHONPATH=/tmp/cpu4/base $PY $B $ARGS --mode single);;
      cpu4-single) line=$($PY $B $ARGS --mode single);;
      cpu4-batch) line=$($PY $B $ARGS --mode batch);;
    esac
    echo "$line" | $PY -c "import json,sys; d=json.loads(sys.stdin.read()); d.update(variant='$v', round=$r, load_1min=float('$load')); print(json.dumps(d,separators=(',',':')))" | tee -a "$OUT"
  done
done
