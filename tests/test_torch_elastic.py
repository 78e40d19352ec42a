"""The DDP hook over elastic groups, 3 sites x 2 ranks: one site's ranks are killed in the
middle of a backward pass; the other sites' step completes (its buckets retried among the
survivors, the mean over the live sites) and their parameters stay equal at every step."""

from __future__ import annotations

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
