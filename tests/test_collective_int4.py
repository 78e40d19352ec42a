"""The int4 codec: its stated bound, its size and layout, and through the group's all-reduce on
loopback (every site bitwise identical, error feedback carrying what a step loses)."""

from __future__ import annotations

import asyncio
from functools import reduce
from pathlib import Path

import numpy as np
import pytest
from collective_helpers import close_all, join_all, make_pki

from wanxport.collective import codec, codec_int4, error_bound, part_bounds

pytestmark = pytest.mark.timeout(90)


def values(count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(count) * 10 ** rng.uniform(-4, 4, count)).astype(np.float32)


@pytest.mark.parametrize("count", [1, 2, 127, 128, 129, 255, 1000, 4097])
def test_round_trip_within_the_stated_bound(count: int) -> None:
    x = values(count, count)
    data = codec.encode("int4", x)
    assert data.nbytes == codec.encoded_bytes("int4", count) == (count + 1) // 2 + 4 * -(-count // 128)
    back = codec.decode("int4", data, count)
    assert np.all(np.abs(x - back) <= error_bound("int4", x))
    assert codec.decode("int4", codec.encode("int4", x), count).tobytes() == back.tobytes()  # deterministic


def test_levels_scales_and_zeros() -> None:
    x = np.zeros(300, np.float32)
    x[:128] = np.linspace(-7, 7, 128, dtype=np.float32)  # block 0: scale exactly 1
    x[200] = -3.5  # block 1: its only value is its peak, decoded exactly
    data = codec.encode("int4", x)
    scales = data[150:150 + 12].view(np.float32)
    assert scales.tolist() == [1.0, 0.5, 0.0]
    back = codec.decode("int4", data, 300)
    assert back[:128].tolist() == np.rint(x[:128]).tolist()
    assert back[200] == -3.5 and not np.any(back[128:200]) and not np.any(back[201:])
    assert int(data[0]) & 0x0F == 1 and int(data[0]) >> 4 == 1  # -7 and -7+0.11 round to -7: nibble 1


def test_bound_is_about_a_fourteenth_of_the_block_peak_and_is_reached() -> None:
    x = values(128 * 64, 11)
    bound = error_bound("int4", x)
    peaks = np.abs(x).reshape(-1, 128).max(axis=1)
    np.testing.assert_allclose(bound.reshape(-1, 128)[:, 0], peaks / 14, rtol=1e-3)
    err = np.abs(x - codec.decode("int4", codec.encode("int4", x), x.size))
    assert np.max(err / bound) > 0.9  # the bound is tight, not a loose guess


def test_nonfinite_and_wrong_dtype_are_refused_or_contained() -> None:
    with pytest.raises(ValueError, match="float32"):
        codec.check_codec("int4", np.dtype(np.float64))
    x = np.ones(256, np.float32)
    x[3] = np.inf
    back = codec.decode("int4", codec.encode("int4", x), 256)
    assert np.all(back[128:] == 1.0)  # a non-finite value spoils its own block only
    assert codec_int4.INT4_BLOCK == 128


@pytest.mark.parametrize("n", [2, 3])
async def test_all_reduce_int4_is_bitwise_identical_at_every_site(tmp_path: Path, n: int) -> None:
    groups = await join_all(make_pki(tmp_path, n), n)
    try:
        xs = [values(20_011, 40 + k) for k in range(n)]
        steps = 3
        owed = [np.zeros(20_011, np.float32) for _ in range(n)]  # each site's residual before a step
        for step in range(steps):
            arrays = [x.copy() for x in xs]
            await asyncio.gather(*(g.all_reduce(a, op="mean", compress="int4", name="pseudo")
                                   for g, a in zip(groups, arrays, strict=True)))
            assert len({a.tobytes() for a in arrays}) == 1
            if step == 0 and n == 2:
                bound = sum(error_bound("int4", x) for x in xs) / 2
                assert np.all(np.abs(arrays[0] - reduce(np.add, xs) / 2) <= bound * 1.0001)
            for k, g in enumerate(groups):
                residual = g.feedback.residual("pseudo")
                assert residual is not None
                # error feedback: what is owed after a step is that step's rounding of the input
                # plus what was owed, so it stays within one quantisation bound, not one per step
                # (with n > 2 each site's part is encoded on its own: blocks start at part bounds)
                target = xs[k] + owed[k]
                parts = part_bounds(20_011, n) if n > 2 else [(0, 20_011)]
                bound = np.concatenate([error_bound("int4", target[a:b]) for a, b in parts])
                assert np.all(np.abs(residual) <= bound * 1.0001)
                owed[k] = residual.copy()
        call = groups[0].stats()[-1]
        assert call.compress == "int4" and call.ok
    finally:
        await close_all(groups)
