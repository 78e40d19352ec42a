"""What may be sent is what the submitter may read, and only from under ``send_roots``.

The submitting side is played by a forked child that drops to ``nobody`` (the
interpreter lives where ``nobody`` cannot exec it, so no ``setpriv`` subprocess):
it connects to the API after dropping, so ``SO_PEERCRED`` names ``nobody``. The child
reaches the socket and its sources through its working directory (entered while
still root), because pytest's own directories are closed to other users.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import socket
import stat
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import make_pki, running, two_sites

from wanxport.daemon.client import ApiError, GatewayClient
from wanxport.sources import SourceOpenError

pytestmark = pytest.mark.timeout(120)
SHADOW = Path("/etc/shadow")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


async def call(client: GatewayClient, method: str, *args: object, **kwargs: object) -> Any:
    return await asyncio.to_thread(getattr(client, method), *args, **kwargs)


class Nobody:
    """A forked child acting as nobody:nogroup from ``workdir``, forked before any daemon
    starts (a fork while the daemons' threads run could copy a lock mid-use), that
    submits through the API socket ``api.sock`` there: ``submit`` with descriptors as
    ``wanxport transfer submit`` does, ``raw`` a path-only request as curl would."""

    def __init__(self, workdir: Path) -> None:
        nobody = pwd.getpwnam("nobody")
        to_child, self._to_child = os.pipe()
        self._from_child, from_child = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            code = 0
            try:
                os.close(self._to_child)
                os.close(self._from_child)
                os.chdir(workdir)
                os.setgroups([])
                os.setresgid(nobody.pw_gid, nobody.pw_gid, nobody.pw_gid)
                os.setresuid(nobody.pw_uid, nobody.pw_uid, nobody.pw_uid)
                with os.fdopen(to_child) as commands, os.fdopen(from_child, "w") as answers:
                    for line in commands:
                        answers.write(json.dumps(_act(*json.loads(line))) + "\n")
                        answers.flush()
            except BaseException:  # noqa: BLE001 - never return into pytest in the child
                code = 1
            finally:
                os._exit(code)
        os.close(to_child)
        os.close(from_child)
        self._answers = os.fdopen(self._from_child)

    def ask(self, verb: str, source: str) -> dict[str, Any]:
        os.write(self._to_child, (json.dumps([verb, source]) + "\n").encode())
        return dict(json.loads(self._answers.readline()))

    def close(self) -> None:
        os.close(self._to_child)
        self._answers.close()
        os.waitpid(self.pid, 0)


def _act(verb: str, source: str) -> dict[str, Any]:
    """In the nobody child: one submission, its result or its error."""
    client = GatewayClient("api.sock", timeout_s=30)  # relative: cwd is the socket's directory
    try:
        if verb == "raw":
            body = {"peer": "gw-b", "source": source}
            return {"result": list(client.request("POST", "/v1/transfers", body))}
        return {"result": client.submit("gw-b", source)}
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        return {"error": type(exc).__name__, "status": getattr(exc, "status", None), "message": str(exc)}


def _hang_up_with_a_descriptor(api_socket: Path, path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(api_socket))
        socket.send_fds(sock, [b"POST /v1/transfers HTTP/1.1\r\nContent-Length: 1000\r\n\r\n{"], [fd])
    finally:
        sock.close()
        os.close(fd)


def _open_below(directory: Path) -> list[str]:
    """The paths below ``directory`` that this process holds open."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith(f"{directory}/"):
            found.append(target)
    return found


async def test_nobody_sends_only_what_nobody_can_read(pki: Path, tmp_path: Path) -> None:
    world = tmp_path / "world"
    world.mkdir()
    a_cfg, b_cfg = two_sites(tmp_path, pki)
    # /etc under send_roots too: what refuses shadow below is the submitter's rights, not the roots
    text = a_cfg.read_text().replace("send_roots = [", f'api_socket = "{world / "api.sock"}"\n'
                                     'send_roots = ["/etc", ')
    a_cfg.write_text(text)
    readable = world / "readable.bin"
    readable.write_bytes(b"for everyone" * 1000)
    readable.chmod(0o644)
    secret = world / "secret.bin"
    secret.write_bytes(b"root only" * 1000)
    secret.chmod(0o600)
    world.chmod(0o711)
    nobody = Nobody(world)
    try:
        await _nobody_case(a_cfg, b_cfg, world, nobody, readable)
    finally:
        nobody.close()


async def _nobody_case(a_cfg: Path, b_cfg: Path, world: Path, nobody: Nobody, readable: Path) -> None:
    async with running(a_cfg) as a, running(b_cfg) as b:
        os.chown(a.config.api_socket, -1, pwd.getpwnam("nobody").pw_gid)
        sent = await asyncio.to_thread(nobody.ask, "submit", "/proc/self/cwd/readable.bin")
        assert "result" in sent, sent
        done = await call(GatewayClient(str(a.config.api_socket)), "wait", sent["result"]["id"], 60)
        assert done["state"] == "done", done
        assert "uid 65534" in done["requester"], done["requester"]
        received = b.config.received_dir / "gw-a"
        assert (received / "readable.bin").read_bytes() == readable.read_bytes()

        for source in ("/proc/self/cwd/secret.bin", str(SHADOW)):
            refused = await asyncio.to_thread(nobody.ask, "submit", source)
            assert refused["error"] == "SourceOpenError", refused
            assert "Permission denied" in refused["message"], refused
        raw = await asyncio.to_thread(nobody.ask, "raw", str(SHADOW))
        status, body = raw["result"]
        assert status == 403 and "pass descriptors (use wanxport transfer submit)" in body["error"], raw
        listed = await call(GatewayClient(str(a.config.api_socket)), "list")
        assert [t["id"] for t in listed] == [sent["result"]["id"]], "nothing else was submitted"
        assert sorted(p.name for p in received.iterdir()) == ["readable.bin"]


async def test_a_source_symlink_to_shadow_is_not_followed(pki: Path, tmp_path: Path) -> None:
    a_cfg, b_cfg = two_sites(tmp_path, pki)
    src = tmp_path / "tree"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "data.bin").write_bytes(b"d" * 5000)
    (src / "evil").symlink_to(SHADOW)
    (src / "inside").symlink_to("sub/data.bin")
    async with running(a_cfg) as a, running(b_cfg) as b:
        client = GatewayClient(str(a.config.api_socket))  # root's client: it could read shadow
        t = await call(client, "submit", "gw-b", str(src))
        done = await call(client, "wait", t["id"], 60)
        assert done["state"] == "done", done
        received = b.config.received_dir / "gw-a" / "tree"
        files = {p.relative_to(received).as_posix(): p for p in received.rglob("*")}
        # evil is skipped (it points outside the tree); inside arrives as the symlink it is
        assert sorted(files) == ["inside", "sub", "sub/data.bin"], files
        assert files["sub/data.bin"].read_bytes() == b"d" * 5000
        assert os.readlink(files["inside"]) == "sub/data.bin"


async def test_outside_send_roots_and_no_roots_are_403_without_a_leaked_descriptor(
        pki: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    roots = tmp_path / "roots"
    roots.mkdir()
    a_cfg, b_cfg = two_sites(tmp_path, pki)
    text = a_cfg.read_text().replace(f'send_roots = ["{tmp_path}"]', f'send_roots = ["{roots}"]')
    a_cfg.write_text(text)
    outside = tmp_path / "many"  # more files than one sendmsg may carry
    outside.mkdir()
    for i in range(300):
        (outside / f"{i:03d}.bin").write_bytes(bytes([i % 256]) * 100)
    (roots / "escape").symlink_to(outside / "000.bin")
    inside = roots / "many"
    inside.mkdir()
    for i in range(300):
        (inside / f"{i:03d}.bin").write_bytes(bytes([i % 256]) * 100)
    async with running(a_cfg) as a, running(b_cfg) as b:
        client = GatewayClient(str(a.config.api_socket))
        await call(client, "status")
        for source, kwargs in [(outside, {}), (roots / "escape", {"follow_symlinks": True})]:
            with pytest.raises(ApiError) as refused:
                await call(client, "submit", "gw-b", str(source), **kwargs)
            assert refused.value.status == 403 and "not under send_roots" in str(refused.value)
        # Descriptors that do not match the request are refused and closed too.
        fd = os.open(inside / "000.bin", os.O_RDONLY)
        try:
            status, body = await asyncio.to_thread(
                client._post_with_fds, "/v1/transfers",
                {"peer": "gw-b", "source": str(inside), "entries": [{"name": "x", "fd": 0}], "fds": 2}, [fd])
        finally:
            os.close(fd)
        assert status == 422 and "2 descriptors, 1 arrived" in body["error"], body
        # A client that passes a descriptor and hangs up before its request is complete.
        await asyncio.to_thread(_hang_up_with_a_descriptor, a.config.api_socket, inside / "001.bin")
        await call(client, "status")  # the daemon has read and dropped that connection by now
        # (the daemons' own data_dir locks stay open: only the sources are looked at)
        assert _open_below(outside) + _open_below(roots) == [], "every refused descriptor was closed"
        assert any(r.levelname == "WARNING" and "refused a submission" in r.getMessage()
                   and "uid 0" in r.getMessage() for r in caplog.records)
        t = await call(client, "submit", "gw-b", str(inside))
        done = await call(client, "wait", t["id"], 60)
        assert done["state"] == "done", done
        assert len(list((b.config.received_dir / "gw-a" / "many").iterdir())) == 300
        assert _open_below(inside) == [], "a finished transfer's descriptors are closed"


async def test_without_send_roots_local_submissions_are_refused(pki: Path, tmp_path: Path) -> None:
    a_cfg, _ = two_sites(tmp_path, pki)
    a_cfg.write_text("\n".join(line for line in a_cfg.read_text().splitlines()
                               if not line.startswith("send_roots")) + "\n")
    src = tmp_path / "f.bin"
    src.write_bytes(b"x" * 100)
    async with running(a_cfg) as a:
        with pytest.raises(ApiError) as refused:
            await call(GatewayClient(str(a.config.api_socket)), "submit", "gw-b", str(src))
        assert refused.value.status == 403 and "send_roots" in str(refused.value)


def test_the_client_never_opens_through_a_symlink(tmp_path: Path) -> None:
    from wanxport.sources import open_source

    (tmp_path / "f").write_bytes(b"f")
    (tmp_path / "link").symlink_to(tmp_path / "f")
    with pytest.raises(SourceOpenError, match="symbolic link"):
        open_source(str(tmp_path / "link"))
    opened = open_source(str(tmp_path / "link"), follow_symlinks=True)
    try:
        assert stat.S_ISREG(os.fstat(opened.fds()[0]).st_mode)
    finally:
        opened.close()
