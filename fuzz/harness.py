"""Shared entry point of the fuzz targets (``python fuzz/fuzz_X.py [libFuzzer flags] [CORPUS...]``).

Each target module defines ``load()``, which imports the code under test and
returns ``check(data: bytes) -> None``: it must return normally for every input,
or raise only the parser's own error type (which ``check`` catches). Anything
else escaping it is a finding. Keeping the imports inside ``load`` lets
``run`` instrument exactly wanxport's modules for coverage, while pytest
(``tests/test_fuzz_corpus.py``) calls the same ``check`` on the committed corpus,
uninstrumented, on every run.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

Check = Callable[[bytes], None]

CORPUS = Path(__file__).resolve().parent / "corpus"
REPO = Path(__file__).resolve().parent.parent


def run(load: Callable[[], Check], argv: list[str] | None = None) -> None:
    """Instrument wanxport, then hand control to libFuzzer (never returns)."""
    import atheris

    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    with atheris.instrument_imports(include=["wanxport"]):
        check = load()
    atheris.Setup(sys.argv if argv is None else argv, check)
    atheris.Fuzz()
