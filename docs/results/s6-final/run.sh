#!/bin/sh
# The end-of-session quiet window: every must-show command once more on main's head.
cd /work/main
L=/tmp/wanxport-tests.lock
log() { echo "$(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg) $*" >> /tmp/qw/log; }
for i in 1 2 3; do log bench $i; flock $L .venv/bin/wanxport bench --paths 4 --size 1GiB --mtu 1500 --baseline all --json > /tmp/qw/bench-$i.json; done
for i in 1 2; do log h8 $i; flock $L .venv/bin/python -m emulation run hetero-8path --transport wanxport --size 64MiB --steps 20 --fec auto --json > /tmp/qw/emu-h8-$i.json; done
log ll; flock $L .venv/bin/python -m emulation run lossy-long-2path --transport wanxport --size 64MiB --steps 20 --fec auto --json > /tmp/qw/emu-ll.json
log ar-r1-wx; flock $L .venv/bin/python -m emulation allreduce allreduce-4route --comm wanxport --size 64MiB --steps 5 --json > /tmp/qw/ar-r1-wx.json
log ar-r1-gloo; flock $L .venv/bin/python -m emulation allreduce allreduce-4route --comm gloo --size 64MiB --steps 3 --json > /tmp/qw/ar-r1-gloo.json
log ar-r2-wx; flock $L .venv/bin/python -m emulation allreduce allreduce-4route --comm wanxport --ranks-per-site 2 --size 64MiB --steps 5 --json > /tmp/qw/ar-r2-wx.json
log ar-r2-gloo; flock $L .venv/bin/python -m emulation allreduce allreduce-4route --comm gloo --ranks-per-site 2 --size 64MiB --steps 3 --json > /tmp/qw/ar-r2-gloo.json
log done
