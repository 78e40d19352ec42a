"""FSDP2 HSDP across two sites in one global world: examples/hsdp_two_sites.py, short.

Two sites x two ranks, a 2-D DeviceMesh whose "replicate" dimension is a wanxport
group (``backend_override``) and whose "shard" dimension is gloo; every rank's
parameter shards after every step must equal those of the same model trained with
plain gloo HSDP on the same data (torch.allclose, rtol 1e-5, atol 1e-6), and the
replicate all-reduces must have crossed the sites over wanxport (bytes counted).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="wanxport.torch needs the torch extra (pip install 'wanxport[torch]')")

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def test_hsdp_over_wanxport_matches_gloo_hsdp_at_every_step(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    command = [sys.executable, str(ROOT / "examples" / "hsdp_two_sites.py"), "--steps", "2",
               "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["backends"] == [["wanxport", "gloo"]]
    assert result["allclose_every_step"] is True and result["steps"] == 2
    assert result["cross_site_bytes"] > 0
    assert "parameters match gloo HSDP at every step" in done.stdout
