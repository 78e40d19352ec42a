"""No module over 500 lines in the pure layers (wanxport/core, wanxport/wire, wanxport/scenario).

docs/design.md section 2: compose the session from parts, a module each; no module
should need more than a few hundred lines. The check lists every offender with
its length, so a failure says what to split.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PURE_LAYERS = ("wanxport/core", "wanxport/wire", "wanxport/scenario")
MAX_LINES = 500


def module_lengths() -> dict[str, int]:
    lengths = {}
    for layer in PURE_LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            lengths[path.relative_to(ROOT).as_posix()] = len(path.read_text(encoding="utf-8").splitlines())
    return lengths


def offenders() -> list[str]:
    return [f"{name} ({n} lines)" for name, n in module_lengths().items() if n > MAX_LINES]


def test_the_check_sees_every_pure_layer() -> None:
    lengths = module_lengths()
    for layer in PURE_LAYERS:
        assert any(name.startswith(layer + "/") for name in lengths), f"no modules found under {layer}"


def test_no_module_over_500_lines() -> None:
    found = offenders()
    assert not found, f"modules over {MAX_LINES} lines (split them): {', '.join(found)}"
