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
        "emulation._engine",
        sources=sorted(glob("ext/impair/*.c")),
        include_dirs=["ext/impair"],
        libraries=["pthread", "m"],
        extra_compile_args=COMMON_FLAGS,
    ),
]

# Developers iterating on one extension can build only it:
#   WANXPORT_ONLY_EXT=wanxport._native python setup.py build_ext --inplace
_only = os.environ.get("WANXPORT_ONLY_EXT")
setup(ext_modules=[e for e in EXTENSIONS if not _only or e.name == _only])
