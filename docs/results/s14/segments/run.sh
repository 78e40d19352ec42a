#!/usr/bin/env bash
# The collective's core packets, 64 datagrams (base) against 128 (new), alternated, R = 2 then 1.
#   git worktree add /tmp/seg128 HEAD; for f in $(find wanxport emulation -name '*.so'); do cp $f /tmp/seg128/$f; done
#   sed -i 's/^SEGMENTS = 64$/SEGMENTS = 128/' /tmp/seg128/wanxport/collective/mesh.py
#   BASE=$PWD NEW=/tmp/seg128 OUT=docs/results/s14/segments ROUNDS="1 2" bash docs/results/s14/segments/run.sh
# The loop is s13's A/B script; PY is the base's venv, since the worktree has none.
PY=${PY:-$BASE/.venv/bin/python} RANKS="2 1" exec bash "$(dirname "$0")/../../s13/ab/run.sh"
