"""Session.stats(): a frozen snapshot, consistent with what a run did; and nobody reads around it."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from test_core_session import Pair, all_acknowledged, make_config, payloads

from wanxport.core.cc import available_congestion_controls, cc_config
from wanxport.core.session import Session
from wanxport.core.stats import PathStats, SessionStats
from wanxport.wire.frames import Frame, ShardAckFrame

ROOT = Path(__file__).resolve().parents[1]
SHARDS, SHARD_BYTES = 4, 64_000
SIZE = SHARDS * SHARD_BYTES


@pytest.fixture(scope="module")
def finished_run() -> Pair:
    """Path 0 loses 2 % of the sender's packets at random; path 1 goes dark at 20 ms for good."""
    rng = random.Random(5)

    def drop(side: str, path_id: int, at: float, frames: list[Frame]) -> bool:
        if path_id == 1:
            return at >= 0.02
        return side == "a" and rng.random() < 0.02

    pair = Pair(make_config(), owd_s=[0.01, 0.03], rate_bps=[40e6, 20e6], drop=drop)
    for shard_id, data in enumerate(payloads(SHARDS, SHARD_BYTES)):
        pair.submit("a", shard_id, data)
    pair.run(30.0, stop=all_acknowledged(SHARDS))
    assert len(pair.acknowledged("a")) == SHARDS
    pair.run(pair.now + 1.0)  # long enough for path 1's probe timeout and unanswered probes
    return pair


def test_the_sender_snapshot_accounts_for_the_transfer(finished_run: Pair) -> None:
    stats = finished_run.a.stats()
    assert (stats.shards_submitted, stats.shards_acknowledged, stats.bytes_submitted) == (4, 4, SIZE)
    assert stats.acked_bytes == SIZE
    assert [p.name for p in stats.paths] == ["p0", "p1"]
    assert [p.path_id for p in stats.paths] == [0, 1]
    steady, flaky = stats.paths
    assert sum(p.payload_bytes for p in stats.paths) >= SIZE
    assert sum(p.payload_bytes - p.retransmitted_bytes - p.hedged_bytes for p in stats.paths) >= SIZE
    assert steady.packets_lost > 0 and steady.retransmitted_bytes > 0  # 2 % random loss
    assert flaky.state == "failed" and flaky.failures == 1  # down from 20 ms on, never back
    assert steady.state == "active" and steady.failures == 0
    assert steady.srtt_s is not None and steady.min_rtt_s is not None
    assert 0.02 <= steady.min_rtt_s <= steady.srtt_s  # 10 ms each way plus serialisation
    for path in stats.paths:
        assert path.packets_sent > 0 and path.bytes_sent >= path.payload_bytes
        assert path.cc_metrics["cwnd_bytes"] == path.cwnd_bytes
        assert path.cc_metrics["pacing_rate_bps"] == path.pacing_rate_bps
        assert path.cc_state and path.reorder_threshold >= 3 and path.time_threshold > 1.0
    assert finished_run.a.pacing_rates_bps() == [p.pacing_rate_bps for p in stats.paths]


def test_the_receiver_snapshot_counts_handed_over_shards(finished_run: Pair) -> None:
    stats = finished_run.b.stats()
    assert (stats.shards_received, stats.bytes_received, stats.receiving_bytes) == (4, SIZE, 0)
    assert stats.shards_submitted == 0 and stats.data_dropped == 0


def test_a_snapshot_is_frozen_and_does_not_follow_the_session(finished_run: Pair) -> None:
    session = finished_run.a
    stats = session.stats()
    assert isinstance(stats, SessionStats) and isinstance(stats.paths[0], PathStats)
    # Built from positional tuples without the named tuples' length check: a field added to
    # one side only (the class or core.stats' builder) must not go unnoticed.
    assert len(stats) == len(SessionStats._fields) and len(stats.paths[0]) == len(PathStats._fields)
    with pytest.raises(AttributeError):
        stats.hedged_bytes = 1  # type: ignore[misc]
    with pytest.raises(AttributeError):
        stats.paths[0].payload_bytes = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        stats.paths[0].cc_metrics["cwnd_bytes"] = 0.0  # type: ignore[index]
    before = stats.paths[0].packets_sent
    session.submit(99, b"x" * 1000, finished_run.now)
    assert session.poll_transmit(finished_run.now)
    assert stats.paths[0].packets_sent == before
    assert session.stats().paths[0].packets_sent > before


def test_acked_bytes_is_what_the_acknowledged_ranges_cover_at_every_step() -> None:
    """The sender's count is kept as acknowledgements arrive; at every step it equals the bytes
    the open shards' acknowledged ranges cover plus the shards finished, and never goes down."""
    rng = random.Random(11)

    def drop(side: str, path_id: int, at: float, frames: list[Frame]) -> bool:
        return rng.random() < 0.05  # both ways: DATA and ACKs go missing

    pair = Pair(make_config(), owd_s=[0.01, 0.02], rate_bps=[40e6, 20e6], drop=drop)
    seen: list[int] = []

    def check(run: Pair) -> None:
        outgoing = run.a.outgoing
        covered = sum(shard.acked.total for shard in outgoing.shards.values())
        finished = len(run.acknowledged("a")) * SHARD_BYTES
        assert run.a.stats().acked_bytes == run.a.acked_bytes() == covered + finished
        seen.append(run.a.acked_bytes())

    pair.checks.append(check)
    for shard_id, data in enumerate(payloads(SHARDS, SHARD_BYTES)):
        pair.submit("a", shard_id, data)
    pair.run(30.0, stop=all_acknowledged(SHARDS))
    assert len(pair.acknowledged("a")) == SHARDS
    assert seen == sorted(seen) and seen[-1] == SIZE and len(set(seen)) > SHARDS  # grew in steps


def test_a_shard_ack_counts_only_the_bytes_it_adds_within_the_shard() -> None:
    """SHARD_ACK (bytes the receiver rebuilt from repair) adds to ``acked_bytes`` what it newly
    covers: overlaps count once, a range past the shard's end is cut at the end."""
    session = Session(make_config())
    session.submit(0, b"x" * 10_000, 0.0)
    steps = [(((0, 1000), (5000, 6000)), 2000), (((500, 5500),), 6000), (((9000, 20_000),), 7000)]
    for number, (ranges, acked) in enumerate(steps, 1):
        session.receive_packet(0, number, [ShardAckFrame(0, ranges)], 0.01 * number)
        assert session.acked_bytes() == session.stats().acked_bytes == acked


@pytest.mark.parametrize("controller", available_congestion_controls())
def test_every_controller_opens_its_figures_with_window_rate_and_state(controller: str) -> None:
    """A snapshot reports each controller's window, pacing rate and state from the figures it
    hands over (``metrics_figures``), and they agree with what the controller says itself."""
    options = {"rate_bps": 10e6} if controller == "fixed" else None  # its one required option
    pair = Pair(make_config(congestion_control=cc_config(controller, options)), owd_s=[0.01, 0.02],
                rate_bps=[40e6, 20e6])
    pair.submit("a", 0, payloads(1, SHARD_BYTES)[0])
    pair.run(10.0, stop=all_acknowledged(1))
    assert len(pair.acknowledged("a")) == 1
    for path, stats in zip(pair.a.paths, pair.a.stats().paths, strict=True):
        assert (stats.cwnd_bytes, stats.pacing_rate_bps, stats.cc_state) == (
            path.cc.cwnd_bytes, path.cc.pacing_rate_bps, path.cc.state)
        assert dict(stats.cc_metrics) == path.cc.metrics()
        assert stats.cc_metrics["cwnd_bytes"] == stats.cwnd_bytes


def test_a_path_without_rtt_samples_reports_none() -> None:
    for path in Session(make_config()).stats().paths:
        assert path.srtt_s is None and path.min_rtt_s is None
        assert path.state == "active" and path.bytes_in_flight == 0


# -- no reading around the snapshot -----------------------------------------------------------

# What code outside wanxport/core may not do: reach the session's paths, a path's parts
# or a controller. Config objects also have ``.paths`` (SessionConfig, scenarios), so the
# session's list is matched by how sessions are named where they are used.
FORBIDDEN = [
    (re.compile(r"wanxport\.core\.(paths|recovery|ack_tracker)\b"), "imports a path part"),
    (re.compile(r"(?<![\w.])(core|session|endpoint\.session|\w+\.session)\.paths\b"),
     "reads Session.paths"),
    (re.compile(r"\.cc\.\w"), "reads a congestion controller"),
    (re.compile(r"\.rtt\.(smoothed_s|min_s|latest_s|has_sample)\b"), "reads an RTT estimator"),
    (re.compile(r"\.(outgoing|incoming)\.shards\b"), "reads the session's shard tables"),
    (re.compile(r"\.(loss|acks|health)\.\w"), "reads a path part"),
    (re.compile(r"\bhasattr\([^)]*\bcc\b"), "probes a controller's attributes"),
]
# ``cfg.session.paths`` / ``config.session.paths`` are the SessionConfig's path list.
ALLOWED = re.compile(r"(cfg|config)\.session\.paths\b")


def outside_core_sources() -> list[Path]:
    package = ROOT / "wanxport"
    files = [p for p in package.rglob("*.py") if "core" not in p.relative_to(package).parts]
    for folder in ("emulation", "benchmarks"):
        files.extend((ROOT / folder).rglob("*.py"))
    return sorted(files)


def leaks(text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        code = ALLOWED.sub("", line.split("#", 1)[0])
        for pattern, what in FORBIDDEN:
            if pattern.search(code):
                found.append(f"{number}: {what}: {line.strip()}")
    return found


def test_the_leak_check_catches_what_it_should() -> None:
    assert leaks("for path in endpoint.session.paths:")
    assert leaks("rate = self.session.paths[0].cc.pacing_rate_bps")
    assert leaks("x = path.rtt.smoothed_s")
    assert leaks("from wanxport.core.paths import Path")
    assert leaks("if hasattr(p.cc, 'max_bw_bps'):")
    assert leaks("sum(s.acked.total for s in core.outgoing.shards.values())")
    assert leaks("n = path.loss.bytes_in_flight") and leaks("if p.health.state is FAILED:")
    assert not leaks("slot = max(p.mtu for p in cfg.session.paths)")
    assert not leaks("for spec in scenario.paths:")
    assert not leaks("for path in session.stats().paths:")


def test_nothing_outside_the_core_reads_paths_or_controllers() -> None:
    known = {# EndpointConfig.session is the SessionConfig: its paths are configuration.
             ("wanxport/aio/config.py", "reads Session.paths"),
             # The simulated TCP-like neighbour is its own sender built from core parts (a loss
             # detector and a controller of its own), not a reader of a session's.
             ("wanxport/sim/tcp_flow.py", "imports a path part"),
             ("wanxport/sim/tcp_flow.py", "reads a congestion controller"),
             ("wanxport/sim/tcp_flow.py", "reads an RTT estimator")}
    problems = []
    for source in outside_core_sources():
        relative = source.relative_to(ROOT).as_posix()
        for leak in leaks(source.read_text()):
            if (relative, leak.split(": ")[1]) not in known:
                problems.append(f"{relative}:{leak}")
    assert not problems, "use Session.stats() instead:\n" + "\n".join(problems)
