#!/bin/bash
# A/B: default pymalloc vs PYTHONMALLOC=malloc, interleaved, loopback bench 4 paths 1 GiB
cd /work/main
for i in 1 2 3; do
  for m in pymalloc malloc; do
    if [ $m = malloc ]; then export PYTHONMALLOC=malloc; else unset PYTHONMALLOC; fi
    flock /tmp/wanxport-tests.lock .venv/bin/wanxport bench --paths 4 --size 1GiB --mtu 1500 --baseline none --json > /tmp/s7/ab-$m-$i.json 2>/tmp/s7/ab-$m-$i.err
  done
done
unset PYTHONMALLOC
