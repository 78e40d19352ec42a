#!/bin/sh
# Issue 14's must-show, second batch on the quiet host: R = 1 and R = 2 alternated, then compression.
cd "$(dirname "$0")/../../.."  # the repository root
OUT=docs/results/s10-quiet
PY=.venv/bin/python
AR="flock /tmp/wanxport-tests.lock $PY -m emulation allreduce allreduce-4route --size 64MiB"
for i in 4 5 6 7 8; do
  $AR --comm wanxport --steps 8 --json > $OUT/r1-wanxport-$i.json
  $AR --comm wanxport --ranks-per-site 2 --steps 8 --json > $OUT/r2-wanxport-$i.json
done
for c in int8 bf16; do
  $AR --comm wanxport --steps 8 --compress $c --json > $OUT/r1-wanxport-$c.json
  $AR --comm wanxport --ranks-per-site 2 --steps 8 --compress $c --json > $OUT/r2-wanxport-$c.json
done
$AR --comm gloo --steps 3 --json > $OUT/r1-gloo-2.json
$AR --comm gloo --ranks-per-site 2 --steps 3 --json > $OUT/r2-gloo-2.json

