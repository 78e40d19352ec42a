#!/usr/bin/env bash
# The collective's core packets, 64 datagrams (base) against 128 (new), alternated, R = 1 and 2.
#   git worktree add /tmp/seg128 HEAD; for f in $(find wanxport emulation -name '*.so'); do cp $f /tmp/seg128/$f; done
#   sed -i 's/^SEGMENTS = 64$/SEGMENTS = 128/' /tmp/seg128/wanxport/collective/mesh.py
#   BASE=$PWD NEW=/tmp/seg128 OUT=docs/results/s14/segments ROUNDS="1 2" bash docs/results/s14/segments/run.sh
set -uo pipefail
OUT=$(realpath "$OUT")
PY=${PY:-$BASE/.venv/bin/python}
for i in ${ROUNDS:-1 2 3}; do
  for r in 2 1; do
    for v in base new; do
      dir=$BASE; [ $v = new ] && dir=$NEW
      (cd "$dir" && flock /tmp/wanxport-tests.lock $PY -m emulation allreduce emulation/scenarios/allreduce-4route.toml \
          --comm wanxport --ranks-per-site $r --size 64MiB --steps 6 --json) > "$OUT/r$r-$v-$i.json"
    done
  done
done
