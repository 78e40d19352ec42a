#!/usr/bin/env bash
# Issue 17's emulated target, this tree (new) against another checkout (base), alternated:
#   BASE=/tmp/wx-start NEW=$PWD OUT=docs/results/s16/matrix ROUNDS="1 2 3" bash docs/results/s16/matrix.sh
# BASE needs its C extensions built in place (python setup.py build_ext --inplace); both run
# with NEW's .venv, as root (network namespaces).
set -euo pipefail
PY=${PY:-$NEW/.venv/bin/python}
mkdir -p "$OUT"
for i in ${ROUNDS:-1 2 3}; do
  for s in ${SCENARIOS:-hetero-8path east-west-us}; do
    for side in base new; do
      dir=$BASE; [ $side = new ] && dir=$NEW
      (cd "$dir" && flock /tmp/wanxport-tests.lock $PY -m emulation run $s --transport wanxport --json) \
          > "$OUT/$s-$side-$i.json"
      python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1], d['efficiency'], d['intact'])" \
          "$OUT/$s-$side-$i.json"
    done
  done
done
