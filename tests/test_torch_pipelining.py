"""torch.distributed.pipelining over the wanxport backend: two stages at two sites (loopback).

A model split in two ``PipelineStage``s, one per site, run by ``ScheduleGPipe`` with
four microbatches; its activations and gradients cross between the sites through the
backend's ``send``/``recv``. Each stage's gradients and the last stage's microbatch
losses must equal the same model run in one process (torch.allclose, rtol 1e-5).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="wanxport.torch needs the torch extra (pip install 'wanxport[torch]')")

from gateway_helpers import free_path_ports  # noqa: E402
from torch_helpers import pipeline_worker, read, run_ranks  # noqa: E402

from wanxport.control.certs import make_test_pki  # noqa: E402

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def test_two_stages_at_two_sites_equal_one_process(tmp_path_factory: pytest.TempPathFactory) -> None:
    work = tmp_path_factory.mktemp("pipeline")
    make_test_pki(work / "pki", ["site-0", "site-1"])
    ports = free_path_ports(2 * 40)
    codes = run_ranks(pipeline_worker, 2, (work, ports[::40], 20.0), deadline_s=150)
    assert codes == [0, 0], f"site processes ended with {codes}"
    first, last = (read(work / f"site-{s}.json") for s in range(2))
    assert first["grads_close"] is True and last["grads_close"] is True
    assert last["losses"] == pytest.approx(last["one_process"], rel=1e-5)
