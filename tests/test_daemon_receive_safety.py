"""What a daemon receives stays inside its directory and keeps its mode and mtime
(two gateways in one process over loopback paths)."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import make_pki, running, two_sites
from gateway_helpers import speak_3_only

from wanxport.daemon.client import GatewayClient
from wanxport.daemon.metrics import DaemonCollector
from wanxport.gateway.files import FilePiece
from wanxport.gateway.transfer import send_files

pytestmark = pytest.mark.timeout(120)
OLD_MTIME_NS = 978_307_200_123_456_789  # 2001-01-01, with nanoseconds


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


async def call(client: GatewayClient, method: str, *args: object, **kwargs: object) -> Any:
    return await asyncio.to_thread(getattr(client, method), *args, **kwargs)


async def submit_and_wait(client: GatewayClient, source: Path, dest: str) -> dict[str, Any]:
    transfer = await call(client, "submit", "gw-b", str(source), dest)
    result: dict[str, Any] = await call(client, "wait", transfer["id"], 60)
    return result


async def test_a_symlinked_destination_directory_is_not_written_through(
        pki: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    a_cfg, b_cfg = two_sites(tmp_path, pki)
    source = tmp_path / "x.bin"
    source.write_bytes(os.urandom(300_000))
    outside = tmp_path / "outside"
    outside.mkdir()
    async with running(a_cfg) as a, running(b_cfg) as b:
        inbox = b.config.received_dir / "gw-a"
        inbox.mkdir(parents=True)
        (inbox / "evil").symlink_to(outside)  # planted by whoever can write there
        client = GatewayClient(str(a.config.api_socket))
        with caplog.at_level(logging.WARNING, logger="wanxport.daemon.inbox"):
            failed = await submit_and_wait(client, source, "evil/sub/x.bin")
        fine = await submit_and_wait(client, source, "good/sub/x.bin")  # the session goes on
    why = "dest evil/sub/x.bin: 'evil' is a symlink; not followed"
    assert failed["state"] == "failed" and why in failed["reason"], failed
    assert why in caplog.text, "the receiving end says so too"
    assert list(outside.rglob("*")) == [], "nothing was written through the link"
    assert fine["state"] == "done", fine
    assert (inbox / "good/sub/x.bin").read_bytes() == source.read_bytes()


async def test_mode_and_mtime_are_kept_under_the_umask_and_group(pki: Path, tmp_path: Path) -> None:
    a_cfg, b_cfg = two_sites(tmp_path, pki, extra='[receive]\nrecv_group = "adm"')
    src = tmp_path / "src"
    src.mkdir()
    modes = {"secret.key": 0o600, "open.txt": 0o666, "tool.sh": 0o755, "setuid": 0o4755, "empty": 0o640}
    for name, mode in modes.items():
        (src / name).write_bytes(b"" if name == "empty" else name.encode() * 1000)
        os.chmod(src / name, mode)
        os.utime(src / name, ns=(OLD_MTIME_NS, OLD_MTIME_NS))
    async with running(a_cfg) as a, running(b_cfg) as b:
        client = GatewayClient(str(a.config.api_socket))
        done = await submit_and_wait(client, src, "run")
        assert a.sessions["gw-b"].protocol_version == b.sessions["gw-a"].protocol_version == 5
    assert done["state"] == "done", done
    inbox = b.config.received_dir / "gw-a/run"
    arrived = {name: stat.S_IMODE((inbox / name).stat().st_mode) for name in modes}
    # The sender's mode & ~0027 (the default umask); setuid is never kept.
    assert arrived == {"secret.key": 0o600, "open.txt": 0o640, "tool.sh": 0o750, "setuid": 0o750,
                       "empty": 0o640}
    assert {(inbox / name).stat().st_mtime_ns for name in modes} == {OLD_MTIME_NS}
    assert {(inbox / name).stat().st_gid for name in modes} == {4}  # adm
    assert (inbox / "secret.key").read_bytes() == (src / "secret.key").read_bytes()


async def test_with_a_gateway_of_protocol_3_files_arrive_without_mode_and_mtime(
        pki: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both daemons answer a Hello as protocol 3 did (each dials the other: each dials
    again offering 3); files still arrive, refusals still stop at the peer's directory."""
    speak_3_only(monkeypatch, "responder")
    a_cfg, b_cfg = two_sites(tmp_path, pki)
    source = tmp_path / "secret.key"
    source.write_bytes(b"k" * 70_000)
    os.chmod(source, 0o600)
    os.utime(source, ns=(OLD_MTIME_NS, OLD_MTIME_NS))
    outside = tmp_path / "outside"
    outside.mkdir()
    async with running(a_cfg) as a, running(b_cfg) as b:
        inbox = b.config.received_dir / "gw-a"
        inbox.mkdir(parents=True)
        (inbox / "evil").symlink_to(outside)
        client = GatewayClient(str(a.config.api_socket))
        done = await submit_and_wait(client, source, "secret.key")
        refused = await submit_and_wait(client, source, "evil/secret.key")
        assert a.sessions["gw-b"].protocol_version == b.sessions["gw-a"].protocol_version == 3
    assert done["state"] == "done", done
    st = (inbox / "secret.key").stat()
    assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_mtime_ns > OLD_MTIME_NS, "0666 & ~0027, a fresh mtime"
    assert refused["state"] == "failed" and "aborted" in refused["reason"], refused  # no reason at 3
    assert list(outside.rglob("*")) == []


@dataclass(frozen=True)
class LinkEntry(FilePiece):
    """A symlink entry as a sender of protocol 4 sends one: a zero-size piece naming its target."""

    target: str = ""

    def meta(self) -> dict[str, Any]:
        return {**super().meta(), "symlink": self.target}


async def test_symlink_entries_are_recreated_only_inside_their_tree(
        pki: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    a_cfg, b_cfg = two_sites(tmp_path, pki)
    src = tmp_path / "tree"
    src.mkdir()
    (src / "data.bin").write_bytes(b"d" * 5000)
    links = {"tree/sub/to-data": "../data.bin", "tree/to-other": "../other/secret",
             "tree/to-shadow": "/etc/shadow", "tree/sub/deep-out": "../../../gw-c/x"}
    async with running(a_cfg) as a, running(b_cfg) as b:
        client = GatewayClient(str(a.config.api_socket))
        assert (await submit_and_wait(client, src, "tree"))["state"] == "done"
        entries = [LinkEntry(10_000 + i, name, Path("/nonexistent"), 0, 0, 0, target=target)
                   for i, (name, target) in enumerate(links.items())]
        with caplog.at_level(logging.WARNING, logger="wanxport.gateway.files"):
            sent = await send_files(a.sessions["gw-b"], list(entries), show_progress=False)
        metrics = {m.name: m for m in DaemonCollector(b).collect()}
    assert sent.ok, sent.report
    inbox = b.config.received_dir / "gw-a/tree"
    assert os.readlink(inbox / "sub/to-data") == "../data.bin"
    assert (inbox / "sub/to-data").read_bytes() == b"d" * 5000
    for skipped in ("to-other", "to-shadow", "sub/deep-out"):
        assert not os.path.lexists(inbox / skipped), skipped
    assert b.received_skipped == {"symlink-outside": 3}
    [sample] = [s for s in metrics["wanxport_received_entries_skipped"].samples if s.name.endswith("_total")]
    assert (sample.labels, sample.value) == ({"reason": "symlink-outside"}, 3)
    assert "skipped symlink tree/to-shadow -> /etc/shadow" in caplog.text
