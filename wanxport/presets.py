"""Tuning defaults, in one place: the values a session runs with unless a user sets others.

The Python API, ``wanxport send``/``recv``, the daemon (through ``GatewayOptions``),
the collective, ``wanxport bench`` and the emulated ``--transport wanxport`` all
build their session config here, so a figure measured by any of them is a figure
of what users run. A run that needs other values derives them from a preset with
``dataclasses.replace`` and reports ``overrides(preset, used)`` beside its figures.

Two presets exist because two workloads differ:

- ``GATEWAY``: one-shot transfers and files, over any path from loopback to WAN.
  Acknowledgements about once per core packet, or once an eighth of the path's RTT has
  passed, from 1 ms up to 10 ms: a short path never waits on a WAN-sized delayed-ACK
  timer, and a long one acknowledges once per control interval. Its endpoints run the
  session once per control interval too: a receive hold-off from 1 ms, growing to an
  eighth of the shortest RTT up to that 10 ms, which turns itself off while any measured
  path's RTT is under 8 ms (loopback, a LAN: ``core.holdoff``). Without either, a
  receiver on the emulated hetero-8path handled 7 datagrams a pass and spent 7.2 CPU-s
  per GB, and its sender decoded an ACK a millisecond on every path.
- ``COLLECTIVE``: a group's persistent sessions, which cross WAN paths only (tens of
  ms), where a fixed delayed ACK of 10 ms costs no window and saves Python work at both
  ends; 64 datagrams per core packet halve the per-packet work again. The control
  channel shares the paths the collective saturates, so its idle timeout is longer.
  Its control interval (the receive hold-off from 1 ms) grows to an eighth of the
  shortest RTT, up to that ACK delay.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from wanxport.core.cc import cc_config
from wanxport.core.config import PathConfig, SessionConfig, datagram_payload


@dataclass(frozen=True)
class Preset:
    """Session tuning both gateways of a session agree on (the sender's choice wins)."""

    name: str
    mtu: int = 1500
    segments: int = 32  # datagrams per core packet (segmentation happens below the core)
    credit_bytes: int = 1 << 30  # the receiver's memory bound, granted to the sender
    ack_delay_s: float = 0.010  # longest a receiver holds an acknowledgement back
    # None: always ack_delay_s; set: an eighth of the path's RTT, from this up to ack_delay_s
    # (SessionConfig.min_ack_delay_s).
    min_ack_delay_s: float | None = None
    congestion_control: str = "bbr"  # a wanxport.core.cc registered name
    fec: str = "auto"  # the sender's erasure-coded tail; a receiver always decodes
    control_timeout_s: float = 2.0  # QUIC idle timeout: how fast a dead control path is noticed
    # Our endpoint's receive hold-off floor (EndpointConfig.receive_holdoff_s; 0: none), the
    # session's control interval on long paths; not agreed with the peer.
    receive_holdoff_s: float = 0.001


GATEWAY = Preset("gateway", min_ack_delay_s=0.001)
COLLECTIVE = Preset("collective", segments=64, control_timeout_s=10.0)


def offload_chunk_bytes(paths: tuple[PathConfig, ...], segments: int, tag_bytes: int = 16) -> int:
    """``SessionConfig.chunk_bytes`` for core packets of ``segments`` datagrams each.

    The smallest path MTU decides, so every path cuts a chunk into whole segments
    (larger-MTU paths send a shorter last one).
    """
    if segments < 1:
        raise ValueError("segments must be >= 1")
    return segments * min(datagram_payload(p, tag_bytes) for p in paths)


def session_config(path_names: Sequence[str], preset: Preset = GATEWAY, *,
                   rate_caps_bps: Sequence[float | None] = ()) -> SessionConfig:
    """The core session config of ``preset`` over paths named ``path_names`` (in order).

    ``rate_caps_bps`` is our own sending ceiling per path (a missing entry: none); the
    peer need not agree on it.
    """
    caps = tuple(rate_caps_bps[:len(path_names)]) + (None,) * max(0, len(path_names) - len(rate_caps_bps))
    paths = tuple(PathConfig(name, preset.mtu, max_rate_bps=cap)
                  for name, cap in zip(path_names, caps, strict=True))
    chunk = offload_chunk_bytes(paths, preset.segments) if preset.segments > 1 else None
    # A delay set below the floor (a user's shorter ack_delay_s) is the floor too: fixed.
    floor = None if preset.min_ack_delay_s is None else min(preset.min_ack_delay_s, preset.ack_delay_s)
    return SessionConfig(paths=paths, congestion_control=cc_config(preset.congestion_control),
                         chunk_bytes=chunk, receive_budget_bytes=preset.credit_bytes,
                         peer_credit_bytes=preset.credit_bytes, ack_threshold=max(2, preset.segments),
                         max_ack_delay_s=preset.ack_delay_s, min_ack_delay_s=floor,
                         fec=preset.fec)


def overrides(preset: Preset, used: Preset | SessionConfig, base: SessionConfig | None = None
              ) -> dict[str, Any]:
    """What a run changed from ``preset``: ``{field: value used}`` (empty: it ran the preset).

    ``used`` is either a preset derived from ``preset``, or a session config derived
    from ``base`` (``session_config`` of ``preset``), for knobs below the presets.
    """
    if isinstance(used, Preset):
        return {f.name: getattr(used, f.name) for f in dataclasses.fields(Preset)
                if f.name != "name" and getattr(used, f.name) != getattr(preset, f.name)}
    if base is None:
        raise ValueError("overrides: a session config needs the preset's config to compare with")
    out: dict[str, Any] = {}
    for f in dataclasses.fields(SessionConfig):
        if f.name == "paths":
            continue
        mine, theirs = getattr(used, f.name), getattr(base, f.name)
        if mine != theirs:
            out[f.name] = mine if isinstance(mine, int | float | str | None) else repr(mine)
    return out
