#!/bin/bash
# Interleaved A/B of two builds of the impairment engine (emulation/_engine*.so):
#   MAIN_SO=/path/main.so NEW_SO=/path/new.so ROUNDS=3 OUT=dir docs/results/engine/ab.sh [allreduce|hetero]
# Each round runs the same command once with each build (the daemon loads the .so at start,
# so swapping the file between runs switches builds); the all-reduce part also runs gloo once
# per round with the new build. Run it under the shared lock (see docs/results/engine.md).
set -euo pipefail
cd "$(dirname "$0")/../../.."
SO=$(ls emulation/_engine.cpython-*.so)
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-/tmp/engine-ab}
mkdir -p "$OUT"
trap 'cp "$NEW_SO" "$SO"' EXIT
py() { nice -n 10 .venv/bin/python "$@"; }
for r in $(seq 1 "$ROUNDS"); do
  for build in main new; do
    if [ "$build" = main ]; then cp "$MAIN_SO" "$SO"; else cp "$NEW_SO" "$SO"; fi
    case "${1:-allreduce}" in
      allreduce) py -m emulation allreduce allreduce-4route --comm wanxport --size 64MiB --steps 3 --json \
                   > "$OUT/allreduce-$build-$r.json" ;;
      hetero) py -m emulation run hetero-8path --transport wanxport --size 64MiB --steps 5 --fec auto --json \
                > "$OUT/hetero-$build-$r.json" ;;
    esac
  done
  if [ "${1:-allreduce}" = allreduce ]; then
    cp "$NEW_SO" "$SO"
    py -m emulation allreduce allreduce-4route --comm gloo --size 64MiB --steps 3 --json > "$OUT/allreduce-gloo-$r.json"
  fi
done
