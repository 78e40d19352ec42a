"""A gateway of protocol 4 with one that speaks 3, either side dialling: the files arrive
intact, and mode, mtime and the reasons of protocol 4 are simply not carried."""

from __future__ import annotations

import asyncio
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from gateway_helpers import free_path_ports, speak_3_only

from wanxport.control import MIN_PROTOCOL_VERSION, PROTOCOL_VERSION
from wanxport.control.certs import make_test_pki
from wanxport.gateway.config import GatewayOptions
from wanxport.gateway.files import FilePiece, FileSink, process_umask
from wanxport.gateway.handshake import SetupError, initiate, older_version_spoken
from wanxport.gateway.listener import GatewayListener
from wanxport.gateway.transfer import receive_files, send_files

pytestmark = pytest.mark.timeout(60)
OLD_MTIME_NS = 978_307_200_000_000_007


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    make_test_pki(directory, ["gw-a", "gw-b"])
    return directory


@dataclass(frozen=True)
class PieceWithAttributes(FilePiece):
    """A file piece as a protocol 4 sender describes it (the daemon's ``OutgoingPiece``)."""

    mode: int = 0
    mtime_ns: int = 0

    def meta(self) -> dict[str, Any]:
        return {**super().meta(), "mode": self.mode, "mtime_ns": self.mtime_ns}


async def accept_session(listener: GatewayListener) -> Any:
    """The next session set up; a Hello the old responder refused (the initiator then dials
    again) is skipped, as the daemon's listener does."""
    while True:
        try:
            return await listener.accept()
        except SetupError:
            continue


async def send_two_files(pki: Path, tmp_path: Path) -> tuple[int, int, Path]:
    """A 0600 file with an old mtime and an empty one, sent over a fresh pair; the versions
    both ends agreed on and where the files landed."""
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    (src / "secret.bin").write_bytes(os.urandom(200_000))
    (src / "empty").write_bytes(b"")
    for name in ("secret.bin", "empty"):
        os.chmod(src / name, 0o600)
        os.utime(src / name, ns=(OLD_MTIME_NS, OLD_MTIME_NS))
    pieces = [PieceWithAttributes(0, "secret.bin", src / "secret.bin", 0, 200_000, 200_000,
                                  mode=0o600, mtime_ns=OLD_MTIME_NS),
              PieceWithAttributes(1, "empty", src / "empty", 0, 0, 0, mode=0o600, mtime_ns=OLD_MTIME_NS)]
    sink = FileSink(out)
    listens = [("127.0.0.1", p) for p in free_path_ports(1)]
    listener = GatewayListener(listens, pki / "gw-b", pki / "ca.pem", GatewayOptions(),
                               allocator=sink.allocate)
    await listener.start()
    try:
        accepting = asyncio.create_task(accept_session(listener))
        sender = await initiate(listens, pki / "gw-a", pki / "ca.pem", GatewayOptions())
        receiver = await accepting
        receiving = asyncio.create_task(receive_files(receiver, sink, show_progress=False))
        sent = await send_files(sender, list(pieces), show_progress=False)
        await sender.close()
        received = await receiving
        await receiver.close()
    finally:
        listener.close()
    assert sent.ok and received.ok, (sent.report.get("error"), received.error)
    assert (out / "secret.bin").read_bytes() == (src / "secret.bin").read_bytes()
    assert (out / "empty").read_bytes() == b""
    return sender.protocol_version, receiver.protocol_version, out


async def test_two_gateways_of_protocol_4_keep_mode_and_mtime(pki: Path, tmp_path: Path) -> None:
    versions = await send_two_files(pki, tmp_path)
    assert versions[:2] == (PROTOCOL_VERSION, PROTOCOL_VERSION) == (5, 5)
    for name in ("secret.bin", "empty"):
        st = (versions[2] / name).stat()
        assert (stat.S_IMODE(st.st_mode), st.st_mtime_ns) == (0o600 & ~process_umask(), OLD_MTIME_NS)


@pytest.mark.parametrize("old_side", ["initiator", "responder"])
async def test_a_gateway_of_protocol_3_still_gets_the_files(
        pki: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old_side: str) -> None:
    offered = speak_3_only(monkeypatch, old_side)
    before_ns = time.time_ns()
    sender_version, receiver_version, out = await send_two_files(pki, tmp_path)
    assert sender_version == receiver_version == 3
    # Our Hello offered ours and the old responder refused it: we dialled again with 3.
    assert offered == ([3] if old_side == "initiator" else [PROTOCOL_VERSION, 3])
    for name in ("secret.bin", "empty"):
        st = (out / name).stat()
        assert stat.S_IMODE(st.st_mode) == 0o666 & ~process_umask(), "the default mode: not carried"
        assert st.st_mtime_ns >= before_ns, "a fresh mtime: not carried"


def test_only_a_refusal_naming_an_older_version_we_speak_is_retried() -> None:
    refusal = ("session setup: 'gw-b' refused the session (hello.version: 4 is not supported; "
               "this gateway speaks {})")
    assert older_version_spoken(refusal.format(3), offered=4) == 3
    assert older_version_spoken(refusal.format(MIN_PROTOCOL_VERSION - 1), offered=4) is None
    assert older_version_spoken(refusal.format(4), offered=4) is None  # no loop
    assert older_version_spoken("session setup: 'gw-b' refused the session (not a peer)", 4) is None
