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
from typing import Any

from wanxport.control import RotationLimits
from wanxport.core.config import SessionConfig
from wanxport.presets import GATEWAY, Preset
from wanxport.presets import session_config as preset_session_config

Address = tuple[str, int]

DEFAULT_CIPHER = "aes-256-gcm"
DEFAULT_PIECE_BYTES = 64 << 20  # files are cut into shards of this size for pipelining
DEFAULT_CONTROL_TIMEOUT_S = GATEWAY.control_timeout_s
DEFAULT_STALL_TIMEOUT_S = 60.0  # a receiver with shards open and no data arriving gives up after this


@dataclass(frozen=True)
class GatewayOptions:
    """What both gateways tune; the receiver's credit travels in Welcome.

    The session's tuning defaults are ``wanxport.presets.GATEWAY``'s (``from_preset``
    takes another preset's).
    """

    cipher: str = DEFAULT_CIPHER
    mtu: int = GATEWAY.mtu
    segments: int = GATEWAY.segments
    credit_bytes: int = GATEWAY.credit_bytes
    piece_bytes: int = DEFAULT_PIECE_BYTES
    rotation: RotationLimits = field(default_factory=RotationLimits)
    control_timeout_s: float = DEFAULT_CONTROL_TIMEOUT_S
    connect_timeout_s: float = 10.0
    resume_window_s: float = 30.0
    datapath: str = "auto"
    fec: str = GATEWAY.fec  # the sender's erasure-coded tail (SessionConfig.fec); a receiver always decodes
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S
    congestion_control: str = GATEWAY.congestion_control  # a wanxport.core.cc registered name
    ack_delay_s: float = GATEWAY.ack_delay_s  # SessionConfig.max_ack_delay_s
    min_ack_delay_s: float | None = GATEWAY.min_ack_delay_s  # SessionConfig's: None, a fixed delay
    receive_holdoff_s: float = GATEWAY.receive_holdoff_s  # EndpointConfig's: the control interval
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
        if self.min_ack_delay_s is not None and not 0 < self.min_ack_delay_s <= 0.1:
            raise ValueError(f"min_ack_delay_s: {self.min_ack_delay_s} is not valid; "
                             "use 0 < s <= 0.1, or None for a fixed delay")
        if not 0 <= self.receive_holdoff_s <= 0.1:
            raise ValueError(f"receive_holdoff_s: {self.receive_holdoff_s} is not valid; use 0 <= s <= 0.1")

    @classmethod
    def from_preset(cls, preset: Preset, **others: Any) -> GatewayOptions:
        """Options whose session tuning is ``preset``'s; ``others`` set the rest."""
        return cls(mtu=preset.mtu, segments=preset.segments, credit_bytes=preset.credit_bytes,
                   ack_delay_s=preset.ack_delay_s, min_ack_delay_s=preset.min_ack_delay_s,
                   congestion_control=preset.congestion_control,
                   fec=preset.fec, control_timeout_s=preset.control_timeout_s,
                   receive_holdoff_s=preset.receive_holdoff_s, **others)

    def preset(self) -> Preset:
        """These options' session tuning as a preset (for reports: ``presets.overrides``)."""
        return Preset("options", mtu=self.mtu, segments=self.segments, credit_bytes=self.credit_bytes,
                      ack_delay_s=self.ack_delay_s, min_ack_delay_s=self.min_ack_delay_s,
                      congestion_control=self.congestion_control,
                      fec=self.fec, control_timeout_s=self.control_timeout_s,
                      receive_holdoff_s=self.receive_holdoff_s)


def session_config(n_paths: int, mtu: int, segments: int, credit_bytes: int,
                   fec: str = GATEWAY.fec, congestion_control: str = GATEWAY.congestion_control,
                   ack_delay_s: float = GATEWAY.ack_delay_s,
                   rate_caps_bps: tuple[float | None, ...] = (),
                   min_ack_delay_s: float | None = GATEWAY.min_ack_delay_s) -> SessionConfig:
    """The core session config both sides derive from the agreed paths, MTU and credit
    (``wanxport.presets.session_config``, paths named ``p0``, ``p1``, ...).

    ``rate_caps_bps`` is ours alone (the pacer's ceiling per path), not agreed.
    """
    preset = Preset("agreed", mtu=mtu, segments=segments, credit_bytes=credit_bytes,
                    ack_delay_s=ack_delay_s, min_ack_delay_s=min_ack_delay_s,
                    congestion_control=congestion_control, fec=fec)
    return preset_session_config([f"p{i}" for i in range(n_paths)], preset, rate_caps_bps=rate_caps_bps)


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
