"""A sender that stalls mid-shard while its control channel stays alive (loopback, in-process).

Its data plane goes silent after part of a shard (aborted without a word, as a
wedged or hostile peer would), its QUIC connection keeps answering: the
receiver must give up after its stall timeout with the reason, not wait for ever
holding the shard's share of its receive budget.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
from gateway_helpers import free_path_ports

from wanxport.control import ShardAnnounce
from wanxport.control.certs import make_test_pki
from wanxport.core.digest import shard_digest_hex
from wanxport.gateway.config import GatewayOptions
from wanxport.gateway.handshake import initiate
from wanxport.gateway.listener import GatewayListener
from wanxport.gateway.session import SessionFailed

pytestmark = pytest.mark.timeout(60)


async def test_a_stalled_sender_is_timed_out_with_the_reason(tmp_path: Path) -> None:
    make_test_pki(tmp_path, ["gw-a", "gw-b"])
    options = GatewayOptions(stall_timeout_s=1.0, credit_bytes=64 << 20)
    listens = [("127.0.0.1", p) for p in free_path_ports(1)]
    listener = GatewayListener(listens, tmp_path / "gw-b", tmp_path / "ca.pem", options)
    await listener.start()
    sender = await initiate(listens, tmp_path / "gw-a", tmp_path / "ca.pem", options)
    receiver = await listener.accept()
    data = random.Random(9).randbytes(48 << 20)
    loop = asyncio.get_running_loop()
    try:
        sending = asyncio.ensure_future(
            sender.send_shard(0, data, ShardAnnounce(0, len(data), shard_digest_hex(data), 0)))
        receiving = asyncio.ensure_future(receiver.receive())
        incoming = receiver.endpoint.session.incoming  # the core's tables: what the test inspects
        deadline = loop.time() + 20
        while not receiver.receiving_bytes():
            assert loop.time() < deadline, "no data arrived"
            await asyncio.sleep(0.001)
        sender.endpoint.abort()  # the data plane goes silent mid-shard; control stays up
        stalled_at = loop.time()
        with pytest.raises(SessionFailed, match=r"the sender stalled: no data for 1 s .*shard 0: \d+ of "
                                                rf"{len(data)} bytes"):
            await receiving
        # Counted from the last byte placed (the core's stall deadline), which may precede
        # the abort by the moment this loop took to notice it.
        waited = loop.time() - stalled_at
        assert 0.9 <= waited < 5.0, waited
        shard = incoming.shards[0]
        assert 0 < shard.received.total < len(data), "it stalled mid-shard"
        assert incoming.budget.opened <= options.credit_bytes
        assert receiver.failure is not None and "stalled" in str(receiver.failure)
        sending.cancel()
    finally:
        await sender.close()
        await receiver.close()
        listener.close()
