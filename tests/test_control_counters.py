"""The control channel counts its messages, acknowledgements, datagrams, bytes and CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from wanxport.control import ControlChannel, ShardComplete, connect_control, serve_control
from wanxport.control.certs import make_test_pki
from wanxport.control.counters import add, difference

pytestmark = pytest.mark.timeout(30)

MESSAGES = 5


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    make_test_pki(directory, ["gw-a", "gw-b"])
    return directory


def ident(pki: Path, name: str) -> dict[str, Path]:
    return {"cert": pki / f"{name}.pem", "key": pki / f"{name}.key", "ca": pki / "ca.pem"}


async def test_each_end_counts_what_it_sent_and_received(pki: Path) -> None:
    sessions: list[ControlChannel] = []

    async def echo(channel: ControlChannel) -> None:
        sessions.append(channel)
        async for msg in channel:
            assert isinstance(msg, ShardComplete)
            await channel.send(ShardComplete(msg.shard_id, "verified"))

    srv = await serve_control("127.0.0.1", 0, **ident(pki, "gw-b"), on_session=echo)
    try:
        channel = await connect_control(*srv.addresses[0], **ident(pki, "gw-a"), timeout_s=5)
        before = channel.counters.totals()
        for shard_id in range(MESSAGES):
            await channel.send(ShardComplete(shard_id, "verified"))
        for _ in range(MESSAGES):
            await channel.recv()
        sent = difference(channel.counters.totals(), before)
        server = sessions[0].counters.totals()
        await channel.aclose()
    finally:
        srv.close()
    assert sent["messages_sent"] == sent["messages_received"] == MESSAGES
    assert sent["sent_by_type"] == sent["received_by_type"] == {"ShardComplete": MESSAGES}
    assert server["sent_by_type"] == server["received_by_type"] == {"ShardComplete": MESSAGES}
    assert sent["acks_sent"] >= 1  # it consumed the answers and said so
    # Every message went out in a QUIC datagram, and the answers came back in some.
    assert 1 <= sent["datagrams_sent"] and 1 <= sent["datagrams_received"]
    assert sent["bytes_sent"] >= sent["datagrams_sent"] * 20 and sent["bytes_received"] > 0
    assert sent["cpu_s"] > 0 and server["cpu_s"] > 0
    assert server["datagrams_received"] > 0 and server["bytes_received"] > 0


def test_difference_and_add_go_key_by_key() -> None:
    before = {"messages_sent": 2, "sent_by_type": {"ShardAnnounce": 2}, "cpu_s": 0.5}
    after = {"messages_sent": 5, "sent_by_type": {"ShardAnnounce": 3, "ShardComplete": 2}, "cpu_s": 0.75}
    step = difference(after, before)
    assert step == {"messages_sent": 3, "sent_by_type": {"ShardAnnounce": 1, "ShardComplete": 2},
                    "cpu_s": 0.25}
    assert add(add({}, step), step) == {"messages_sent": 6,
                                     "sent_by_type": {"ShardAnnounce": 2, "ShardComplete": 4}, "cpu_s": 0.5}
