"""Public entry points of the control channel: serve, connect, connect to any.

Both ends present a certificate and verify the other's against one trusted
CA (mutual TLS 1.3 over QUIC, ALPN ``wanxport/1``); see ``tlsauth`` for how
aioquic's server is made to demand the client's certificate.

With one control address per path, ``connect_control_any`` dials them
happy-eyeballs style: the first address at once, the next after
``stagger_s`` or as soon as an earlier attempt fails, and the first handshake
to complete wins; the rest are closed. So a session can be set up while some
paths are dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from wanxport.aio.port import PathPort

from .admission import AdmissionLimits
from .certs import CertificateError
from .framing import Attach, Attached
from .link import (
    ControlConnectError,
    ControlConnection,
    SessionRefused,
    abandon_code,
    dial,
    make_configuration,
)
from .server import ControlServer, SessionCallback
from .session import ControlChannel, new_session_id

log = logging.getLogger(__name__)

Address = tuple[str, int]
PathLike = str | os.PathLike[str]

DEFAULT_IDLE_TIMEOUT_S = 10.0
DEFAULT_STAGGER_S = 0.25


@dataclass(frozen=True)
class DialOptions:
    """Everything a client needs to (re-)dial the control server."""

    cert: PathLike
    key: PathLike
    ca: PathLike
    server_name: str | None
    timeout_s: float
    idle_timeout_s: float
    stagger_s: float
    dscp: int | None = None  # DiffServ code point of the control datagrams (aio.sockets.set_dscp)

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s: {self.timeout_s} is not valid; use a number > 0")
        if self.stagger_s < 0:
            raise ValueError(f"stagger_s: {self.stagger_s} is not valid; use a number >= 0")


async def serve_control(
    host: str | list[Address] | None = None,
    port: int = 0,
    *,
    ports: Sequence[PathPort] = (),
    cert: PathLike,
    key: PathLike,
    ca: PathLike,
    on_session: SessionCallback,
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    resume_window_s: float = 30.0,
    window: int = 1024,
    on_reject: object = None,
    admission: AdmissionLimits | None = None,
) -> ControlServer:
    """Listen for control sessions on ``host:port``, or on every ``(host, port)``
    of a list (one per path), and on every path port in ``ports`` (shared with
    the data plane). ``on_session(channel)`` runs once per new authenticated
    session (a coroutine function is run as a task). ``admission``: the handshake
    limits of ``control.admission`` (Retry under load, half-open cap, per-source rate)."""
    config = make_configuration(
        is_client=False, cert=cert, key=key, ca=ca, idle_timeout_s=idle_timeout_s
    )
    server = ControlServer(
        config=config,
        ca=Path(ca),
        on_session=on_session,
        keepalive_s=idle_timeout_s / 3,
        resume_window_s=resume_window_s,
        window=window,
        on_reject=on_reject if callable(on_reject) else None,
        admission=admission,
    )
    addresses = host if isinstance(host, list) else [] if host is None else [(host, port)]
    if not addresses and not ports:
        raise ValueError("serve_control: give a host, a list of (host, port) or ports")
    try:
        for path_port in ports:
            server.serve_on(path_port)
        for listen_host, listen_port in addresses:
            await server.listen(listen_host, listen_port)
    except BaseException:
        server.close()
        raise
    return server


class AttachClaim:
    """Which of one happy-eyeballs dial's links may attach: the first to finish its handshake.

    Two links attaching one session race at the server (each supersedes the other) and
    the client cannot tell which one it kept; a starved server finishes several
    handshakes at once when it wakes. A holder that ends frees the claim."""

    def __init__(self) -> None:
        self.holder: ControlConnection | None = None

    def take(self, link: ControlConnection) -> bool:
        if self.holder is None or self.holder.ended:
            self.holder = link
        return self.holder is link


async def _dial_one(address: Address, attach: Attach, options: DialOptions,
                    claim: AttachClaim) -> tuple[ControlConnection, Attached]:
    config = make_configuration(
        is_client=True,
        cert=options.cert,
        key=options.key,
        ca=options.ca,
        idle_timeout_s=options.idle_timeout_s,
        server_name=options.server_name,
    )
    return await dial(
        address[0], address[1], attach, config=config, keepalive_s=options.idle_timeout_s / 3,
        dscp=options.dscp, may_attach=claim.take,
    )


def _describe(exc: BaseException) -> str:
    """Errors from ``dial`` already name their address; keep them one line."""
    return str(exc) or type(exc).__name__


async def dial_any(
    addresses: list[Address], attach: Attach, options: DialOptions
) -> tuple[ControlConnection, Attached]:
    """Happy-eyeballs dial: the first handshake to complete attaches (``AttachClaim``),
    the others close unattached; its attach answered, that link wins."""
    if not addresses:
        raise ValueError("addresses: give at least one (host, port)")
    pending: dict[asyncio.Task[tuple[ControlConnection, Attached]], Address] = {}
    errors: list[tuple[Address, BaseException]] = []
    next_index = 0
    winner: tuple[ControlConnection, Attached] | None = None
    claim = AttachClaim()
    try:
        async with asyncio.timeout(options.timeout_s):
            while winner is None:
                if next_index < len(addresses):
                    address = addresses[next_index]
                    next_index += 1
                    task = asyncio.create_task(_dial_one(address, attach, options, claim))
                    pending[task] = address
                if not pending:
                    break
                wait_s = options.stagger_s if next_index < len(addresses) else None
                done, _ = await asyncio.wait(
                    pending, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
                )
                for task in done:
                    address = pending.pop(task)
                    if task.exception() is not None:
                        errors.append((address, task.exception()))  # type: ignore[arg-type]
                    elif winner is None:
                        winner = task.result()
                    else:  # not while the claim holds; never a goodbye to a resumed session
                        task.result()[0].shutdown(abandon_code(attach), "another link attached first")
    except TimeoutError:
        pass
    finally:
        for task, (host, port) in pending.items():
            task.cancel()
            errors.append(((host, port), TimeoutError(
                f"control connection to {host}:{port}: no handshake within {options.timeout_s}s"
            )))
        for task in pending:
            with contextlib.suppress(BaseException):
                await task
    if winner is not None:
        return winner
    for _, exc in errors:
        if isinstance(exc, CertificateError | SessionRefused):
            raise exc
    detail = "; ".join(_describe(exc) for _, exc in errors)
    raise ControlConnectError(f"control: cannot connect to any control address ({detail})")


async def connect_control(
    host: str,
    port: int,
    *,
    cert: PathLike,
    key: PathLike,
    ca: PathLike,
    server_name: str | None = None,
    timeout_s: float = 5.0,
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
) -> ControlChannel:
    """Open a control session with the server at ``host:port``.

    ``server_name``: if given, the server certificate must be issued for it;
    if None, any certificate from the trusted CA is accepted and
    ``channel.peer_name`` says which gateway answered.
    """
    return await connect_control_any(
        [(host, port)], cert=cert, key=key, ca=ca, server_name=server_name,
        timeout_s=timeout_s, idle_timeout_s=idle_timeout_s,
    )


async def connect_control_any(
    addresses: list[Address],
    *,
    cert: PathLike,
    key: PathLike,
    ca: PathLike,
    server_name: str | None = None,
    timeout_s: float = 5.0,
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    stagger_s: float = DEFAULT_STAGGER_S,
) -> ControlChannel:
    """Open a control session over the first of ``addresses`` that answers."""
    options = DialOptions(cert, key, ca, server_name, timeout_s, idle_timeout_s, stagger_s)
    session_id = new_session_id()
    link, _ = await dial_any(addresses, Attach(session_id, 0, resume=False), options)
    channel = ControlChannel(session_id, link.peer_name)
    channel._attach(link, 0)
    return channel
