"""examples/pipeline_two_sites.py, small: two stages at two loopback sites give the one-process
loss and gradients at every step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the example needs the torch extra (pip install 'wanxport[torch]')")

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.timeout(200), pytest.mark.slow]


def test_two_stage_pipeline_matches_the_one_process_model(tmp_path: Path) -> None:
    out = tmp_path / "pipeline.json"
    command = [sys.executable, str(ROOT / "examples" / "pipeline_two_sites.py"), "--steps", "2",
               "--microbatches", "3", "--rows", "5", "--hidden", "16", "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["equal"] is True and len(result["steps"]) == 2
    for step in result["steps"]:
        assert step["loss_close"] and step["grads_close"], step
    # SGD moved the model between the steps, so step 2 compared different parameters
    assert result["steps"][0]["loss"] != result["steps"][1]["loss"]


def test_the_comparison_fails_when_a_gradient_differs() -> None:
    """The check can fail: one perturbed gradient element makes the verdict False."""
    sys.path.insert(0, str(ROOT / "examples"))
    from pipeline_two_sites import compare, reference

    ref = reference(steps=1, microbatches=2, rows=3, hidden=4)
    sites = [{"losses": [], "grads": [[g.clone() for g in ref["grads"][0][0]]]},
             {"losses": list(ref["losses"]), "grads": [[g.clone() for g in ref["grads"][0][1]]]}]
    assert compare(sites, ref)["equal"] is True
    sites[0]["grads"][0][0][0, 0] += 1e-3
    verdict = compare(sites, ref)
    assert verdict["equal"] is False
    assert verdict["steps"][0]["max_abs_grad_diff"] == pytest.approx(1e-3, rel=1e-3)
