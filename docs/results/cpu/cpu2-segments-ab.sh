#!/bin/bash
# Same-run A/B of core-packet sizes on the branch, alternated each round (see cpu2-ab.sh).
out=$1; rounds=$2
PY=/work/wt/workers/.venv/bin/python
for r in $(seq 1 $rounds); do
  for v in ${ORDER:-branch branch-seg128 branch-seg88}; do
    case $v in
      branch) args="";;
      branch-seg128) args="--segments 128";;
      branch-seg88) args="--segments 88";;
    esac
    load=$(cut -d' ' -f1 /proc/loadavg)
    (cd /tmp && PYTHONPATH=/work/wt/workers $PY -m wanxport bench --paths 4 --size 1GiB --mtu 1500 --json $args) \
      | $PY -c "
import json,sys
d=json.loads(sys.stdin.read()); d['ab']={'variant':'$v','round':$r,'load_1min':$load,'args':'$args'}
print(json.dumps(d,separators=(',',':')))" >> $out
  done
done
