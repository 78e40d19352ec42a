"""Native extensions; everything else lives in pyproject.toml.

Each extension's C sources are every ``*.c`` file in its ``ext/`` folder, so a
new source file needs no edit here.
"""

import os
from glob import glob

from setuptools import Extension, setup

COMMON_FLAGS = ["-O2", "-std=gnu11", "-Wall", "-Wno-unused-function"]

EXTENSIONS = [
    Extension(
        "wanxport._native",
        sources=sorted(glob("ext/datapath/*.c")),
        include_dirs=["ext/datapath"],
        libraries=["crypto", "pthread"],
        extra_compile_args=COMMON_FLAGS,
    ),
    Extension(
        "wanxport.sim._eventloop",
        sources=sorted(glob("ext/simloop/*.c")),
        extra_compile_args=COMMON_FLAGS,
    ),
    Extension(
        "emulation._engine",
        sources=sorted(glob("ext/impair/*.c")),
        include_dirs=["ext/impair"],
        libraries=["pthread", "m"],
        extra_compile_args=COMMON_FLAGS,
    ),
]

# The sans-IO core and the simulator are pure, strictly typed Python. For long
# simulations (hundreds of paths, terabytes) they can be compiled with mypyc,
# about 3x faster: WANXPORT_MYPYC=1 pip install .  (a regular, not an editable,
# install: a compiled module would shadow later edits of its source file).
COMPILED_MODULES = [
    "wanxport/core/cc/base.py", "wanxport/core/cc/bbr.py", "wanxport/core/cc/cubic.py",
    "wanxport/core/cc/fixed.py", "wanxport/core/config.py", "wanxport/core/deadlines.py",
    "wanxport/core/delivery_rate.py",
    "wanxport/core/events.py", "wanxport/core/flow.py", "wanxport/core/incoming.py",
    "wanxport/core/outgoing.py", "wanxport/core/paths.py", "wanxport/core/ranges.py",
    "wanxport/core/recovery.py", "wanxport/core/rtt.py", "wanxport/core/scheduler.py",
    "wanxport/core/scheduling/hedge.py", "wanxport/core/scheduling/order.py",
    "wanxport/core/scheduling/stripes.py", "wanxport/core/scheduling/tail.py",
    "wanxport/core/sent_packets.py", "wanxport/core/session.py", "wanxport/core/shards.py",
    "wanxport/core/windowed_filter.py",
    "wanxport/sim/eventloop.py", "wanxport/sim/network.py", "wanxport/sim/runner.py",
    "wanxport/wire/frames.py", "wanxport/wire/header.py", "wanxport/wire/replay.py",
]


def _compiled() -> list[Extension]:
    if os.environ.get("WANXPORT_MYPYC") != "1":
        return []
    from mypyc.build import mypycify

    return list(mypycify(COMPILED_MODULES, opt_level="3"))


# Developers iterating on one extension can build only it:
#   WANXPORT_ONLY_EXT=wanxport._native python setup.py build_ext --inplace
_only = os.environ.get("WANXPORT_ONLY_EXT")
setup(ext_modules=[e for e in EXTENSIONS if not _only or e.name == _only] + _compiled())
