#!/usr/bin/env bash
# Same-run A/B of two checkouts' loopback bench, alternated: BASE NEW BASE NEW ...
#   BASE=/tmp/wx-base NEW=. OUT=docs/results/s16/seal ROUNDS="1 2 3" bash docs/results/s16/ab.sh
# Each checkout needs its C extensions built in place (python setup.py build_ext --inplace);
# both run with this checkout's .venv. Extra bench arguments: ARGS (default: the issue's).
set -euo pipefail
VENV=$(cd "$(dirname "$0")/../../.." && pwd)/.venv
ARGS=${ARGS:-"--paths 4 --size 1GiB --mtu 1500 --baseline aead --baseline digest"}
mkdir -p "$OUT"
for round in ${ROUNDS:-1 2 3}; do
    for side in base new; do
        tree=$BASE; [ "$side" = new ] && tree=$NEW
        (cd "$tree" && "$VENV/bin/python" -m wanxport bench $ARGS --json) > "$OUT/$side-$round.json"
        "$VENV/bin/python" - "$OUT/$side-$round.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(sys.argv[1], "intact" if d["intact"] else "NOT INTACT", f'{d["goodput_bps"] / 1e9:.2f} Gb/s',
      "cpu_s_per_gb", d["cpu_s_per_gb"], "vs limit", d.get("cpu_vs_limit"))
PY
    done
done
