#!/usr/bin/env bash
# Every bundled scenario but wide-256path (hours) simulated by one checkout, one JSON each:
#   bash docs/results/s17/simall.sh TREE OUTDIR [extra `wanxport sim` arguments]
# TREE: a checkout (its own sources are imported); runs with this checkout's .venv.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
tree=$(cd "$1" && pwd); out=$2; shift 2
mkdir -p "$out"; out=$(cd "$out" && pwd)
for f in "$ROOT"/emulation/scenarios/*.toml; do
  n=$(basename "$f" .toml)
  [ "$n" = wide-256path ] && continue
  (cd "$tree" && "$ROOT/.venv/bin/python" -m wanxport sim "$f" --json "$@" > "$out/$n.json")
  echo "$n done"
done
