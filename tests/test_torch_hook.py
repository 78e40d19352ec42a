"""The hierarchical DDP hook: 2 sites x 2 ranks over loopback, against plain gloo DDP; failure.

The equality check is examples/train_two_sites.py itself (a short run): every rank's
parameters after every step equal those of one plain 4-rank gloo DDP world trained on
the same data (torch.allclose, rtol 1e-5, atol 1e-6). The failure check kills one
rank mid-run: every other rank's backward must raise within the hook's timeout
(a bounded multiple of it), none may hang.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="wanxport.torch needs the torch extra (pip install 'wanxport[torch]')")

from gateway_helpers import free_path_ports  # noqa: E402
from torch_helpers import chunked_worker, hook_failure_worker, read, refused_hook_worker, run_ranks  # noqa: E402

from wanxport.control.certs import make_test_pki  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


@pytest.mark.parametrize("ranks", [2, 1])
def test_two_sites_match_single_site_ddp_at_every_step(tmp_path: Path, ranks: int) -> None:
    out = tmp_path / "result.json"
    command = [sys.executable, str(ROOT / "examples" / "train_two_sites.py"), "--steps", "3",
               "--ranks-per-site", str(ranks), "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["ranks_per_site"] == ranks and result["steps"] == 3
    assert result["allclose_every_step"] is True
    assert result["max_abs_diff"] <= 1e-6
    assert "parameters match plain gloo DDP at every step" in done.stdout


def test_a_killed_rank_makes_every_other_rank_raise_within_the_timeout(tmp_path: Path) -> None:
    timeout = 6.0
    make_test_pki(tmp_path / "pki", ["site-0", "site-1"])
    first_port = free_path_ports(4)[0]
    codes = run_ranks(hook_failure_worker, 4, (tmp_path, first_port, timeout), deadline_s=200)
    assert codes[2] == -9, codes  # the killed rank
    assert codes[:2] + codes[3:] == [0, 0, 0], f"a surviving rank hung or crashed: {codes}"
    for rank in (0, 1, 3):
        got = read(tmp_path / f"rank-{rank}.json")
        assert got["first_step"] == "ok"
        assert got["second_step"] != "ok", f"rank {rank}: {got}"
        assert got["second_step_s"] < 3 * timeout + 10, f"rank {rank} took {got['second_step_s']:.1f} s"
        assert got["refused_after"], f"rank {rank}: the hook accepted a bucket after a failure"


def test_a_tensor_larger_than_a_chunk_is_reduced_in_chunks_in_place(tmp_path: Path) -> None:
    make_test_pki(tmp_path / "pki", ["site-0", "site-1"])
    first_port = free_path_ports(4)[0]
    codes = run_ranks(chunked_worker, 4, (tmp_path, first_port, 20.0), deadline_s=200)
    assert codes == [0, 0, 0, 0], codes
    got = [read(tmp_path / f"rank-{g}.json") for g in range(4)]
    for mean in (False, True):
        assert all(r[f"same_tensor_{mean}"] for r in got), "the future's value is not the caller's tensor"
        assert max(r[f"max_err_{mean}"] for r in got) < 1e-5, got
        assert len({r[f"digest_{mean}"] for r in got}) == 1, "ranks disagree bit for bit"


def test_a_tensor_refused_at_one_site_fails_at_the_other_and_the_next_pairs(tmp_path: Path) -> None:
    make_test_pki(tmp_path / "pki", ["site-0", "site-1"])
    first_port = free_path_ports(2)[0]
    codes = run_ranks(refused_hook_worker, 2, (tmp_path, first_port, 20.0), deadline_s=150)
    assert codes == [0, 0], codes
    here, there = (read(tmp_path / f"site-{s}.json") for s in range(2))
    assert here["refused"].startswith("ValueError") and "contiguous" in here["refused"], here
    assert there["refused"].startswith("CollectiveError") and "site-0" in there["refused"], there
    assert "contiguous" in there["refused"], there
    assert here["after"] == there["after"] == [101.0] * 4
