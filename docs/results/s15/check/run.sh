#!/usr/bin/env bash
# The all-reduce with the result check after a barrier (new) against the check as soon as a
# rank's own step ends (base), alternated (docs/results/s15.md). BASE: a worktree of the commit
# before (its native .so files copied in); NEW: the change.
#   BASE=/tmp/base NEW=$PWD OUT=docs/results/s15/check ROUNDS="1 2 3" bash docs/results/s15/check/run.sh
set -euo pipefail
PY=${PY:-$NEW/.venv/bin/python}
for i in ${ROUNDS:-1 2 3}; do
  for r in ${RANKS:-1 2}; do
    for side in base new; do
      dir=$BASE; [ $side = new ] && dir=$NEW
      (cd "$dir" && flock /tmp/wanxport-tests.lock $PY -m emulation allreduce allreduce-4route --comm wanxport \
          --ranks-per-site "$r" --size 64MiB --steps 8 --json) > "$OUT/r$r-$side-$i.json"
    done
  done
done
