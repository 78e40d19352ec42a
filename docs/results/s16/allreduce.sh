#!/usr/bin/env bash
# Issue 14's all-reduce, this tree (new) against another checkout (base), alternated:
#   BASE=/tmp/wx-start NEW=$PWD OUT=docs/results/s16/allreduce ROUNDS="1 2" RANKS="1 2" bash docs/results/s16/allreduce.sh
# BASE needs its C extensions built in place; both run with NEW's .venv, as root.
set -euo pipefail
PY=${PY:-$NEW/.venv/bin/python}
COMM=${COMM:-wanxport}
mkdir -p "$OUT"
for i in ${ROUNDS:-1 2}; do
  for r in ${RANKS:-1 2}; do
    for side in ${SIDES:-base new}; do
      dir=$BASE; [ $side = new ] && dir=$NEW
      (cd "$dir" && flock /tmp/wanxport-tests.lock $PY -m emulation allreduce allreduce-4route --comm $COMM \
          --ranks-per-site "$r" --size 64MiB --steps 8 --json) > "$OUT/$COMM-r$r-$side-$i.json"
      python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1], d['efficiency'], d['steady_step_s'], d['first_step_s'], d['correct'])" \
          "$OUT/$COMM-r$r-$side-$i.json"
    done
  done
done
