"""examples/diloco.py, short: int8 pseudo-gradients end within 2 % of uncompressed, at ~1/4 the bytes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="wanxport.torch needs the torch extra (pip install 'wanxport[torch]')")

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def test_int8_diloco_ends_within_two_percent_with_a_quarter_of_the_bytes(tmp_path: Path) -> None:
    out = tmp_path / "diloco.json"
    command = [sys.executable, str(ROOT / "examples" / "diloco.py"), "--outer-steps", "4",
               "--inner-steps", "10", "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["final_loss"]["none"] < 0.9 * result["initial_loss"]  # it trained
    assert result["relative_difference"] <= 0.02
    plain, int8 = (result["cross_site_bytes_per_outer_step"][c] for c in ("none", "int8"))
    assert len(plain) == len(int8) == 4
    assert min(plain) >= 3.5 * max(int8)
    # both sites end with the same model: the outer step is bitwise identical everywhere
    assert len(set(result["final_loss_per_site"]["none"])) == 1
    assert len(set(result["final_loss_per_site"]["int8"])) == 1
