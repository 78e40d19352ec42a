"""CUDA tensors through every op of the wanxport backend (needs a GPU; skipped with the reason elsewhere).

The op x dtype x layout matrix of ``test_torch_ops_matrix.py`` with the wanxport
group's tensors on the GPU (three ranks sharing GPU 0; every op stages them through
pinned host memory) against gloo on CPU copies of the same tensors, in one world:
each case must equal gloo's result as on the CPU.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch",
                            reason="wanxport.torch needs the torch extra (pip install 'wanxport[torch]')")

from gateway_helpers import free_path_ports  # noqa: E402
from torch_helpers import run_ranks  # noqa: E402
from torch_matrix import N, matrix_worker  # noqa: E402

from wanxport.control.certs import make_test_pki  # noqa: E402

pytestmark = [pytest.mark.timeout(400), pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="no CUDA device here: these tests stage GPU tensors "
                                        "through host memory")]


def test_every_op_on_cuda_tensors_equals_gloo_on_the_cpu(tmp_path_factory: pytest.TempPathFactory) -> None:
    work = tmp_path_factory.mktemp("cuda-matrix")
    make_test_pki(work / "pki", [f"site-{k}" for k in range(N)])
    ports = free_path_ports(3 * 40)
    codes = run_ranks(matrix_worker, N, (work, ports[::40], 30.0, "cuda"), deadline_s=360)
    assert codes == [0] * N, f"rank processes ended with {codes}"
    tables = [json.loads((work / f"matrix-{r}.json").read_text()) for r in range(N)]
    bad = {f"rank {r}: {k}": v[:300] for r, t in enumerate(tables) for k, v in t.items()
           if v != "ok" and not v.startswith("gloo refused") and k not in ("monitored_barrier", "result")}
    assert not bad, json.dumps(bad, indent=1)[:8000]
    assert sum(v == "ok" for v in tables[0].values()) >= 400
