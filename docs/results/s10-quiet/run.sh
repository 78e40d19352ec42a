#!/bin/sh
# Issue 14's must-show on a quiet host, session 10: R = 1 and R = 2, three runs each, and gloo.
cd "$(dirname "$0")/../../.."  # the repository root
OUT=docs/results/s10-quiet
PY=.venv/bin/python
for i in 1 2 3; do
  flock /tmp/wanxport-tests.lock $PY -m emulation allreduce allreduce-4route --comm wanxport --size 64MiB --steps 8 --json > $OUT/r1-wanxport-$i.json
  flock /tmp/wanxport-tests.lock $PY -m emulation allreduce allreduce-4route --comm wanxport --ranks-per-site 2 --size 64MiB --steps 8 --json > $OUT/r2-wanxport-$i.json
done
flock /tmp/wanxport-tests.lock $PY -m emulation allreduce allreduce-4route --comm gloo --size 64MiB --steps 3 --json > $OUT/r1-gloo.json
flock /tmp/wanxport-tests.lock $PY -m emulation allreduce allreduce-4route --comm gloo --ranks-per-site 2 --size 64MiB --steps 3 --json > $OUT/r2-gloo.json

