"""The hook over an elastic group refuses a bucket that DDP laid out again after its first
step: a restarted site's first step would otherwise sum the gradients of different
parameters with the live sites' (same sizes, no error), a silently wrong step."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch", reason="wanxport.torch needs the torch extra")

from wanxport.torch.hook import check_layout  # noqa: E402


class _Group:
    def __init__(self) -> None:
        self.refused: list[tuple[str, str]] = []

    def refuse(self, op: str, reason: str) -> ValueError:
        self.refused.append((op, reason))
        return ValueError(reason)


def test_a_bucket_laid_out_again_is_refused_in_the_group_and_named() -> None:
    group = _Group()
    pool = ThreadPoolExecutor(1)
    state = SimpleNamespace(_layouts={}, _site_ranks=1, _finish=pool, _start=pool, group=group,
                            chunk_bytes=1 << 20)
    buffer = torch.zeros(132)
    first = ((4,), (4, 32))
    check_layout(state, 0, first, buffer)  # the first step's layout is recorded ...
    check_layout(state, 0, first, buffer)  # ... and the same layout passes
    check_layout(state, 1, ((32,),), torch.zeros(32))  # a bucket index first seen later is recorded too
    with pytest.raises(ValueError, match=r"bucket 0's parameters changed from \[\(4,\), \(4, 32\)\] to "
                                         r"\[\(4, 32\), \(4,\)\].*find_unused_parameters=True"):
        check_layout(state, 0, ((4, 32), (4,)), buffer)
    pool.shutdown(wait=True)
    # The cross-site call it would have made is refused in its place, so the other sites' fails too.
    assert [op for op, _ in group.refused] == ["all_reduce"]
