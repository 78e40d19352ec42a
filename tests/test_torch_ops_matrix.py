"""Every op of the wanxport backend against gloo in the same world: ops x dtypes x layouts.

One world of three processes (three sites) runs the whole matrix (``torch_matrix``):
each case's wanxport result must equal gloo's (bitwise for data movement, integer
reductions and MIN/MAX; within one ulp per rank for floating sums and products),
with every case of a dtype in flight at once. Where gloo refuses a case, wanxport
must refuse it too (with an error naming the op), and a case gloo runs, wanxport runs.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch", reason="wanxport.torch needs the torch extra (pip install 'wanxport[torch]')")

from gateway_helpers import free_path_ports  # noqa: E402
from torch_helpers import run_ranks  # noqa: E402
from torch_matrix import DTYPES, N, matrix_worker  # noqa: E402

from wanxport.control.certs import make_test_pki  # noqa: E402

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]
TIMEOUT_S = 20.0


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, str]]:
    work = tmp_path_factory.mktemp("matrix")
    make_test_pki(work / "pki", [f"site-{k}" for k in range(N)])
    ports = free_path_ports(3 * 40)
    codes = run_ranks(matrix_worker, N, (work, ports[::40], TIMEOUT_S), deadline_s=200)
    assert codes == [0] * N, f"rank processes ended with {codes}"
    return [json.loads((work / f"matrix-{r}.json").read_text()) for r in range(N)]


def test_every_case_gloo_runs_equals_gloo_at_every_rank(matrix: list[dict[str, str]]) -> None:
    bad = {f"rank {r}: {key}": verdict for r, table in enumerate(matrix) for key, verdict in table.items()
           if verdict != "ok" and not verdict.startswith("gloo refused") and key != "monitored_barrier"}
    assert not bad, json.dumps({k: v[:300] for k, v in bad.items()}, indent=1)[:8000]
    ran = sum(v == "ok" for v in matrix[0].values())
    assert ran >= 23 * len(DTYPES) * 2, f"only {ran} cases ran"


def test_reduce_ops_gloo_refuses_wanxport_refuses_naming_the_op(matrix: list[dict[str, str]]) -> None:
    """gloo refuses bitwise ops on floats; wanxport too. (gloo also refuses some non-contiguous
    tensors, which wanxport takes: those cases are not compared.)"""
    refused = {k: v for k, v in matrix[0].items() if v.startswith("gloo refused") and "ReduceOp" in v}
    for key, verdict in refused.items():
        assert "wanxport: ran" not in verdict, f"{key}: gloo refused, wanxport ran: {verdict}"
    bitwise_on_floats = [v for k, v in refused.items() if "all_reduce_band/float32" in k]
    assert bitwise_on_floats and "ReduceOp.BAND" in bitwise_on_floats[0], bitwise_on_floats


def test_work_result_and_a_monitored_barrier_naming_the_missing_rank(matrix: list[dict[str, str]]) -> None:
    assert all(table["result"] == "ok" for table in matrix)
    for table in matrix[:2]:
        verdict = table["monitored_barrier"]
        # The rank that did not arrive, by site and rank (and the path it was last heard on).
        assert verdict.startswith("CollectiveError") and "site site-2 (rank 2," in verdict, verdict
    assert matrix[2]["monitored_barrier"] == "skipped"
