"""The "wanxport" torch.distributed backend: two sites (processes) over loopback, a FileStore.

The world-of-sites shape (``init_process_group("wanxport")``): all_reduce sum/mean/max,
broadcast, all_gather and reduce_scatter in both forms, barrier, async ops and int8
compression against the values gloo would give, bitwise equal at both sites (the full
op x dtype matrix against gloo is ``test_torch_ops_matrix.py``);
a site that stops calling makes the other's next call raise within the timeout.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch", reason="wanxport.torch needs the torch extra (pip install 'wanxport[torch]')")

from gateway_helpers import free_path_ports  # noqa: E402
from torch_helpers import pg_worker, read, run_ranks  # noqa: E402

from wanxport.control.certs import make_test_pki  # noqa: E402

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]
TIMEOUT_S = 8.0


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, object]]:
    work = tmp_path_factory.mktemp("pg")
    make_test_pki(work / "pki", ["site-0", "site-1"])
    ports = free_path_ports(2)
    codes = run_ranks(pg_worker, 2, (work, ports, TIMEOUT_S), deadline_s=150)
    assert codes == [0, 0], f"site processes ended with {codes}"
    return [read(work / f"site-{s}.json") for s in range(2)]


def test_world_is_one_rank_per_site(sites: list[dict[str, object]]) -> None:
    assert [(s["backend"], s["rank"], s["world"]) for s in sites] == [("wanxport", 0, 2), ("wanxport", 1, 2)]


def test_all_reduce_sum_and_mean_bitwise_equal_at_both_sites(sites: list[dict[str, object]]) -> None:
    a, b = (np.array(s["input"], dtype=np.float32) for s in sites)
    for s in sites:
        np.testing.assert_array_equal(np.array(s["sum"], dtype=np.float32), a + b)
        np.testing.assert_array_equal(np.array(s["mean"], dtype=np.float32), (a + b) / np.float32(2))
    assert sites[0]["sum"] == sites[1]["sum"] and sites[0]["mean"] == sites[1]["mean"]


def test_broadcast_gather_scatter_barrier_and_async(sites: list[dict[str, object]]) -> None:
    for s in sites:
        assert s["broadcast"] == [[1.0] * 4] * 3
        assert s["all_gather"] == [[0, 1, 2, 3, 4], [10, 11, 12, 13, 14]]
        assert s["all_gather_single"] == [[0.5] * 3, [1.5] * 3]
        assert s["reduce_scatter_single_input_kept"] is True
        assert s["async"] == [3.0, 5.0]
    assert sites[0]["reduce_scatter"] == [3.0] * 4 and sites[1]["reduce_scatter"] == [21.0] * 4
    flat = np.arange(8.0) * 1 + np.arange(8.0) * 2
    assert sites[0]["reduce_scatter_single"] == flat[:4].tolist()
    assert sites[1]["reduce_scatter_single"] == flat[4:].tolist()


def test_int8_compression_cuts_bytes_within_its_bound(sites: list[dict[str, object]]) -> None:
    for s in sites:
        assert s["int8_max_error"] <= s["int8_scale_bound"]  # type: ignore[operator]
        assert s["bytes_none"] >= 3.5 * s["bytes_int8"]  # type: ignore[operator]


def test_max_reduces_and_a_refused_op_is_named(sites: list[dict[str, object]]) -> None:
    assert sites[0]["max"] == sites[1]["max"] == [1.0, 5.0]
    assert "ReduceOp.BAND" in str(sites[0]["band_error"]) and "float32" in str(sites[0]["band_error"])


def test_a_non_contiguous_view_is_reduced_through_the_view(sites: list[dict[str, object]]) -> None:
    assert sites[0]["transposed_sum"] is True and sites[1]["transposed_sum"] is True


def test_a_call_refused_at_one_site_fails_at_both_and_the_next_pairs(sites: list[dict[str, object]]) -> None:
    here, there = str(sites[0]["refused"]), str(sites[1]["refused"])
    assert here.startswith("ValueError") and "ReduceOp.BAND" in here, here
    assert there.startswith("CollectiveError") and "site-0" in there and "ReduceOp.BAND" in there, there
    assert sites[0]["after_refused"] == sites[1]["after_refused"] == [101.0] * 4


def test_a_stalled_site_makes_the_call_raise_within_the_timeout(sites: list[dict[str, object]]) -> None:
    stalled = str(sites[0]["stalled"])
    assert stalled.startswith("CollectiveError") and "site-1" in stalled, stalled
    assert sites[0]["stalled_s"] < TIMEOUT_S + 5  # type: ignore[operator]
