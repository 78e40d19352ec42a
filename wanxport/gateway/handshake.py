"""Session setup over the control channel: Hello/Keys -> Welcome/Keys.

Initiator (sender)                      Responder (receiver)
  Hello(endpoints, cipher, mtu,  ---->
        instance)
  Keys(initiator->responder, 0)  ---->  binds its data sockets, starts its endpoint
                                 <----  Welcome(paths, conn ids, credit, instance)
                                 <----  Keys(responder->initiator, 0)
  starts its endpoint, data flows

Hello carries the initiator's protocol version, Welcome the one both then speak: the
lower of the two, down to ``MIN_PROTOCOL_VERSION``. A responder of an older version
refuses a newer Hello outright (naming the version it speaks); the initiator then dials
again offering that version, so a gateway still talks to one of the previous version.

The responder's endpoint is running before its Welcome leaves, so the first
data datagram always finds an open socket. The initiator learns its own data
endpoints (to put in Hello) before it has any key, by asking the kernel which
local address and port a socket connected to each path would use, or, with data ports
bound beforehand (the daemon's), from those. ``instance`` is the process's random id: the
daemon keeps one session per peer pair by it (``daemon/peers.py``), deciding in the
``decide`` hook, after the peer's Hello or Welcome and before any data socket is used.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import re
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from cryptography import x509

from wanxport.aio.config import EndpointConfig, PathSocket
from wanxport.aio.endpoint import Allocator, Endpoint
from wanxport.aio.port import PathPort
from wanxport.aio.sockets import open_path_socket
from wanxport.control import (
    MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    Bye,
    ControlChannel,
    ControlProtocolError,
    Hello,
    Keys,
    Message,
    ResilientControl,
    Welcome,
    answer_hello,
    load_identity,
)
from wanxport.control.certs import certificate_name, check_ca_file
from wanxport.core.events import PathChanged
from wanxport.core.health import PathState

from .config import (
    Address,
    GatewayOptions,
    format_endpoint,
    is_loopback,
    parse_endpoint,
    session_config,
)
from .rekey import DataKeys, direction_key
from .session import GatewaySession

M = TypeVar("M", bound=Message)
SUPPORTED_CIPHERS = ["aes-256-gcm", "chacha20-poly1305"]
# How every version (3 included) refuses a Hello of a version it does not speak.
_SPEAKS = re.compile(r"hello\.version: \d+ is not supported; this gateway speaks (\d+)")

log = logging.getLogger(__name__)


class SetupError(ConnectionError):
    """The peers could not agree on a session (one line, says why)."""


def identity_name(cert_path: os.PathLike[str] | str) -> str:
    with open(cert_path, "rb") as fh:
        return certificate_name(x509.load_pem_x509_certificate(fh.read()))


async def expect(channel: ControlChannel, kind: type[M], timeout_s: float) -> M:
    try:
        msg = await asyncio.wait_for(channel.recv(), timeout_s)
    except TimeoutError:
        raise SetupError(f"session setup: no {kind.TYPE} from {channel.peer_name!r} within "
                         f"{timeout_s:.0f} s") from None
    if isinstance(msg, Bye):
        raise SetupError(f"session setup: {channel.peer_name!r} refused the session ({msg.reason})")
    if not isinstance(msg, kind):
        raise SetupError(f"session setup: expected {kind.TYPE}, got {msg.TYPE}")
    return msg


def local_endpoint_for(remote: Address) -> Address:
    """The (address, ephemeral port) a UDP socket towards ``remote`` would use; only its
    address is kept (the port is released again at once)."""
    family = socket.AF_INET6 if ":" in remote[0] else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(remote)
        host, port = probe.getsockname()[:2]
    return str(host), int(port)


def bind_towards(remotes: list[Address], dscp: int | None) -> list[socket.socket]:
    """A data socket per path, bound now on the address the route towards its remote leaves
    from: the Hello announces these ports, and a port found free but bound only after the
    Welcome could be taken in between, leaving the peer a session we cannot open."""
    sockets: list[socket.socket] = []
    try:
        for remote in remotes:
            spec = PathSocket((local_endpoint_for(remote)[0], 0), None, dscp=dscp)
            sockets.append(open_path_socket(spec, EndpointConfig.recv_buffer_bytes,
                                            EndpointConfig.send_buffer_bytes))
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _check_keys(keys: Keys, direction: str, cipher: str) -> None:
    if keys.direction != direction or keys.key_phase != 0 or keys.cipher != cipher:
        raise SetupError(f"session setup: peer's first keys must be {direction} phase 0 with "
                         f"{cipher}, got {keys.direction} phase {keys.key_phase} {keys.cipher}")


# Called once the peer's Hello (responder) or Welcome (initiator) is in, with the peer
# process's instance id, before any data socket is used: raising SetupError refuses the
# session with that reason (the gateway daemon's one session per peer pair).
Decide = Callable[[str | None], Awaitable[None]]


async def initiate(paths: list[Address], identity: os.PathLike[str] | str, ca: os.PathLike[str] | str,
                   options: GatewayOptions | None = None, allocator: Allocator | None = None, *,
                   ports: list[PathPort] | None = None, instance: str | None = None,
                   decide: Decide | None = None, watch_receiving: bool = False) -> GatewaySession:
    """Dial the peer on any path's port and set up a session (we send).

    ``watch_receiving``: we also receive files over it (the daemon), so watch for a stalled
    sender and the peer's data-plane close as a responder does.
    ``ports``: our data sockets, one per path, bound beforehand (the daemon binds them at
    start); without them each path gets a fresh ephemeral socket. ``instance``: our process's
    id for the peer (Hello.instance)."""
    options = options or GatewayOptions()
    if not paths:
        raise ValueError("paths: give at least one HOST:PORT")
    cert, key = load_identity(identity)
    check_ca_file(ca)
    version = PROTOCOL_VERSION
    while True:
        channel = await ResilientControl.connect(
            list(paths), cert=cert, key=key, ca=ca,
            timeout_s=options.connect_timeout_s, idle_timeout_s=options.control_timeout_s,
            resume_window_s=options.resume_window_s, dscp=options.dscp)
        try:
            return await _initiate_on(channel, paths, identity_name(cert), options, allocator, ports,
                                      instance, decide, watch_receiving, version)
        except SetupError as exc:
            channel.close()
            older = older_version_spoken(str(exc), version)
            if older is None:
                raise
            log.info("%s speaks protocol %d, not %d: dialling again with %d", channel.peer_name, older,
                     version, older)
            version = older
        except BaseException:
            channel.close()
            raise


def older_version_spoken(refusal: str, offered: int) -> int | None:
    """The version a peer's refusal of our Hello says it speaks, when it is one we speak
    too and older than ``offered`` (then dialling again with it agrees); else None."""
    match = _SPEAKS.search(refusal)
    spoken = int(match.group(1)) if match else None
    return spoken if spoken is not None and MIN_PROTOCOL_VERSION <= spoken < offered else None


async def _initiate_on(channel: ControlChannel, paths: list[Address], name: str, options: GatewayOptions,
                       allocator: Allocator | None, ports: list[PathPort] | None, instance: str | None,
                       decide: Decide | None, watch_receiving: bool, version: int) -> GatewaySession:
    if ports is not None and len(ports) < len(paths):
        raise ValueError(f"ports: {len(ports)} given for {len(paths)} paths")
    bound = bind_towards(paths, options.dscp) if ports is None else None
    try:
        return await _initiate_bound(channel, paths, name, options, allocator, ports, bound, instance,
                                     decide, watch_receiving, version)
    except BaseException:
        for sock in bound or ():
            sock.close()  # the endpoint that would own them never came (it closes its own)
        raise


async def _initiate_bound(channel: ControlChannel, paths: list[Address], name: str, options: GatewayOptions,
                          allocator: Allocator | None, ports: list[PathPort] | None,
                          bound: list[socket.socket] | None, instance: str | None, decide: Decide | None,
                          watch_receiving: bool, version: int) -> GatewaySession:
    locals_ = ([_announced(ports[i].address, p) for i, p in enumerate(paths)] if bound is None
               else [sock.getsockname()[:2] for sock in bound])
    keys = DataKeys("initiator->responder", options.cipher, options.rotation, time.monotonic)
    conn_id = int.from_bytes(os.urandom(4), "big")
    await channel.send(Hello(version, "initiator", name, [format_endpoint(a) for a in locals_],
                             [options.cipher], conn_id, mtu=options.mtu, segments=options.segments,
                             instance=instance))
    await channel.send(keys.current)
    welcome = await expect(channel, Welcome, options.connect_timeout_s)
    peer_keys = await expect(channel, Keys, options.connect_timeout_s)
    _check_keys(peer_keys, "responder->initiator", options.cipher)
    if welcome.cipher != options.cipher or welcome.peer_conn_id != conn_id:
        raise SetupError("session setup: the peer's welcome does not match our hello")
    if not MIN_PROTOCOL_VERSION <= welcome.version <= version:
        raise SetupError(f"session setup: the peer answered protocol {welcome.version}; we offered "
                         f"{version} and speak {MIN_PROTOCOL_VERSION}..{PROTOCOL_VERSION}")
    n = len(welcome.paths)
    if not 1 <= n <= len(paths):
        raise SetupError(f"session setup: the peer agreed to {n} paths, we offered {len(paths)}")
    if decide is not None:
        try:
            await decide(welcome.instance)
        except SetupError as exc:
            await refuse_session(channel, str(exc))
            raise
    credit = welcome.credit_bytes or options.credit_bytes
    remotes = _data_remotes(paths[:n], welcome)
    cfg = EndpointConfig(
        session_config(n, options.mtu, options.segments, credit, fec=options.fec,
                       congestion_control=options.congestion_control, ack_delay_s=options.ack_delay_s,
                       min_ack_delay_s=options.min_ack_delay_s, rate_caps_bps=options.rate_caps_bps),
        tuple(PathSocket(locals_[i], remotes[i], dscp=options.dscp) for i in range(n)),
        send_key=direction_key(keys.current), recv_key=direction_key(peer_keys),
        local_conn_id=conn_id, remote_conn_id=welcome.conn_id, datapath=options.datapath,
        receive_holdoff_s=options.receive_holdoff_s)
    if bound is not None:
        for sock, remote in zip(bound, remotes, strict=False):
            sock.connect(remote)
        for sock in bound[n:]:
            sock.close()  # paths the peer did not agree to
    endpoint = Endpoint(cfg, allocator=allocator, ports=None if ports is None else ports[:n],
                        bound=None if bound is None else bound[:n])
    endpoint.start()
    mode = "loopback" if all(is_loopback(p[0]) for p in paths[:n]) else "network"
    session = GatewaySession("initiator", channel, endpoint, keys, channel.peer_name, mode=mode,
                             stall_timeout_s=options.stall_timeout_s if watch_receiving else None,
                             protocol_version=welcome.version)
    session.peer_instance = welcome.instance
    if isinstance(channel, ResilientControl):
        endpoint.path_listeners.append(functools.partial(_control_off_failed_path, channel, paths[:n]))
    return session


def _control_off_failed_path(channel: ResilientControl, paths: list[Address], event: PathChanged) -> None:
    """Path i's control address is ``paths[i]``: when the data plane fails that path, the
    control link over it is dead too, so it re-dials now rather than after its idle timeout
    (a training step blocked ~10 s on the control messages queued behind it)."""
    if event.new == PathState.FAILED:
        channel.abandon_link(paths[event.path_id])


def _announced(bound: Address, remote: Address) -> Address:
    """Our data endpoint as the peer should address it: the socket's port, and its host
    unless it is a wildcard (then the address the route towards ``remote`` leaves from)."""
    host, port = bound
    if host in ("0.0.0.0", "::"):
        host = local_endpoint_for(remote)[0]
    return host, port


def _data_remotes(paths: list[Address], welcome: Welcome) -> list[Address]:
    """Where path ``i``'s data goes: the host we dialled, at the port the Welcome names.

    A responder serving one session carries its data on the path ports themselves (the
    port we dialled); one serving several peers at once gives a later session ports of
    its own on the same hosts. The host stays ours: the responder may listen on a
    wildcard address it cannot name. Port 0 (a listener configured with an ephemeral
    port names its configuration, not the bound port) means the port we dialled.
    """
    remotes = []
    for i, (address, pair) in enumerate(zip(paths, welcome.paths, strict=True)):
        try:
            port = parse_endpoint(pair[1])[1]
        except ValueError:
            raise SetupError(f"session setup: welcome.paths[{i}]: {pair[1]!r} is not HOST:PORT") from None
        if not 0 <= port < 65536:
            raise SetupError(f"session setup: welcome.paths[{i}]: port {port} is not valid")
        remotes.append((address[0], port or address[1]))
    return remotes


async def respond(channel: ControlChannel, listens: list[Address], name: str, options: GatewayOptions,
                  allocator: Allocator | None = None, ports: list[PathPort] | None = None, *,
                  instance: str | None = None, decide: Decide | None = None) -> GatewaySession:
    """Answer an initiator's Hello on an authenticated channel (we receive).

    ``ports``: the listener's path ports; the endpoint shares them (one UDP port
    per path for control and data) instead of binding ``listens`` itself.
    ``instance``: our process's id for the peer (Welcome.instance).
    """
    hello = await expect(channel, Hello, options.connect_timeout_s)
    peer_keys = await expect(channel, Keys, options.connect_timeout_s)
    try:
        welcome = answer_hello(hello, gateway=name, endpoints=[format_endpoint(a) for a in listens],
                               ciphers=SUPPORTED_CIPHERS, conn_id=int.from_bytes(os.urandom(4), "big"))
    except ControlProtocolError as exc:
        await refuse_session(channel, str(exc))
        raise SetupError(f"session setup: {exc}") from None
    _check_keys(peer_keys, "initiator->responder", welcome.cipher)
    if decide is not None:
        try:
            await decide(hello.instance)
        except SetupError as exc:
            await refuse_session(channel, str(exc))
            raise
    mtu = hello.mtu or options.mtu
    segments = hello.segments or options.segments
    n = len(welcome.paths)
    keys = DataKeys("responder->initiator", welcome.cipher, options.rotation, time.monotonic)
    peers = [parse_endpoint(pair[0]) for pair in welcome.paths]
    cfg = EndpointConfig(
        session_config(n, mtu, segments, options.credit_bytes, fec=options.fec,
                       congestion_control=options.congestion_control, ack_delay_s=options.ack_delay_s,
                       min_ack_delay_s=options.min_ack_delay_s, rate_caps_bps=options.rate_caps_bps),
        tuple(PathSocket(listens[i], peers[i], dscp=options.dscp) for i in range(n)),
        send_key=direction_key(keys.current), recv_key=direction_key(peer_keys),
        local_conn_id=welcome.conn_id, remote_conn_id=hello.conn_id, datapath=options.datapath,
        receive_holdoff_s=options.receive_holdoff_s)
    try:
        endpoint = Endpoint(cfg, allocator=allocator, ports=None if ports is None else ports[:n])
    except OSError as exc:
        await refuse_session(channel, f"data port busy ({exc.strerror or exc})")
        raise SetupError(f"session setup: cannot open the data ports: {exc.strerror or exc}") from None
    endpoint.start()
    try:
        await channel.send(dataclasses.replace(welcome, credit_bytes=options.credit_bytes, instance=instance))
        await channel.send(keys.current)
    except BaseException:
        endpoint.abort()
        raise
    mode = "loopback" if all(is_loopback(p[0]) for p in peers) else "network"
    session = GatewaySession("responder", channel, endpoint, keys, channel.peer_name, mode=mode,
                             stall_timeout_s=options.stall_timeout_s, protocol_version=welcome.version)
    session.peer_instance = hello.instance
    return session


async def refuse_session(channel: ControlChannel, reason: str) -> None:
    """Tell the peer why its session is refused (a Bye with the reason), then close the channel."""
    try:
        await channel.send(Bye(reason))
        await channel.aclose(timeout_s=1.0)
    except Exception:  # noqa: BLE001 - best effort: the session is being refused anyway
        channel.close()
