#!/usr/bin/env bash
# A/B of the receive hold-off and the drain before a deadline (docs/results/holdoff.md).
# BASE is a worktree of the commit before the change (its native .so files copied in), NEW the
# change. Runs alternate; each is an 8-step 64 MiB all-reduce over the engine's emulated WAN.
#   git worktree add /tmp/base <commit before>; for f in $(find wanxport emulation -name '*.so'); do cp $f /tmp/base/$f; done
#   BASE=/tmp/base NEW=$PWD OUT=docs/results/holdoff bash docs/results/holdoff/run.sh
set -euo pipefail
PY=${PY:-$NEW/.venv/bin/python}
for i in 1 2 3; do
  for r in 1 2; do
    for side in base new; do
      dir=$BASE; [ $side = new ] && dir=$NEW
      (cd "$dir" && flock /tmp/wanxport-tests.lock $PY -m emulation allreduce allreduce-4route --comm wanxport \
          --ranks-per-site $r --size 64MiB --steps 8 --json) > "$OUT/r$r-$side-$i.json"
    done
  done
done
