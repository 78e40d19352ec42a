#!/usr/bin/env bash
# The collective's receive hold-off: alternated all-reduce runs of worktrees that differ only in
# wanxport/collective/mesh.py's RECEIVE_HOLDOFF_S (docs/results/s15.md). Each VARIANT is NAME=DIR:
#   for v in 0 1 2; do git worktree add /tmp/h$v HEAD; for f in $(find wanxport emulation -name '*.so'); do cp $f /tmp/h$v/$f; done; done
#   (then set RECEIVE_HOLDOFF_S to 0.0, 0.001, 0.002 in each tree's mesh.py)
#   VARIANTS="h0=/tmp/h0 h1=/tmp/h1 h2=/tmp/h2" OUT=docs/results/s15/holdoff ROUNDS="1 2 3" bash docs/results/s15/holdoff/run.sh
set -euo pipefail
PY=${PY:-/work/main/.venv/bin/python}
for i in ${ROUNDS:-1 2 3}; do
  for r in ${RANKS:-1 2}; do
    for v in $VARIANTS; do
      name=${v%%=*}; dir=${v#*=}
      (cd "$dir" && flock /tmp/wanxport-tests.lock $PY -m emulation allreduce allreduce-4route --comm wanxport \
          --ranks-per-site "$r" --size 64MiB --steps ${STEPS:-8} --json) > "$OUT/r$r-$name-$i.json"
    done
  done
done
