"""Gateway session settings and the address conventions of ``--listen`` / ``--to``.

Each path is one ``HOST:PORT``, one UDP port for both the data plane and the
QUIC control channel: the receiver's ``aio.port.PathPort`` tells them apart by
the first byte (QUIC sets 0x40, our marker never does), so consecutive ports
can be separate paths and a firewall needs one hole per path. Because every
path's port also answers QUIC, the control channel can start on, and move to,
any live path.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from wanxport.aio.config import offload_chunk_bytes
from wanxport.control import RotationLimits
from wanxport.core.cc import cc_config
from wanxport.core.config import PathConfig, SessionConfig

Address = tuple[str, int]

DEFAULT_CIPHER = "aes-256-gcm"
DEFAULT_MTU = 1500
DEFAULT_SEGMENTS = 32  # datagrams per core packet (segmentation happens below the core)
DEFAULT_CREDIT_BYTES = 1 << 30
DEFAULT_PIECE_BYTES = 64 << 20  # files are cut into shards of this size for pipelining
DEFAULT_CONTROL_TIMEOUT_S = 2.0  # QUIC idle timeout: how fast a dead control path is noticed
DEFAULT_STALL_TIMEOUT_S = 60.0  # a receiver with shards open and no data arriving gives up after this
DEFAULT_ACK_DELAY_S = 0.001  # longest a receiver holds an ACK back (session_config)


@dataclass(frozen=True)
class GatewayOptions:
    """What both gateways tune; the receiver's credit travels in Welcome."""

    cipher: str = DEFAULT_CIPHER
    mtu: int = DEFAULT_MTU
    segments: int = DEFAULT_SEGMENTS
    credit_bytes: int = DEFAULT_CREDIT_BYTES
    piece_bytes: int = DEFAULT_PIECE_BYTES
    rotation: RotationLimits = field(default_factory=RotationLimits)
    control_timeout_s: float = DEFAULT_CONTROL_TIMEOUT_S
    connect_timeout_s: float = 10.0
    resume_window_s: float = 30.0
    datapath: str = "auto"
    fec: str = "auto"  # the sender's erasure-coded tail (SessionConfig.fec); a receiver always decodes
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S
    congestion_control: str = "bbr"  # a wanxport.core.cc registered name
    ack_delay_s: float = DEFAULT_ACK_DELAY_S  # SessionConfig.max_ack_delay_s (see session_config)
    # Our sending rate cap (bits/s) per path, in path order; None or a missing entry: no cap.
    rate_caps_bps: tuple[float | None, ...] = ()
    # DiffServ code point (0..63) marked on our data and control datagrams; None: unmarked.
    dscp: int | None = None

    def __post_init__(self) -> None:
        if not 576 <= self.mtu <= 65535:
            raise ValueError(f"mtu: {self.mtu} is not valid; use 576..65535")
        if self.segments < 1:
            raise ValueError(f"segments: {self.segments} is not valid; use >= 1")
        if self.credit_bytes < 1 << 20:
            raise ValueError(f"credit_bytes: {self.credit_bytes} is not valid; use >= 1 MiB")
        if self.piece_bytes < 1:
            raise ValueError(f"piece_bytes: {self.piece_bytes} is not valid; use >= 1")
        if self.dscp is not None and not 0 <= self.dscp <= 63:
            raise ValueError(f"dscp: {self.dscp} is not valid; use 0..63")
        if self.control_timeout_s <= 0 or self.connect_timeout_s <= 0 or self.stall_timeout_s <= 0:
            raise ValueError("control_timeout_s, connect_timeout_s and stall_timeout_s must be > 0")
        if not 0 < self.ack_delay_s <= 0.1:
            raise ValueError(f"ack_delay_s: {self.ack_delay_s} is not valid; use 0 < s <= 0.1")


def session_config(n_paths: int, mtu: int, segments: int, credit_bytes: int,
                   fec: str = "auto", congestion_control: str = "bbr",
                   ack_delay_s: float = DEFAULT_ACK_DELAY_S,
                   rate_caps_bps: tuple[float | None, ...] = ()) -> SessionConfig:
    """The core session config both sides derive from the agreed paths, MTU and credit.

    Acknowledgements come about once per core packet and within ``ack_delay_s`` (1 ms
    by default): with the core's 5 ms delayed-ACK timer a short path's window would
    follow the timer. Over WAN paths only (tens of ms) a longer delay costs no window
    and saves acknowledgements (wanxport.collective uses 5 ms).
    ``rate_caps_bps`` is ours alone (the pacer's ceiling per path), not agreed.
    """
    caps = tuple(rate_caps_bps[:n_paths]) + (None,) * max(0, n_paths - len(rate_caps_bps))
    paths = tuple(PathConfig(f"p{i}", mtu, max_rate_bps=caps[i]) for i in range(n_paths))
    chunk = offload_chunk_bytes(paths, segments) if segments > 1 else None
    return SessionConfig(paths=paths, congestion_control=cc_config(congestion_control),
                         chunk_bytes=chunk, receive_budget_bytes=credit_bytes,
                         peer_credit_bytes=credit_bytes, ack_threshold=max(2, segments),
                         max_ack_delay_s=ack_delay_s, fec=fec)


def parse_hostport(text: str, what: str) -> Address:
    """``HOST:PORT`` or ``[V6]:PORT``: one path's UDP port (data and control)."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"{what}: {text!r} is not valid; use HOST:PORT (e.g. 10.0.0.2:7400)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ValueError(f"{what}: port {port} is not valid; use 1..65535")
    return host, port


def format_endpoint(address: Address) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_endpoint(text: str) -> Address:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
