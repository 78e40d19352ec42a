#!/bin/bash
# Same-run A/B, variants alternated each round; one JSON report per line (with variant, round, load).
# usage: cpu2-ab.sh OUT.jsonl ROUNDS "EXTRA BENCH ARGS"   (VARIANTS="main branch ..." picks some)
# main: a throwaway tree of main's commit with its extensions built in place, e.g.
#   git worktree add /tmp/cpu2-main 1bea777 && (cd /tmp/cpu2-main && /work/wt/workers/.venv/bin/python setup.py build_ext --inplace)
# run from PYTHONPATH (it shadows the editable install; the receiver child inherits it).
out=$1; rounds=$2; extra=$3
PY=/work/wt/workers/.venv/bin/python
for r in $(seq 1 $rounds); do
  for v in main branch-oldknobs branch branch-ack128; do
    case $v in
      main) pp=/tmp/cpu2-main; args="";;
      branch-oldknobs) pp=/work/wt/workers; args="--pacer-burst-us 100 --pacer-spin-us 2";;
      branch) pp=/work/wt/workers; args="";;
      branch-ack128) pp=/work/wt/workers; args="--ack-every 128 --ack-delay-ms 2";;
    esac
    if [ -n "$VARIANTS" ] && ! [[ " $VARIANTS " == *" $v "* ]]; then continue; fi
    load=$(cut -d' ' -f1 /proc/loadavg)
    (cd /tmp && PYTHONPATH=$pp $PY -m wanxport bench --paths 4 --size 1GiB --mtu 1500 --json $extra $args) \
      | $PY -c "
import json,sys
d=json.loads(sys.stdin.read()); d['ab']={'variant':'$v','round':$r,'load_1min':$load,'args':'$extra $args'}
print(json.dumps(d,separators=(',',':')))" >> $out
  done
done
