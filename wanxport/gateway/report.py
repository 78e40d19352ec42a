"""Run report v1 (docs/design.md section 5) for one gateway session."""

from __future__ import annotations

from typing import Any

from wanxport.report import PathReport, build_report

from .session import GatewaySession


def session_report(session: GatewaySession, *, payload_bytes: int, delivered_bytes: int,
                   completion_s: float, intact: bool, wall_s: float,
                   timeline: list[tuple[float, int]] | None = None, **extra: Any) -> dict[str, Any]:
    endpoint = session.endpoint
    stats = session.stats()
    paths = [PathReport(path.name, path.payload_bytes, path.retransmitted_bytes, path.srtt_s, path.state,
                        {"packets_lost": path.packets_lost})
             for path in stats.paths]
    keys = session.keys
    return build_report(
        scenario=f"gateway-{len(stats.paths)}-paths", mode=session.mode, transport="wanxport",
        payload_bytes=payload_bytes, completion_s=completion_s, ideal_s=None, intact=intact,
        wall_s=wall_s, paths=paths, delivered_bytes=delivered_bytes,
        role="sender" if session.role == "initiator" else "receiver", peer=session.peer_name,
        cipher=keys.schedule.cipher, pacer=endpoint.pacer_name, datapath=endpoint.datapath_name,
        datagrams_rejected=session.datagrams_rejected,
        receiver_counters=dict(endpoint.datapath.counters),
        key_rotations=keys.rotations, peer_key_phase=keys.peer_phase,
        key_rotation_s=[round(t - session.totals.started, 3) for t in keys.rotation_times],
        control_reconnects=getattr(session.channel, "reconnects_total", 0),
        control_via=session.channel.via,
        goodput_timeline=[[t, b] for t, b in (timeline or [])],
        **extra,
    )

