"""Every fuzz target's committed corpus, replayed through the target's own check.

The fuzz targets (fuzz/) run for hours only on demand (docs/results/fuzzing.md);
this replays what they found interesting, uninstrumented and against the
normal native build, so a regression on any input that once mattered fails
the ordinary test run. A check raises only for a finding: the parsers' own
error types are caught inside it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from wanxport.wire import native

FUZZ = Path(__file__).resolve().parent.parent / "fuzz"
TARGETS = sorted(p.stem.removeprefix("fuzz_") for p in FUZZ.glob("fuzz_*.py"))


def _module(target: str) -> ModuleType:
    if str(FUZZ) not in sys.path:
        sys.path.insert(0, str(FUZZ))  # the targets import their shared ``harness``
    spec = importlib.util.spec_from_file_location(f"fuzz_{target}", FUZZ / f"fuzz_{target}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_target_has_a_corpus() -> None:
    assert set(TARGETS) == {"header", "frames", "control", "scenario", "gateway_config", "daemon_config",
                            "native_receiver"}
    for target in TARGETS:
        assert any((FUZZ / "corpus" / target).iterdir()), f"fuzz/corpus/{target} is empty"


@pytest.mark.parametrize("target", TARGETS)
def test_corpus_replays_cleanly(target: str) -> None:
    if target == "native_receiver" and not native.NATIVE_AVAILABLE:
        pytest.skip(str(native.import_error))
    check = _module(target).load()
    inputs = sorted((FUZZ / "corpus" / target).iterdir())
    for path in inputs:
        try:
            check(path.read_bytes())
        except Exception as exc:
            raise AssertionError(f"fuzz/corpus/{target}/{path.name}: {exc!r}") from exc
