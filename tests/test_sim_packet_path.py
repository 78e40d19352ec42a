"""The simulator runs the production packet path: datagrams on the links, the aio core calls.

With several datagrams per core packet and loss, the links must carry
MTU-sized datagrams (each lost on its own), the receiver must report placed
runs, and the sender must translate ACKs down to single datagrams: some core
packets are confirmed in part before (or instead of) being acknowledged whole.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from wanxport.core import session as session_module
from wanxport.core.sender_acks import SenderAcks
from wanxport.core.session import Session
from wanxport.scenario import parse_scenario
from wanxport.sim.network import PathDirection
from wanxport.sim.runner import SimOptions, SimRun

LOSSY = """
name = "lossy-pair"
seed = 5
[transfer]
size = "6MiB"
shards = 3
[[paths]]
name = "p1"
rtt_ms = 30.0
bandwidth_mbps = 80.0
loss = 0.01
[[paths]]
name = "p2"
rtt_ms = 50.0
bandwidth_mbps = 50.0
loss = 0.005
"""


# These count calls by patching core and simulator methods; a mypyc-compiled core (the
# regular install ./dev test also runs) does not let them be replaced: the pure suite runs them.
patches_methods = pytest.mark.skipif(session_module.__file__.endswith(".so"),
                                     reason="patches core methods; compiled classes are closed")


def counted_run(monkeypatch: pytest.MonkeyPatch, options: SimOptions) -> tuple[dict[str, Any], Counter[str],
                                                                               list[int]]:
    calls: Counter[str] = Counter()
    sizes: list[int] = []
    for name in ("receive_data_run", "receive_packets", "received_prefix", "shard_verified"):
        original = getattr(Session, name)

        def counting(self: Session, *args: Any, _name: str = name, _original: Any = original) -> Any:
            calls[_name] += 1
            return _original(self, *args)
        monkeypatch.setattr(Session, name, counting)
    confirm = SenderAcks._confirm_part

    def confirming(self: SenderAcks, path: Any, pn: int, start: int, end: int, now: float) -> None:
        if path.loss.is_outstanding(pn):  # one-datagram (control) packets are never partly covered
            calls["partly_confirmed"] += 1
        confirm(self, path, pn, start, end, now)
    monkeypatch.setattr(SenderAcks, "_confirm_part", confirming)
    send = PathDirection.send

    def sending(link: PathDirection, packet: object, size: int) -> None:
        sizes.append(size)
        send(link, packet, size)
    monkeypatch.setattr(PathDirection, "send", sending)
    report = SimRun(parse_scenario(LOSSY), options).run()
    return report, calls, sizes


@patches_methods
@pytest.mark.parametrize("mode", ["bytes", "virtual"])
def test_lossy_run_confirms_parts_of_segmented_packets(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    report, calls, sizes = counted_run(monkeypatch, SimOptions(payload_mode=mode))
    assert report["intact"] and report["datagrams_per_packet"] == 16
    assert max(sizes) == 1500  # MTU-sized datagrams on the wire, not 16-datagram aggregates
    assert len(sizes) > 6 * 2**20 / 1425  # at least one send per datagram of payload
    assert calls["receive_data_run"] > 0 and calls["partly_confirmed"] > 0
    if mode == "bytes":  # verification as aio does it: ShardFilled, then the verdict
        assert calls["shard_verified"] == 3 and calls["received_prefix"] == 3


@patches_methods
def test_one_datagram_per_core_packet_has_nothing_to_confirm_in_part(monkeypatch: pytest.MonkeyPatch) -> None:
    report, calls, _ = counted_run(monkeypatch, SimOptions(payload_mode="virtual", datagrams_per_packet=1))
    assert report["intact"] and report["datagrams_per_packet"] == 1
    assert calls["receive_data_run"] > 0 and calls["partly_confirmed"] == 0
