"""Congestion controllers driven over a small synthetic path model.

The model (test helper, not library code) is one always-backlogged sender on
one path, driving a controller through the same calls the session makes:

* the sender sends whenever the window allows, paced at the controller's rate;
* the bottleneck is a FIFO at ``rate_bps`` behind a drop-tail buffer of
  ``queue_s`` seconds (measured at the initial rate, kept in bytes);
* a serialized packet is then lost with probability ``loss`` (i.i.d., seeded),
  as in ``wanxport.sim.network``;
* every delivered packet is acknowledged individually after ``rtt_s`` of
  propagation (no ack loss, no ack delay);
* the path is FIFO, so an ack for packet n proves every older unacknowledged
  packet lost: loss detection is exact and immediate. A retransmission timer
  declares everything lost when nothing has been acknowledged for 2 PTOs.

Numbers asserted are properties of these virtual-time runs (deterministic per
seed), not wall-clock measurements.
"""

from __future__ import annotations

import math
import random
from collections import deque

import pytest

from wanxport.core.cc import BbrConfig, CcContext, CongestionController, CubicConfig, FixedConfig, cc_config
from wanxport.core.cc.bbr import BbrCongestionController
from wanxport.core.delivery_rate import DeliveryRateEstimator, PacketRateState
from wanxport.core.rtt import RttEstimator

MSS = 1500
RATE_BPS = 40e6
RTT_S = 0.08


class PathModel:
    """One sender, one bottleneck, one controller; time advances by events."""

    def __init__(
        self,
        cc: CongestionController,
        *,
        rate_bps: float = RATE_BPS,
        rtt_s: float = RTT_S,
        loss: float = 0.0,
        queue_s: float = 0.05,
        mss: int = MSS,
        seed: int = 1,
    ) -> None:
        self.cc = cc
        self.rtt = RttEstimator()
        self.dre = DeliveryRateEstimator()
        self.rate_bps = rate_bps
        self.rtt_s = rtt_s
        self.loss = loss
        self.queue_bytes = queue_s * rate_bps / 8.0
        self.mss = mss
        self.rng = random.Random(seed)
        self.now = 0.0
        self.busy_until = 0.0
        self.next_send = 0.0
        self.next_pn = 0
        self.inflight = 0
        self.last_progress = 0.0
        self.acks: deque[tuple[float, int]] = deque()
        self.outstanding: deque[tuple[int, float, PacketRateState]] = deque()
        self.delivered_bytes = 0
        self.sent_packets = 0
        self.queue_drops = 0
        self.random_drops = 0
        self.declared_lost = 0

    def run_until(self, end: float) -> None:
        cc = self.cc
        mss = self.mss
        while True:
            t_ack = self.acks[0][0] if self.acks else math.inf
            t_send = max(self.next_send, self.now) if self.inflight + mss <= cc.cwnd_bytes else math.inf
            t_rto = self.last_progress + 2.0 * self.rtt.pto_s(0.0) if self.outstanding else math.inf
            t = min(t_ack, t_send, t_rto)
            if t > end:
                self.now = end
                return
            self.now = t
            if t == t_ack:
                self._on_ack()
            elif t == t_send:
                self._send()
            else:
                self._on_rto()

    def goodput_bps(self, start: float, end: float) -> float:
        """Run from ``start`` (already reached) to ``end``; return the delivered rate."""
        assert self.now <= start
        self.run_until(start)
        before = self.delivered_bytes
        self.run_until(end)
        return (self.delivered_bytes - before) * 8.0 / (end - start)

    def _send(self) -> None:
        now, mss = self.now, self.mss
        if not self.outstanding:
            self.last_progress = now
        state = self.dre.on_packet_sent(now, self.inflight)
        self.cc.on_packet_sent(now, mss, self.inflight)
        self.inflight += mss
        pn = self.next_pn
        self.next_pn += 1
        self.sent_packets += 1
        self.outstanding.append((pn, now, state))
        self.next_send = max(self.next_send, now) + mss * 8.0 / self.cc.pacing_rate_bps
        backlog_bytes = max(self.busy_until - now, 0.0) * self.rate_bps / 8.0
        if backlog_bytes > self.queue_bytes:
            self.queue_drops += 1
            return
        self.busy_until = max(self.busy_until, now) + mss * 8.0 / self.rate_bps
        if self.loss and self.rng.random() < self.loss:
            self.random_drops += 1
            return
        self.acks.append((self.busy_until + self.rtt_s, pn))

    def _on_ack(self) -> None:
        now, mss = self.now, self.mss
        _, pn = self.acks.popleft()
        out = self.outstanding
        lost = 0
        newest_lost_sent = -math.inf
        while out and out[0][0] < pn:
            newest_lost_sent = out.popleft()[1]
            lost += 1
        self.inflight -= lost * mss
        self.declared_lost += lost
        if out and out[0][0] == pn:
            _, sent_time, state = out.popleft()
            self.inflight -= mss
            self.delivered_bytes += mss
            self.last_progress = now
            self.rtt.update(now - sent_time, 0.0, now)
            self.dre.on_packet_acked(state, mss, now)
            sample = self.dre.generate_sample(now, self.rtt.min_s)
            self.cc.on_ack(now, mss, self.rtt, sample, self.inflight)
        if lost:
            self.cc.on_loss(now, lost * mss, self.inflight, newest_lost_sent, self.rtt)

    def _on_rto(self) -> None:
        lost = len(self.outstanding)
        newest = self.outstanding[-1][1]
        self.outstanding.clear()
        self.inflight = 0
        self.declared_lost += lost
        self.last_progress = self.now
        self.cc.on_loss(self.now, lost * self.mss, 0, newest, self.rtt)


CONTEXT = CcContext(mss_bytes=MSS)


def bbr() -> BbrCongestionController:
    """BBR as these runs drive it: ProbeRTT on (sessions default to off: BbrConfig)."""
    return BbrConfig(probe_rtt=True).build(CONTEXT)


def figure(cc: CongestionController, name: str) -> float:
    """One of the controller's metrics; inf for one it does not have (no cap, no sample)."""
    return cc.metrics().get(name, math.inf)


def test_model_delivers_a_fixed_rate_minus_random_loss() -> None:
    """Sanity check of the model itself: pacing below capacity delivers rate x (1 - p)."""
    cc = FixedConfig(rate_bps=0.5 * RATE_BPS).build(CONTEXT)
    model = PathModel(cc, loss=0.02, seed=3)
    goodput = model.goodput_bps(1.0, 4.0)
    assert goodput == pytest.approx(0.5 * RATE_BPS * 0.98, rel=0.03)
    assert model.queue_drops == 0
    # Every loss is detected, except those whose successors are still in flight.
    assert 0 <= model.random_drops - model.declared_lost <= 3


def test_bbr_converges_to_the_bottleneck_rate() -> None:
    cc = bbr()
    model = PathModel(cc)
    model.run_until(20 * RTT_S)
    assert not cc.in_startup
    assert cc.state == "probe_bw"
    assert cc.metrics()["max_bw_bps"] == pytest.approx(RATE_BPS, rel=0.05)
    assert figure(cc, "min_rtt_s") == pytest.approx(RTT_S, rel=0.02)
    goodput = model.goodput_bps(20 * RTT_S, 80 * RTT_S)
    assert goodput > 0.9 * RATE_BPS
    # Startup's overshoot is the only queue overflow; ProbeBW keeps the queue short.
    drops_after_startup = model.queue_drops
    model.run_until(120 * RTT_S)
    assert model.queue_drops == drops_after_startup


@pytest.mark.parametrize("loss", [0.01, 0.05])
def test_bbr_does_not_collapse_under_random_loss(loss: float) -> None:
    cc = bbr()
    model = PathModel(cc, loss=loss, seed=11)
    model.run_until(2.0)
    rates = []
    for k in range(6):
        rates.append(model.goodput_bps(2.0 + k, 3.0 + k))
        # Random loss without a standing queue is never taken for congestion.
        assert figure(cc, "bw_cap_bps") == math.inf
    assert min(rates) > 0.8 * RATE_BPS
    assert model.random_drops > 0


@pytest.mark.parametrize("loss", [0.01, 0.05])
def test_cubic_collapses_under_the_same_random_loss(loss: float) -> None:
    """The Mathis contrast: a loss-based window shrinks to ~1/sqrt(p) packets per RTT.

    RFC 9438's Reno-friendly response at p = 1 % is about 12 packets per RTT
    (about 1.8 Mb/s here), a few percent of the 40 Mb/s bottleneck.
    """
    cc = CubicConfig().build(CONTEXT)
    model = PathModel(cc, loss=loss, seed=11)
    model.run_until(2.0)
    goodput = model.goodput_bps(2.0, 8.0)
    assert goodput < 0.2 * RATE_BPS


def test_cubic_fills_the_path_without_random_loss() -> None:
    """Without random loss CUBIC is fine, so the collapse above is the loss, not the model."""
    cc = CubicConfig().build(CONTEXT)
    model = PathModel(cc, queue_s=0.05)
    model.run_until(2.0)
    assert model.goodput_bps(2.0, 8.0) > 0.8 * RATE_BPS


def test_bbr_backs_off_when_loss_comes_with_a_standing_queue() -> None:
    """The bottleneck halves: BBRv1's max filter would hold the old rate for 10 rounds
    while the queue overflows; wanxport caps the estimate once the queue stands."""
    cc = bbr()
    model = PathModel(cc, loss=0.01, seed=5)
    model.run_until(4.0)
    assert cc.bandwidth_bps == pytest.approx(RATE_BPS, rel=0.1)
    assert figure(cc, "bw_cap_bps") == math.inf
    model.rate_bps = RATE_BPS / 2
    model.run_until(4.6)
    # The max filter has not aged out yet, but congestion capped the estimate.
    assert cc.metrics()["max_bw_bps"] == pytest.approx(RATE_BPS, rel=0.1)
    assert figure(cc, "bw_cap_bps") < 0.8 * RATE_BPS
    model.run_until(5.5)
    assert cc.bandwidth_bps < 0.65 * RATE_BPS
    # Once the estimate has followed the new capacity, the path is used fully again.
    model.run_until(8.0)
    assert model.goodput_bps(8.0, 10.0) > 0.8 * RATE_BPS / 2


def test_bbr_probe_rtt_follows_a_longer_route_at_small_cost() -> None:
    """The route lengthens: the old min RTT expires 10 s after it was last seen and
    ProbeRTT runs once (draining to 4 packets for 200 ms) to measure the new one."""
    rate = 10e6
    cc = bbr()
    model = PathModel(cc, rate_bps=rate)
    model.run_until(2.0)
    model.rtt_s = 0.1
    states = set()
    t = 2.0
    while t < 10.5:
        t += 0.01
        model.run_until(t)
        states.add(cc.state)
    assert "probe_rtt" not in states
    assert figure(cc, "min_rtt_s") < 0.09  # the old minimum still holds
    delivered = model.delivered_bytes
    while t < 13.5:
        t += 0.01
        model.run_until(t)
        states.add(cc.state)
    assert "probe_rtt" in states
    assert cc.state == "probe_bw"
    assert figure(cc, "min_rtt_s") == pytest.approx(0.1, rel=0.02)
    # ProbeRTT costs a few percent of these 3 s.
    assert (model.delivered_bytes - delivered) * 8 / 3.0 > 0.85 * rate


def _print_loss_table() -> None:
    """Goodput of BBR and CUBIC on the model: ``PYTHONPATH=. python tests/test_cc_pathmodel.py``."""
    print(f"goodput over 2..8 s, {RATE_BPS / 1e6:.0f} Mb/s bottleneck, {RTT_S * 1e3:.0f} ms RTT")
    for loss in (0.0, 0.001, 0.01, 0.05):
        row = []
        for name in ("bbr", "cubic"):
            model = PathModel(cc_config(name).build(CONTEXT), loss=loss, seed=11)
            model.run_until(2.0)
            row.append(f"{name} {model.goodput_bps(2.0, 8.0) / 1e6:6.2f} Mb/s")
        print(f"loss {loss:5.1%}: " + "   ".join(row))


if __name__ == "__main__":
    _print_loss_table()
