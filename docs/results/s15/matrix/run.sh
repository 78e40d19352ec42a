#!/usr/bin/env bash
# Issue 17's emulated target on this tree: ROUNDS alternated runs of each scenario (docs/results/s15.md).
#   OUT=docs/results/s15/matrix ROUNDS="1 2 3" bash docs/results/s15/matrix/run.sh
set -euo pipefail
PY=${PY:-.venv/bin/python}
for i in ${ROUNDS:-1 2 3}; do
  for s in ${SCENARIOS:-hetero-8path east-west-us}; do
    flock /tmp/wanxport-tests.lock $PY -m emulation run $s --transport wanxport --json > "$OUT/$s-$i.json"
  done
done
