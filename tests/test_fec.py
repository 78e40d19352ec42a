"""The erasure-coded tail: the code, the REPAIR frame, the receiver's blocks, and whole runs.

The code must rebuild exactly what was lost for every loss pattern of up to m
symbols (data or repair); a block whose repair is not enough must wait for the
retransmitted data, and a run whose repair falls short still completes intact;
``fec = "off"`` sends no repair at all.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wanxport.core import fec as fec_sender
from wanxport.core import fec_code
from wanxport.core.config import PathConfig, SessionConfig
from wanxport.core.fec_receive import FecReceiver
from wanxport.core.shards import IncomingShard
from wanxport.scenario import parse_scenario
from wanxport.sim.runner import SimOptions, simulate
from wanxport.wire.errors import WireError
from wanxport.wire.frames import DATA_OVERHEAD, REPAIR_OVERHEAD, RepairFrame, decode_frames, encode_frames

LOSSY_LONG = """
name = "fec-lossy-long"
seed = 5
[transfer]
size = "3MiB"
shards = 2
[[paths]]
name = "long1"
rtt_ms = 150.0
bandwidth_mbps = 50.0
loss = {loss}
[[paths]]
name = "long2"
rtt_ms = 120.0
bandwidth_mbps = 50.0
loss = {loss}
"""


@st.composite
def blocks(draw: st.DrawFn) -> tuple[int, int, int, int, list[int], int]:
    k = draw(st.integers(1, 200))
    m = draw(st.integers(1, min(24, 255 - k)))
    symbol = draw(st.integers(1, 300))
    length = draw(st.integers((k - 1) * symbol + 1, k * symbol))
    lost = draw(st.lists(st.integers(0, k + m - 1), max_size=m, unique=True))
    return k, m, symbol, length, sorted(lost), draw(st.integers(0, 2**32))


@settings(max_examples=150, deadline=None)
@given(blocks())
def test_any_k_of_k_plus_m_symbols_rebuild_exactly_the_lost_data(case: tuple[int, int, int, int, list[int],
                                                                             int]) -> None:
    k, m, symbol, length, lost, seed = case
    data = random.Random(seed).randbytes(length)
    repair = fec_code.encode(data, k, m, symbol)
    missing = [i for i in lost if i < k]
    repairs = {j: repair[j] for j in range(m) if k + j not in lost}
    held = bytearray(data)
    for i in missing:  # what the receiver holds of a lost symbol is garbage
        held[i * symbol:(i + 1) * symbol] = b"\xa5" * len(held[i * symbol:(i + 1) * symbol])
    rebuilt = fec_code.decode(bytes(held), k, m, symbol, missing, repairs)
    assert len(rebuilt) == len(missing)
    padded = data + bytes(k * symbol - length)
    for i, got in zip(missing, rebuilt, strict=True):
        assert got == padded[i * symbol:(i + 1) * symbol]


def test_decode_with_too_few_repair_symbols_is_an_error_not_wrong_bytes() -> None:
    data = bytes(range(200)) * 5
    repair = fec_code.encode(data, 10, 2, 100)
    with pytest.raises(ValueError, match="missing"):
        fec_code.decode(data, 10, 2, 100, [1, 2, 3], {0: repair[0], 1: repair[1]})


def exact_failure(k: int, m: int, loss: float) -> float:
    """P(more than m of k + m i.i.d. symbols lost): the exact binomial tail."""
    n = k + m
    return 1.0 - sum(math.comb(n, i) * loss ** i * (1.0 - loss) ** (n - i) for i in range(m + 1))


def test_repair_count_follows_the_loss_and_the_target() -> None:
    assert fec_code.repair_count([(200, 0.0, 1)], 1e-3, 48) == 0
    light, heavy = (fec_code.repair_count([(200, p, 1)], 1e-3, 48) for p in (0.001, 0.02))
    assert 1 <= light < heavy <= 48
    for loss in (0.005, 0.01, 0.02):  # i.i.d.: the Poisson model lands on the exact binomial's m, or one more
        m = fec_code.repair_count([(200, loss, 1)], 1e-3, 48)
        exact = next(j for j in range(49) if exact_failure(200, j, loss) <= 1e-3)
        assert exact <= m <= exact + 1
    assert fec_code.repair_count([(3, 1e-5, 1)], 1e-3, 48) == 0  # a clean path's few symbols need none


def test_a_bursty_path_gets_more_repair_than_an_iid_one_at_the_same_loss() -> None:
    iid = fec_code.repair_count([(200, 0.02, 1)], 1e-3, 48)
    bursty = fec_code.repair_count([(200, 0.02, 4)], 1e-3, 48)
    assert bursty > iid
    # Mixing: the bursty path's share raises the block's repair over the i.i.d. path's alone.
    assert fec_code.repair_count([(100, 0.02, 1), (100, 0.02, 4)], 1e-3, 48) > fec_code.repair_count(
        [(200, 0.02, 1)], 1e-3, 48)


def _compound_cdf_by_panjer(parts: list[tuple[int, float, float]], limit: int) -> list[float]:
    """The reference: each path's compound Poisson by Panjer's recursion, convolved, summed."""
    pmf = [1.0] + [0.0] * limit
    for symbols, loss, burst in parts:
        events, q = symbols * loss / burst, 1.0 / burst
        jump = [0.0] + [q * (1.0 - q) ** (j - 1) for j in range(1, limit + 1)]
        own = [math.exp(-events)] + [0.0] * limit
        for n in range(1, limit + 1):
            own[n] = events / n * sum(j * jump[j] * own[n - j] for j in range(1, n + 1))
        pmf = [sum(pmf[i] * own[n - i] for i in range(n + 1)) for n in range(limit + 1)]
    return [min(1.0, sum(pmf[:n + 1])) for n in range(limit + 1)]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(1, 200), st.floats(1e-6, 0.5),
                          st.sampled_from([1.0, 1.5, 3.0, 8.0, 20.0])), min_size=1, max_size=4),
       st.integers(0, 60))
def test_lost_symbols_cdf_matches_panjers_recursion(parts: list[tuple[int, float, float]],
                                                    limit: int) -> None:
    got = fec_code.lost_symbols_cdf(parts, limit)
    want = _compound_cdf_by_panjer(parts, limit)
    assert len(got) == limit + 1
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-12


def test_repair_count_holds_its_target_against_simulated_burst_loss() -> None:
    """Seeded Gilbert-Elliott losses (bursts of ~4): blocks sized by the model fail as rarely as promised."""
    rng = random.Random(11)
    k, target = 150, 0.02
    # Stationary loss 0.01 / (0.01 + 0.25) = 3.8 %, mean burst 4 (r = 0.25, every bad-state datagram lost).
    p_bad, r = 0.01, 0.25
    loss, burst = p_bad / (p_bad + r), 1 / r
    m = fec_code.repair_count([(k, loss, burst)], target, 48)
    bad = False
    failures = 0
    trials = 3000
    for _ in range(trials):
        lost = 0
        for _ in range(k + m):
            bad = rng.random() >= r if bad else rng.random() < p_bad
            lost += bad
        failures += lost > m
    assert failures / trials <= 2 * target
    iid_m = fec_code.repair_count([(k, loss, 1)], target, 48)
    assert iid_m < m  # and the i.i.d. pricing would have been short


def test_repair_is_held_to_its_share_of_the_data_by_relaxing_the_target() -> None:
    sender = fec_sender.FecSender(SessionConfig(paths=(PathConfig("p0"),)), [], None)  # type: ignore[arg-type]
    curves = [fec_code.failure_curve([(150, 0.02, 1.0)], 48) for _ in range(3)]
    full = [fec_code.repair_for(curve, 1e-4) for curve in curves]
    sender.allowance = 10.0 * sender.symbol
    assert sum(full) > 10  # the full target would cost more than the allowance
    counts = sender._within_allowance(curves, 1e-4)
    assert sum(counts) <= 10 and min(counts) >= 1  # within it, and no block left bare
    sender.allowance = 1000.0 * sender.symbol
    assert sender._within_allowance(curves, 1e-4) == full


def test_block_shapes_tile_the_range_with_at_most_max_k_symbols() -> None:
    shapes = fec_code.block_shapes(1_000_003, 1386)
    assert shapes[0][0] == 0 and sum(size for _, size in shapes) == 1_000_003
    for (offset, size), (next_offset, _) in zip(shapes, shapes[1:], strict=False):
        assert offset + size == next_offset
    assert all(-(-size // 1386) <= fec_code.MAX_K for _, size in shapes)


def test_repair_frame_round_trips_and_malformed_ones_are_rejected() -> None:
    frame = RepairFrame(7, (1 << 40) + 3, 2, 3, 1, 1400, b"\x01" * 1400)
    (decoded,) = decode_frames(encode_frames([frame]))
    assert isinstance(decoded, RepairFrame)
    assert (decoded.shard_id, decoded.first_symbol, decoded.k, decoded.m, decoded.index, decoded.symbol,
            bytes(decoded.data or b"")) == (7, (1 << 40) + 3, 2, 3, 1, 1400, b"\x01" * 1400)
    assert decoded.offset == ((1 << 40) + 3) * 1400
    for bad in (RepairFrame(7, 0, 2, 3, 3, 1400, b"\x00" * 1400),  # index >= m
                RepairFrame(7, 0, 250, 10, 0, 1400, b"\x00" * 1400),  # k + m > 255
                RepairFrame(7, (1 << 48) - 1, 200, 3, 0, 20_000, b"\x00" * 20_000)):  # past 2^62
        with pytest.raises(WireError):
            decode_frames(encode_frames([bad]))
    with pytest.raises(WireError):
        decode_frames(encode_frames([frame])[:12])  # no symbol at all


def test_a_repair_datagram_is_no_larger_than_a_full_data_datagram() -> None:
    assert REPAIR_OVERHEAD <= DATA_OVERHEAD


def test_block_range_is_clipped_to_the_shard_and_must_reach_its_last_symbol() -> None:
    frame = RepairFrame(1, 2, 4, 1, 0, 100)  # symbols 2..5: bytes [200, 600)
    assert frame.covered(10_000) == 400
    assert frame.covered(550) == 350  # the last symbol is partial
    assert frame.covered(500) == 0  # symbol 5 is outside the shard: not this block


def _shard(data: bytes) -> IncomingShard:
    return IncomingShard(1, len(data), b"", b"", memoryview(bytearray(len(data))))


def _repairs(data: bytes, k: int, m: int, symbol: int) -> list[RepairFrame]:
    return [RepairFrame(1, 0, k, m, j, symbol, s)
            for j, s in enumerate(fec_code.encode(data, k, m, symbol))]


def test_receiver_rebuilds_lost_datagrams_that_straddle_symbols() -> None:
    k, m, symbol = 8, 3, 100
    data = random.Random(1).randbytes(k * symbol - 37)
    shard, rx = _shard(data), FecReceiver()
    # Datagrams of 150 bytes (not the symbol size); the second and fifth are lost:
    # [150, 300) and [600, 750) touch symbols 1, 2, 6 and 7.
    for start in range(0, len(data), 150):
        if start not in (150, 600):
            end = min(len(data), start + 150)
            shard.place(start, data[start:end], end - start, 0.0)
    frames = _repairs(data, k, m, symbol)
    assert rx.on_repair(frames[0], shard, 1.0) == []
    assert rx.on_repair(frames[2], shard, 1.0) == []
    assert not shard.complete
    rx.on_repair(frames[1], shard, 1.0)  # still only 3 for 4 missing symbols
    assert not shard.complete and rx.counters.blocks_rebuilt == 0
    shard.place(150, data[150:300], 150, 2.0)  # a retransmission: now 2 missing, 3 repair
    rebuilt = rx.on_data(shard, 150, 150, 150, 2.0)
    assert rebuilt == [(600, 700), (700, 763)]
    assert shard.complete and bytes(shard.buffer or b"") == data
    assert rx.counters.blocks_rebuilt == 1 and rx.counters.repaired_bytes == 150


def test_block_whose_repair_falls_short_waits_for_the_retransmission() -> None:
    k, m, symbol = 4, 1, 50
    data = random.Random(2).randbytes(k * symbol)
    shard, rx = _shard(data), FecReceiver()
    shard.place(0, data[:50], 50, 0.0)
    shard.place(150, data[150:], 50, 0.0)
    assert rx.on_repair(_repairs(data, k, m, symbol)[0], shard, 1.0) == []
    assert rx.counters.blocks_short == 1 and not shard.complete  # 2 lost, 1 repair symbol
    new = shard.place(50, data[50:100], 50, 2.0)  # one comes back by retransmission ...
    assert rx.on_data(shard, 50, 50, new, 2.0) == [(100, 150)]  # ... and repair rebuilds the other
    assert shard.complete and bytes(shard.buffer or b"") == data
    assert (rx.counters.blocks_rebuilt, rx.counters.blocks_short, rx.counters.repaired_bytes) == (1, 1, 50)


def test_a_repair_frame_outside_its_shard_is_counted_not_placed() -> None:
    shard, rx = _shard(bytes(100)), FecReceiver()
    assert rx.on_repair(RepairFrame(1, 1, 1, 1, 0, 100, bytes(100)), shard, 0.0) == []
    assert rx.rejected == 1 and shard.received.total == 0


def test_a_symbol_is_the_smallest_paths_full_datagram_payload() -> None:
    config = SessionConfig(paths=(PathConfig("a", 1500), PathConfig("b", 1280)))
    sender = fec_sender.FecSender(config, [], None)  # type: ignore[arg-type]
    assert sender.symbol == config.datagram_payload(config.paths[1])


def run(loss: float, fec: str, mode: str = "bytes") -> dict[str, Any]:
    return simulate(parse_scenario(LOSSY_LONG.format(loss=loss)), SimOptions(payload_mode=mode, fec=fec))


def test_fec_off_sends_no_repair_and_auto_does_on_a_lossy_long_tail() -> None:
    off, auto = run(0.01, "off"), run(0.01, "auto")
    assert off["intact"] and auto["intact"]
    assert off["repair_bytes"] == 0 and all(p["repair_bytes"] == 0 for p in off["paths"])
    assert 0 < auto["repair_bytes"] <= fec_sender.REPAIR_SHARE * auto["payload_bytes"]
    assert sum(p["repair_bytes"] for p in auto["paths"]) == auto["repair_bytes"]
    assert auto["repaired_bytes"] > 0  # the bytes mode rebuilt real data and the digests matched


def test_virtual_mode_models_the_same_recovery() -> None:
    virtual, real = run(0.01, "auto", "virtual"), run(0.01, "auto", "bytes")
    assert virtual["intact"]
    assert (virtual["completion_s"], virtual["repair_bytes"], virtual["repaired_bytes"]) == (
        real["completion_s"], real["repair_bytes"], real["repaired_bytes"])


def test_a_run_whose_repair_is_not_enough_still_completes_intact(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fec_sender, "MAX_REPAIR_PER_BLOCK", 1)  # one symbol against ~5 % loss
    report = run(0.05, "auto")
    assert report["intact"]
    assert report["repair_bytes"] > 0
    assert sum(p["retransmitted_bytes"] for p in report["paths"]) > 0
    assert report["fec_blocks_short"] > 0  # some blocks were completed by retransmission
