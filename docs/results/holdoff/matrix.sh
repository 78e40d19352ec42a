#!/usr/bin/env bash
# The emulated matrix with and without the change (BASE, NEW as in run.sh), alternated, ROUNDS rounds.
#   BASE=/tmp/base NEW=$PWD OUT=docs/results/holdoff bash docs/results/holdoff/matrix.sh
#   ROUNDS="2 3" SCENARIOS="hetero-8path east-west-us" ... for more rounds of some of them
set -euo pipefail
PY=${PY:-$NEW/.venv/bin/python}
for i in ${ROUNDS:-1}; do
  for s in ${SCENARIOS:-hetero-8path east-west-us failover-4path lossy-long-2path}; do
    for side in base new; do
      dir=$BASE; [ $side = new ] && dir=$NEW
      (cd "$dir" && flock /tmp/wanxport-tests.lock $PY -m emulation run $s --transport wanxport --json) \
          > "$OUT/matrix-$s-$side-$i.json"
    done
  done
done
