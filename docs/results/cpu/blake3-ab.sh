#!/usr/bin/env bash
# Same-run A/B of two trees on the loopback bench, alternating base and new, ROUNDS times.
#   BASE=<a worktree of the base commit, with the .so files copied in> NEW=<this tree> \
#   OUT=<dir> ROUNDS=3 bash docs/results/cpu/blake3-ab.sh
# Each tree runs from its own directory (PYTHONPATH) with this tree's .venv.
set -euo pipefail
: "${BASE:?a base worktree}" "${NEW:=$(pwd)}" "${OUT:?an output directory}" "${ROUNDS:=3}"
PY="$NEW/.venv/bin/python"
mkdir -p "$OUT"
for i in $(seq 1 "$ROUNDS"); do
  for tree in base new; do
    dir=$NEW; [ "$tree" = base ] && dir=$BASE
    (cd "$dir" && PYTHONPATH="$dir" flock /tmp/wanxport-tests.lock "$PY" -m wanxport bench \
        --paths 4 --size 1GiB --mtu 1500 --baseline all --json > "$OUT/ab-$tree-$i.json")
  done
done
