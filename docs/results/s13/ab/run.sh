#!/usr/bin/env bash
# Base against new, alternated, R = 1 and 2 (docs/results/s13.md, "Two per-message cuts").
#   git worktree add /tmp/base a603491; for f in $(find wanxport emulation -name '*.so'); do cp $f /tmp/base/$f; done
#   BASE=/tmp/base NEW=$PWD OUT=docs/results/s13/ab bash docs/results/s13/ab/run.sh
# ROUNDS and RANKS (the rounds, and the ranks per site in the order run) default to s13's.
set -uo pipefail
OUT=$(realpath "$OUT")
PY=${PY:-$NEW/.venv/bin/python}
for i in ${ROUNDS:-1 2 3}; do
  for r in ${RANKS:-1 2}; do
    for v in base new; do
      dir=$BASE; [ $v = new ] && dir=$NEW
      (cd "$dir" && flock /tmp/wanxport-tests.lock $PY -m emulation allreduce emulation/scenarios/allreduce-4route.toml \
          --comm wanxport --ranks-per-site $r --size 64MiB --steps 6 --json) > "$OUT/r$r-$v-$i.json"
    done
  done
done
