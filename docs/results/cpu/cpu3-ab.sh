#!/bin/bash
# Same-run A/B of bench knobs on one build, variants alternated each round; one JSON report per line
# (with variant, round, 1-minute load).
# usage: flock /tmp/wanxport-tests.lock nice -n 10 docs/results/cpu/cpu3-ab.sh OUT.jsonl ROUNDS "EXTRA BENCH ARGS"
out=$1; rounds=$2; extra=$3
PY=/work/wt/workers/.venv/bin/python
for r in $(seq 1 "$rounds"); do
  for v in ack1ms ack2ms; do
    case $v in
      ack1ms) args="";;                    # the bench's default: every 128 datagrams or within 1 ms
      ack2ms) args="--ack-delay-ms 2";;    # the same threshold, the delay doubled
    esac
    load=$(cut -d' ' -f1 /proc/loadavg)
    (cd /tmp && $PY -m wanxport bench --paths 4 --size 1GiB --mtu 1500 --json $extra $args) \
      | $PY -c "
import json,sys
d=json.loads(sys.stdin.read()); d['ab']={'variant':'$v','round':$r,'load_1min':$load,'args':'$extra $args'}
print(json.dumps(d,separators=(',',':')))" >> "$out"
  done
done
