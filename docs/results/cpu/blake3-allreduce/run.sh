#!/usr/bin/env bash
# All-reduce R = 1, base tree against new, alternated (docs/results/cpu.md, session 11).
#   BASE=<worktree of the base commit, .so files copied in> NEW=$PWD OUT=<dir> ROUNDS="1 2 3" \
#   bash docs/results/cpu/blake3-allreduce/run.sh
set -euo pipefail
: "${BASE:?}" "${NEW:=$(pwd)}" "${OUT:?}" "${ROUNDS:=1 2 3}"
PY="$NEW/.venv/bin/python"
for i in $ROUNDS; do
  for side in base new; do
    dir=$BASE; [ "$side" = new ] && dir=$NEW
    (cd "$dir" && flock /tmp/wanxport-tests.lock "$PY" -m emulation allreduce allreduce-4route --comm wanxport \
        --ranks-per-site 1 --size 64MiB --steps 8 --json) > "$OUT/r1-$side-$i.json"
  done
done
