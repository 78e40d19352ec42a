"""The wire constants are defined once, in Python; the C module must have been built with them.

``wanxport._native`` exports the values its code was compiled with. The
comparison reads the extension directly (not through wire/native.py, which
refuses a mismatching build and would turn this failure into a skip).
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest

from wanxport.wire import native


def test_c_module_was_built_with_the_python_constants() -> None:
    ext = pytest.importorskip("wanxport._native")
    assert {name: getattr(ext, name, None) for name in native.WIRE_CONSTANTS} == native.WIRE_CONSTANTS


def test_a_build_with_other_constants_is_named_in_the_mismatch() -> None:
    stale = SimpleNamespace(**{**native.WIRE_CONSTANTS, "REPLAY_WINDOW": 2048})
    del stale.MARKER
    assert native.constant_mismatches(stale) == [
        f"MARKER missing (Python: {native.WIRE_CONSTANTS['MARKER']})",
        f"REPLAY_WINDOW 2048 (Python: {native.WIRE_CONSTANTS['REPLAY_WINDOW']})",
    ]
    assert native.constant_mismatches(SimpleNamespace(**native.WIRE_CONSTANTS)) == []


def test_loader_refuses_a_stale_build_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    stale = SimpleNamespace(**{**native.WIRE_CONSTANTS, "HEADER_LEN": 17})
    monkeypatch.setattr(importlib, "import_module", lambda name: stale)
    ext, error = native._load()
    assert ext is None and error is not None and "\n" not in error
    assert "HEADER_LEN 17 (Python: 16)" in error and native.BUILD_HINT in error


def test_loader_without_the_extension_says_how_to_build_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> None:
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(importlib, "import_module", missing)
    ext, error = native._load()
    assert ext is None and error is not None and "\n" not in error
    assert "No module named 'wanxport._native'" in error and native.BUILD_HINT in error
