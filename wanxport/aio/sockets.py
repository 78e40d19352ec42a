"""UDP sockets for paths: bind, pin to a device, size the kernel buffers."""

from __future__ import annotations

import logging
import socket

from wanxport.aio import overflow
from wanxport.aio.config import PathSocket

log = logging.getLogger(__name__)

SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)


def open_path_socket(spec: PathSocket, recv_buffer: int, send_buffer: int) -> socket.socket:
    """A non-blocking UDP socket bound to ``spec.local``, connected when ``spec.remote`` is known.

    Large receive buffers matter more than anything else here: the event
    loop is busy for milliseconds at a time (shard verification hashes a whole
    shard), and a datagram the kernel cannot queue is a loss the sender must
    repair. The *FORCE options exceed ``net.core.rmem_max`` when we are root.
    """
    family = socket.AF_INET6 if ":" in spec.local[0] else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        if spec.device:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, spec.device.encode())
        set_buffers(sock, recv_buffer, send_buffer)
        if spec.dscp is not None:
            set_dscp(sock, spec.dscp)
        overflow.enable(sock)
        sock.bind(spec.local)
        if spec.remote is not None:
            sock.connect(spec.remote)
    except BaseException:
        sock.close()
        raise
    return sock


def set_dscp(sock: socket.socket, dscp: int) -> None:
    """Mark every datagram the socket sends with DiffServ code point ``dscp`` (0..63).

    The DSCP is the upper six bits of the IPv4 TOS byte / the IPv6 traffic class;
    the lower two (ECN) stay 0. Networks that give WAN paths classes of service
    (a training run's exchange above bulk copies) queue by this mark.
    """
    if not 0 <= dscp <= 63:
        raise ValueError(f"dscp: {dscp} is not valid; use 0..63")
    if sock.family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, dscp << 2)
    else:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)


def set_buffers(sock: socket.socket, recv_bytes: int | None = None,
                send_bytes: int | None = None) -> None:
    """Size a socket's kernel buffers; as root past ``net.core.[rw]mem_max`` (the *FORCE
    options, which a network namespace cannot raise otherwise), else as far as allowed."""
    for size, force, plain in ((recv_bytes, SO_RCVBUFFORCE, socket.SO_RCVBUF),
                               (send_bytes, SO_SNDBUFFORCE, socket.SO_SNDBUF)):
        if not size:
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, size)
        except PermissionError:
            sock.setsockopt(socket.SOL_SOCKET, plain, size)
            log.debug("socket buffer capped by net.core.*mem_max (not root)")
