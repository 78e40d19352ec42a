"""wanxport.torch.serve_metrics: each rank on base_port + LOCAL_RANK, for any wanxport group."""

from __future__ import annotations

import asyncio
import socket
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from collective_helpers import close_all, join_all, make_pki

pytest.importorskip("torch", reason="wanxport.torch needs the torch extra (pip install 'wanxport[torch]')")

from wanxport.torch.metrics import collective_group, serve_metrics  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def free_tcp_pair() -> int:
    """A base port whose next port is free too (bound and released)."""
    while True:
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            base = int(a.getsockname()[1]) - 1
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", base))
                except OSError:
                    continue
            return base


async def test_each_rank_serves_on_base_port_plus_local_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            ) -> None:
    groups = await join_all(make_pki(tmp_path, 2), 2)
    monkeypatch.setenv("LOCAL_RANK", "1")
    base = free_tcp_pair()
    job = serve_metrics(base, groups[0], host="127.0.0.1")
    try:
        assert job.port == base + 1
        await asyncio.gather(*(g.all_reduce(np.ones(10, np.float32)) for g in groups))
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(job.url, timeout=10).read().decode())
        assert 'wanxport_collective_info{group="world",rank="0",site="site-0",sites="2"} 1.0' in text
        assert "wanxport_collective_calls_total{" in text and "wanxport_path_state{" in text
    finally:
        job.close()
        await close_all(groups)


def test_what_is_not_a_wanxport_group_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="is not a wanxport group"):
        collective_group(object())
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(ValueError, match="not 0..65535"):
        serve_metrics(65535, host="127.0.0.1")
    monkeypatch.setenv("LOCAL_RANK", "x")
    with pytest.raises(ValueError, match="LOCAL_RANK='x'"):
        serve_metrics(9400, host="127.0.0.1")
