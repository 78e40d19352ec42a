#!/usr/bin/env bash
# The receive hold-off as a group's default: 0, 1 ms, 2 ms, alternated (docs/results/s13.md).
# Each variant is a worktree of a603491 with a temporary patch (not landed): GatewayOptions gains
# receive_holdoff_s, passed to EndpointConfig in gateway/handshake.py, and
# collective/mesh.py's default_options() sets it to 0.000 (h0), 0.001 (h1) or 0.002 (h2).
#   H0=/tmp/h0 H1=/tmp/h1 H2=/tmp/h2 OUT=docs/results/s13/holdoff bash docs/results/s13/holdoff/run.sh
set -uo pipefail
OUT=$(realpath "$OUT")
PY=${PY:-.venv/bin/python}
PY=$(realpath "$PY")
for i in 1 2 3; do
  for r in 1 2; do
    for v in h0 h1 h2; do
      dir=$H0; [ $v = h1 ] && dir=$H1; [ $v = h2 ] && dir=$H2
      (cd "$dir" && flock /tmp/wanxport-tests.lock $PY -m emulation allreduce emulation/scenarios/allreduce-4route.toml \
          --comm wanxport --ranks-per-site $r --size 64MiB --steps 6 --json) > "$OUT/r$r-$v-$i.json"
    done
  done
done
