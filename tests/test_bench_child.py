"""Benchmark children import their parent's wanxport, whatever their working directory holds."""

import json
import subprocess
import sys
from pathlib import Path

from wanxport.bench.child import module_command


def shadowing_checkout(where: Path) -> Path:
    """A directory whose ``wanxport`` package is not the one this process imported."""
    (where / "wanxport").mkdir()
    (where / "wanxport" / "__init__.py").write_text("raise SystemExit('imported the working directory')\n")
    return where


def test_the_working_directory_cannot_shadow_the_parents_package(tmp_path: Path) -> None:
    cwd = shadowing_checkout(tmp_path)
    plain = subprocess.run([sys.executable, "-m", "wanxport", "--version"], cwd=cwd,
                           capture_output=True, text=True)
    assert "imported the working directory" in plain.stderr, "the hazard this guards against"
    child = subprocess.run(module_command("wanxport", "--version"), cwd=cwd, capture_output=True, text=True)
    assert child.returncode == 0, child.stderr
    assert child.stdout.startswith("wanxport ")


def test_arguments_reach_the_module_as_its_argv(tmp_path: Path) -> None:
    document = tmp_path / "doc.json"
    document.write_text(json.dumps({"a": [1, 2]}, indent=4))
    child = subprocess.run(module_command("json.tool", "--compact", str(document)),
                           capture_output=True, text=True, check=True)
    assert child.stdout.strip() == '{"a":[1,2]}'
