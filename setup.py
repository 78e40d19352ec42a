"""Native extensions and the packages; everything else lives in pyproject.toml.

Each extension's C sources are every ``*.c`` file in its ``ext/`` folder, so a
new source file needs no edit here.

The repository holds two sides. The transport (``wanxport``) is what a gateway
host runs. The lab (``emulation``: namespaces, the link-impairment engine,
baselines, plots; ``wanxport_lab``: the benchmarks' measuring instruments) needs
the ``emulation`` extra's dependencies and root. A default build carries both, so
``pip install -e ".[dev,emulation]"`` (``./dev setup``) and ``pip install
"wanxport[emulation]"`` give everything; ``WANXPORT_LAB=0`` builds the transport
alone (a gateway host's package: no lab modules, no lab extensions), which
``tests/test_product_boundary.py`` checks imports without the lab's dependencies.
"""

import os
import sys
import warnings
from glob import glob

from setuptools import Extension, find_packages, setup

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
        "wanxport_lab._limits",
        sources=sorted(glob("ext/limits/*.c")),
        libraries=["crypto"],
        extra_compile_args=COMMON_FLAGS,
    ),
    Extension(
        "wanxport.sim._eventloop",
        sources=sorted(glob("ext/simloop/*.c")),
        extra_compile_args=COMMON_FLAGS,
    ),
    Extension(
        "wanxport._fec",
        sources=sorted(glob("ext/fec/*.c")),
        libraries=["isal"],
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

LAB_PACKAGES = ("emulation", "wanxport_lab")


def _is_lab(name: str) -> bool:
    return name.split(".")[0] in LAB_PACKAGES


WITH_LAB = os.environ.get("WANXPORT_LAB", "1") != "0"
PACKAGES = [name for name in find_packages(include=["wanxport*", "emulation*"])
            if WITH_LAB or not _is_lab(name)]

# The pure layers (the sans-IO core, the wire format, the simulator, the scenario
# contract) are strictly typed Python. A regular `pip install .` compiles them with
# mypyc, about 3x faster for long simulations (hundreds of paths, terabytes); where
# that is not possible the build says so in one line and installs pure Python.
# Editable installs (`./dev setup`, `pip install -e`) and in-place builds stay pure,
# since a compiled module would shadow later edits of its source file.
# WANXPORT_MYPYC=0 asks for a pure build; =1 makes a failed compilation an error.
COMPILED_PACKAGES = ("wanxport/core", "wanxport/wire", "wanxport/sim", "wanxport/scenario")
NOT_COMPILED = {
    # A thin wrapper of the C data path (wanxport._native): its work is already C.
    "wanxport/wire/native.py",
    # mypyc 2.4 compiles ShardFilled (a dataclass with a memoryview field) into a
    # module that fails to import (KeyError: 'memoryview'); events are tiny records.
    "wanxport/core/events.py",
}
_BUILD_COMMANDS = {"bdist_wheel", "build", "build_ext", "install"}


def compiled_modules() -> list[str]:
    """Every module of the pure layers, found by glob so new modules need no edit here."""
    found = (path for package in COMPILED_PACKAGES for path in glob(f"{package}/**/*.py", recursive=True))
    return sorted(path for path in found if path not in NOT_COMPILED)


def _pure_reason() -> str | None:
    """Why this build stays pure Python ("" when it needs no saying), or None to compile."""
    argv = set(sys.argv[1:])
    if not argv & _BUILD_COMMANDS or "editable_wheel" in argv or "develop" in argv:
        return ""  # metadata only, or an editable install: pure by design
    if argv & {"--inplace", "-i"} or os.environ.get("WANXPORT_ONLY_EXT"):
        return ""  # an in-place developer build
    if os.environ.get("WANXPORT_MYPYC") == "0":
        return "WANXPORT_MYPYC=0"
    return None


def _compiled() -> list[Extension]:
    reason = _pure_reason()
    if reason is None:
        try:
            from mypyc.build import mypycify

            # Runtime dependencies (numpy, cryptography) need not be in the build
            # environment: their values are typed Any, which compiles to generic calls.
            return list(mypycify(["--ignore-missing-imports", *compiled_modules()], opt_level="3"))
        except ImportError:
            reason = "mypyc is not installed (pip install mypy)"
        except (Exception, SystemExit) as exc:  # mypy reports type errors by exiting
            text = str(exc).strip()
            reason = f"mypyc failed: {text.splitlines()[-1] if text else type(exc).__name__}"
        if os.environ.get("WANXPORT_MYPYC") == "1":
            raise SystemExit(f"wanxport: WANXPORT_MYPYC=1 but {reason}")
    if reason:
        # A warning, not a print: pip shows a build backend's warnings even with -q.
        warnings.warn(f"wanxport: installing the pure-Python core and simulator ({reason})", stacklevel=1)
    return []


# Developers iterating on one extension can build only it:
#   WANXPORT_ONLY_EXT=wanxport._native python setup.py build_ext --inplace
_only = os.environ.get("WANXPORT_ONLY_EXT")
_extensions = [e for e in EXTENSIONS if (not _only or e.name == _only) and (WITH_LAB or not _is_lab(e.name))]
setup(packages=PACKAGES, ext_modules=_extensions + _compiled())
