"""Start a benchmark's child process so that it imports the same wanxport as its parent.

``python -m wanxport.bench.transfer`` puts the working directory first on the
child's ``sys.path``. Run from a checkout after a regular (non-editable)
``pip install .``, the child then imported the source tree, which has no built
C extensions, instead of the installed package, and failed with "native data
path unavailable". ``-P`` keeps the working directory off ``sys.path``, and
the directory this process imported wanxport from goes first, so the child
finds exactly the parent's package, wherever either was started.
"""

from __future__ import annotations

import sys
from pathlib import Path

import wanxport

# argv is ["-c", root, module, *args]; the module then sees [its file, *args].
_BOOTSTRAP = (
    "import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); "
    "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)"
)


def package_root() -> str:
    """The ``sys.path`` entry this process imported wanxport from."""
    return str(Path(wanxport.__file__).resolve().parent.parent)


def module_command(module: str, *args: str) -> list[str]:
    """argv running ``module`` as ``__main__`` with ``args``, importing this process's wanxport."""
    return [sys.executable, "-P", "-c", _BOOTSTRAP, package_root(), module, *args]
