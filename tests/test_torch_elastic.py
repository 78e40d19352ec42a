"""The DDP hook over elastic groups, 3 sites x 2 ranks: one site's ranks are killed in the
middle of a backward pass; the other sites' step completes (its buckets retried among the
survivors, the mean over the live sites) and their parameters stay equal at every step."""

from __future__ import annotations

import json
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest

torch_distributed = pytest.importorskip("torch.distributed", reason="wanxport.torch needs the torch extra")

from gateway_helpers import free_path_ports  # noqa: E402
from torch_elastic_helpers import KILL_AT, RANKS, SITES, STEPS, ddp_elastic_worker  # noqa: E402
from torch_helpers import read, run_ranks  # noqa: E402

from wanxport.control.certs import make_test_pki  # noqa: E402

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def test_a_site_killed_mid_backward_the_others_step_on_with_equal_parameters(tmp_path: Path) -> None:
    make_test_pki(tmp_path / "pki", [f"site-{k}" for k in range(SITES)])
    store = torch_distributed.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=60))
    first_port = free_path_ports(SITES * 128)[0]
    codes = run_ranks(ddp_elastic_worker, SITES * RANKS, (tmp_path, store.port, first_port, 30.0),
                      deadline_s=240)
    assert codes[4:] == [-9, -9], codes  # site 2's ranks, killed mid-backward
    assert codes[:4] == [0, 0, 0, 0], f"a surviving rank hung or crashed: {codes}"
    ranks = [read(tmp_path / f"rank-{r}.json")["steps"] for r in range(4)]
    for step in range(STEPS):
        live = [r[str(step)]["live"] for r in ranks]
        assert live == [[0, 1, 2] if step < KILL_AT else [0, 1]] * 4, (step, live)
        assert len({r[str(step)]["params"] for r in ranks}) == 1, f"step {step}: the parameters differ"
    # Site 2 dies in its backward of step KILL_AT, which every site began at about the same
    # time: the survivors' step through that loss (shown, not asserted: a timing).
    def took(step: int) -> float:
        return max(r[str(step)]["ended"] - r[str(step)]["began"] for r in ranks)
    print(f"survivors' step {KILL_AT} through the loss of site 2: {took(KILL_AT):.2f} s "
          f"(the step before: {took(KILL_AT - 1):.2f} s)")


def test_a_diloco_site_killed_and_restarted_gets_model_optimizer_and_outer_state_bit_identical(
        tmp_path: Path) -> None:
    """Three one-rank sites on ``elastic_group`` with AdamW inside and DiLoCo's outer step:
    site 2 killed mid-collective, restarted: the restarted site's state after its first
    boundary (model, AdamW state, outer state, step) is site 0's there, byte for byte, and
    at the end every site holds the same model and outer state."""
    import os
    import signal
    import sys

    make_test_pki(tmp_path / "pki", [f"site-{k}" for k in range(SITES)])
    store = torch_distributed.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=60))
    first_port = free_path_ports(SITES * 64)[0]
    peer = str(Path(__file__).with_name("torch_elastic_peer.py"))

    def start(site: int, **extra: object) -> subprocess.Popen[str]:
        spec = {"site": site, "pki": str(tmp_path / "pki"), "store_port": store.port, "until": 4,
                "paths": [f"127.0.0.1:{first_port + site * 64 + path * 32}" for path in range(2)], **extra}
        return subprocess.Popen([sys.executable, peer, json.dumps(spec)], stdout=subprocess.PIPE,
                                stdin=subprocess.PIPE, text=True)

    def show(run: list[dict]) -> str:
        """Per line: the step and the digest it carries (for a failure's message)."""
        return " ".join(f"{line.get('step', line.get('boundary'))}:"
                        f"{line.get('shared', line.get('state', ''))[:8]}" for line in run)

    procs = [start(0), start(1), start(2, stall_at=2)]
    try:
        assert _lines_until(procs[2], "stalled")[-1] == {"stalled": 2}
        os.kill(procs[2].pid, signal.SIGKILL)
        procs[2].wait()
        procs.append(start(2))
        runs = [_lines_until(p, "final") for p in (procs[0], procs[1], procs[3])]
        finals = [run[-1] for run in runs]
        assert [line["live"] for line in runs[0] if line.get("step") == 2] == [[0, 1]]  # the mean over 2
        admitted = finals[2]["admitted_at"]
        assert admitted > 2 and len({f["final"] for f in finals}) == 1
        # Each live site's state at the admitting boundary (their AdamW moments differ): the
        # source is whichever links to site 2 can carry the most, so either may have sent it.
        sent = {[line["state"] for line in run if line.get("boundary") == admitted][-1] for run in runs[:2]}
        received = [line for line in runs[2] if "boundary" in line]
        assert received[0]["boundary"] == admitted  # it took part from its admission on
        assert received[0]["state"] in sent  # bit-identical to a live site's
        assert len({f["shared"] for f in finals}) == 1, "\n".join(map(show, runs))
        for proc in (procs[0], procs[1], procs[3]):
            assert proc.wait(timeout=60) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def test_a_site_of_two_ranks_killed_and_restarted_is_admitted_by_both_ranks_at_the_same_step(
        tmp_path: Path) -> None:
    """3 sites x 2 ranks under DDP: site 2's ranks killed before a backward pass and started
    again (from other parameters): both its ranks are admitted at the same step (the ranks'
    groups share one membership record), receive the state, and from there every rank of
    every site holds the same parameters after every step."""
    import os
    import signal
    import sys

    make_test_pki(tmp_path / "pki", [f"site-{k}" for k in range(SITES)])
    store = torch_distributed.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=60))
    first_port = free_path_ports(SITES * 128)[0]
    peer = str(Path(__file__).with_name("torch_elastic_ddp_peer.py"))

    def start(site: int, rank: int, incarnation: int, **extra: object) -> subprocess.Popen[str]:
        spec = {"site": site, "rank": rank, "pki": str(tmp_path / "pki"), "store_port": store.port,
                "first_port": first_port, "until": 5,
                "site_store": str(tmp_path / f"site-{site}.{incarnation}"), **extra}
        return subprocess.Popen([sys.executable, peer, json.dumps(spec)], stdout=subprocess.PIPE,
                                stdin=subprocess.PIPE, text=True)

    procs = {(s, r): start(s, r, 1, **({"stall_at": 2} if s == 2 else {})) for s in range(SITES)
             for r in range(RANKS)}
    restarted: list[subprocess.Popen[str]] = []
    try:
        for r in range(RANKS):
            assert _lines_until(procs[2, r], "stalled")[-1] == {"stalled": 2}
        for r in range(RANKS):
            os.kill(procs[2, r].pid, signal.SIGKILL)
            procs[2, r].wait()
        restarted = [start(2, r, 2, seed=7) for r in range(RANKS)]
        runs = {(s, r): _lines_until(procs[s, r], "final") for s in range(2) for r in range(RANKS)}
        runs |= {(2, r): _lines_until(restarted[r], "final") for r in range(RANKS)}
        admitted = {key: run[-1]["admitted_at"] for key, run in runs.items()}
        assert len(set(admitted.values())) == 1 and admitted[2, 0] > 2, admitted
        at = admitted[2, 0]
        for key in ((2, 0), (2, 1)):
            assert runs[key][0]["step"] == at  # its first step is the one it was admitted at
        by_step: dict[int, list[dict]] = {}
        for run in runs.values():
            for line in run[:-1]:
                by_step.setdefault(line["step"], []).append(line)
        assert [line["live"] for line in by_step[2]] == [[0, 1]] * 4  # the step site 2 was lost in
        for step, lines in by_step.items():
            assert len({line["params"] for line in lines}) == 1, f"step {step}: the parameters differ"
            if step >= at:
                assert len(lines) == SITES * RANKS and all(line["live"] == [0, 1, 2] for line in lines)
        for proc in [*(procs[s, r] for s in range(2) for r in range(RANKS)), *restarted]:
            assert proc.wait(timeout=60) == 0
    finally:
        for proc in [*procs.values(), *restarted]:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def _lines_until(proc: subprocess.Popen[str], key: str) -> list[dict]:
    """A peer's JSON lines up to the first that has ``key``."""
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(json.loads(line))
        if key in seen[-1]:
            return seen
    raise AssertionError(f"ended (code {proc.wait()}) before {key!r}: {seen}")
