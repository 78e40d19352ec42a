"""Per-connection TCP statistics (``struct tcp_info``) and MPTCP per-subflow ones.

The runner reports what each path carried and retransmitted; for TCP-based
baselines the kernel already counts that, per socket (``TCP_INFO``) and, for
MPTCP, per subflow (``SOL_MPTCP``/``MPTCP_TCPINFO`` with the subflows' addresses
from ``MPTCP_SUBFLOW_ADDRS``). Python's ``getsockopt`` cannot pass the input
header those MPTCP options need, hence ctypes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import socket
import struct
from typing import Any

# Offsets into struct tcp_info (include/uapi/linux/tcp.h); stable ABI, append-only.
TCP_INFO_LEN = 232
_FIELDS = {  # name: (offset, struct format)
    "ca_state": (1, "B"),  # 0 open, 1 disorder, 2 CWR, 3 recovery, 4 loss (RTO)
    "unacked": (24, "I"),
    "lost": (32, "I"),
    "rtt_us": (68, "I"),
    "snd_ssthresh": (76, "I"),
    "min_rtt_us": (148, "I"),
    "snd_cwnd": (80, "I"),
    "snd_mss": (16, "I"),
    "total_retrans": (100, "I"),
    "pacing_rate_Bps": (104, "Q"),
    "bytes_acked": (120, "Q"),
    "bytes_received": (128, "Q"),
    "notsent_bytes": (144, "I"),
    "delivery_rate_Bps": (160, "Q"),
    # Microseconds the connection had data in flight or queued, and the parts of it
    # limited by the peer's receive window and by our own send buffer.
    "busy_time_us": (168, "Q"),
    "rwnd_limited_us": (176, "Q"),
    "sndbuf_limited_us": (184, "Q"),
    "bytes_sent": (200, "Q"),
    "bytes_retrans": (208, "Q"),
    "snd_wnd": (228, "I"),  # the peer's advertised receive window, bytes
}

SOL_MPTCP = 284
MPTCP_TCPINFO = 2
MPTCP_SUBFLOW_ADDRS = 3
_SUBFLOW_DATA = struct.Struct("IIII")  # size_subflow_data, num_subflows, size_kernel, size_user
_ADDRS_LEN = 256  # two sockaddr_storage: local, remote
MAX_SUBFLOWS = 16

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def parse_tcp_info(raw: bytes) -> dict[str, int]:
    """The fields of ``_FIELDS`` that ``raw`` is long enough to hold."""
    out = {}
    for name, (offset, fmt) in _FIELDS.items():
        if offset + struct.calcsize(fmt) <= len(raw):
            out[name] = struct.unpack_from(fmt, raw, offset)[0]
    return out


def tcp_info(sock: socket.socket) -> dict[str, int]:
    """TCP_INFO of a plain TCP socket."""
    return parse_tcp_info(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_LEN))


def _mptcp_array(sock: socket.socket, optname: int, element: int) -> list[bytes]:
    header = _SUBFLOW_DATA.pack(_SUBFLOW_DATA.size, 0, 0, element)
    buf = ctypes.create_string_buffer(header + bytes(element * MAX_SUBFLOWS))
    length = ctypes.c_uint32(len(buf))
    if _libc.getsockopt(sock.fileno(), SOL_MPTCP, optname, buf, ctypes.byref(length)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"getsockopt(SOL_MPTCP, {optname})")
    _, count, _, size_user = _SUBFLOW_DATA.unpack_from(buf.raw)
    start = _SUBFLOW_DATA.size
    return [buf.raw[start + k * size_user:start + (k + 1) * size_user]
            for k in range(min(count, MAX_SUBFLOWS))]


def _ipv4(raw: bytes) -> str | None:
    family = struct.unpack_from("H", raw, 0)[0]
    return socket.inet_ntoa(raw[4:8]) if family == socket.AF_INET else None


def mptcp_subflows(sock: socket.socket) -> list[dict[str, Any]]:
    """One dict per live subflow: its local and remote IPv4 address and TCP_INFO fields."""
    infos = _mptcp_array(sock, MPTCP_TCPINFO, TCP_INFO_LEN)
    addrs = _mptcp_array(sock, MPTCP_SUBFLOW_ADDRS, _ADDRS_LEN)
    subflows = []
    for info, addr in zip(infos, addrs, strict=False):
        entry: dict[str, Any] = {"local": _ipv4(addr[:128]), "remote": _ipv4(addr[128:])}
        entry.update(parse_tcp_info(info))
        subflows.append(entry)
    return subflows
