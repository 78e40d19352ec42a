#!/usr/bin/env bash
# Issue 14's must-show on this session's host: wanxport and gloo, R = 1 and 2, alternated.
#   OUT=docs/results/s13 ROUNDS="1 2" bash docs/results/s13/run.sh
set -uo pipefail
PY=${PY:-.venv/bin/python}
for i in ${ROUNDS:-1 2}; do
  for r in 1 2; do
    flock /tmp/wanxport-tests.lock $PY -m emulation allreduce allreduce-4route --comm wanxport \
        --ranks-per-site $r --size 64MiB --steps 6 --json > "$OUT/r$r-wanxport-$i.json"
    flock /tmp/wanxport-tests.lock $PY -m emulation allreduce allreduce-4route --comm gloo \
        --ranks-per-site $r --size 64MiB --steps 3 --json > "$OUT/r$r-gloo-$i.json"
  done
done
