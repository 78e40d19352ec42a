"""The one-session-per-pair rule (``daemon/peers.py``) on its own, with stand-in sessions."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from wanxport.daemon.peers import DUPLICATE, SUPERSEDED, PeerSessions
from wanxport.gateway.handshake import SetupError


@dataclass
class Stub:
    """What the rule reads of a GatewaySession."""

    role: str
    peer_name: str
    peer_instance: str | None
    end_reason: str | None = None

    async def close(self, reason: str) -> None:
        if self.end_reason is None:
            self.end_reason = reason


async def _set_up(registry: PeerSessions, peer: str, dialler: str, instance: str) -> Stub:
    """One session setup through the rule: admitted (and adopted) or SetupError."""
    async with registry.admission(peer, dialler) as admission:
        await admission.decide(instance)
        session = Stub("initiator" if dialler == registry.site else "responder", peer, instance)
        admission.adopt(session)  # type: ignore[arg-type]
        return session


async def test_a_restarted_peer_replaces_the_old_session() -> None:
    registry = PeerSessions("gw-a")
    old = await _set_up(registry, "gw-b", "gw-a", "1" * 16)
    new = await _set_up(registry, "gw-b", "gw-b", "2" * 16)  # another instance of gw-b
    assert old.end_reason == SUPERSEDED and registry.current["gw-b"] is new
    again = await _set_up(registry, "gw-b", "gw-b", "2" * 16)  # the same instance redialled
    assert new.end_reason == SUPERSEDED and registry.current["gw-b"] is again


@pytest.mark.parametrize(("site", "peer"), [("gw-a", "gw-b"), ("gw-b", "gw-a")])
async def test_one_each_way_keeps_the_dial_of_the_first_name(site: str, peer: str) -> None:
    """Our session stands, the same peer instance's dial arrives: both sides keep gw-a's."""
    registry = PeerSessions(site)
    ours = await _set_up(registry, peer, site, "3" * 16)
    if site == "gw-a":
        with pytest.raises(SetupError, match=f"{DUPLICATE} gw-a"):
            await _set_up(registry, peer, peer, "3" * 16)
        assert ours.end_reason is None and registry.current[peer] is ours
    else:
        theirs = await _set_up(registry, peer, peer, "3" * 16)
        assert ours.end_reason == f"{DUPLICATE} gw-a" and registry.current[peer] is theirs
    assert registry.refused == 1


@pytest.mark.parametrize("dial_succeeds", [True, False])
async def test_the_first_name_waits_for_its_own_dial(dial_succeeds: bool) -> None:
    registry = PeerSessions("gw-a")
    dialling = asyncio.Event()
    finish = asyncio.Event()

    async def dial() -> None:
        async with registry.admission("gw-b", "gw-a") as admission:
            dialling.set()
            await finish.wait()  # the Welcome is on its way
            if not dial_succeeds:
                raise ConnectionError("no answer")
            await admission.decide("4" * 16)
            admission.adopt(Stub("initiator", "gw-b", "4" * 16))  # type: ignore[arg-type]

    ours = asyncio.create_task(dial())
    await dialling.wait()
    theirs = asyncio.create_task(_set_up(registry, "gw-b", "gw-b", "4" * 16))
    await asyncio.sleep(0)
    assert not theirs.done() and "gw-b" not in registry.current, "gw-b's dial waits for ours"
    finish.set()
    if dial_succeeds:
        await ours
        with pytest.raises(SetupError, match=f"{DUPLICATE} gw-a"):
            await theirs
        assert registry.current["gw-b"].role == "initiator"
    else:
        with pytest.raises(ConnectionError):
            await ours
        assert (await theirs) is registry.current["gw-b"], "ours failed: theirs is taken"


async def test_the_second_name_never_waits() -> None:
    registry = PeerSessions("gw-b")
    async with registry.admission("gw-a", "gw-b"):  # our dial in flight
        theirs = await asyncio.wait_for(_set_up(registry, "gw-a", "gw-a", "5" * 16), 1)
        assert registry.current["gw-a"] is theirs
