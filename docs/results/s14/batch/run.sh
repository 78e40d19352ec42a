#!/bin/bash
# Loopback bench, 4 paths, 1 GiB, MTU 1500: core packets of 128 vs 256 datagrams, and
# acknowledgements every 256 datagrams with 128-datagram packets; rounds alternated.
# Usage: OUT=docs/results/s14/batch ROUNDS="1 2 3" bash docs/results/s14/batch/run.sh
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-docs/results/s14/batch}
mkdir -p "$OUT"
declare -A ARGS=([s128]="--segments 128" [s256]="--segments 256" [a256]="--segments 128 --ack-every 256")
for round in ${ROUNDS:-1 2 3}; do
  for variant in s128 s256 a256; do
    flock /tmp/wanxport-tests.lock .venv/bin/wanxport bench --paths 4 --size 1GiB --mtu 1500 \
      ${ARGS[$variant]} --json > "$OUT/$variant-$round.json"
  done
done
