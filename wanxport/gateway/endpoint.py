"""A thin adapter over ``wanxport.aio.Endpoint`` that can change data-plane keys.

The aio endpoint seals with key phase 0 for its whole life. Key rotation
needs two more operations: install the peer's next key in the receiver's
other phase slot, and switch our sealing key and the header's key-phase bit.
Both data paths are subclassed here (the smallest change that keeps the aio
package untouched); datagrams already sealed and waiting in the pacer ring
keep their old phase, which the receiver still holds, so a switch never
strands anything in flight.
"""

from __future__ import annotations

import logging
from typing import Any

from wanxport.aio.config import DirectionKey
from wanxport.aio.endpoint import Endpoint
from wanxport.aio.native_path import NativeDatapath, _Pending, not_eliciting
from wanxport.aio.plan import ControlPlan, DataPlan, Plan
from wanxport.aio.python_path import PythonDatapath
from wanxport.wire import native
from wanxport.wire.frames import encode_frames
from wanxport.wire.header import encode_header
from wanxport.wire.protection import AeadProtection

log = logging.getLogger(__name__)


class _KeyCounters:
    """Packets and bytes sealed under the current sending key (the rotation trigger)."""

    key_phase: int
    packets_under_key: int
    bytes_under_key: int

    def _reset_counters(self, phase: int) -> None:
        self.key_phase = phase & 1
        self.packets_under_key = 0
        self.bytes_under_key = 0


class RekeyNativeDatapath(NativeDatapath, _KeyCounters):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reset_counters(0)
        self.local_send_errors = 0

    def use_send_key(self, phase: int, key: DirectionKey) -> None:
        self._seal = native.Protector(key.cipher, key.key, key.iv)
        self._reset_counters(phase)

    def install_recv_key(self, phase: int, key: DirectionKey) -> None:
        self.receiver.set_key(phase & 1, native.Protector(key.cipher, key.key, key.iv))

    def send(self, plans: list[Plan]) -> None:
        """As ``NativeDatapath.send``, sealing with the current key phase."""
        for plan in plans:
            nb = int(plan.not_before * 1e9)
            if isinstance(plan, DataPlan):
                burst = native.build_data_datagrams(
                    self._seal, self._conn, plan.path_id, plan.first_pn, self.key_phase, plan.shard_id,
                    plan.buffer, plan.offset, plan.length, plan.segment)
                self.packets_under_key += burst.count
                self.bytes_under_key += len(burst.buffer)
                self._enqueue(plan.path_id, _Pending(memoryview(burst.buffer), burst.stride, None, nb))
            else:
                self.packets_under_key += 1
                self._send_control(plan.path_id, self._seal_control(plan), nb, overtake=not_eliciting(plan))

    def _seal_control(self, plan: ControlPlan) -> bytes:
        header = encode_header(plan.path_id, self._conn, plan.pn, self.key_phase)
        return self._seal.seal(header, encode_frames(plan.frames))

    def _send_control(self, path_id: int, datagram: bytes, not_before_ns: int,
                      overtake: bool = True) -> None:
        """A local firewall drop (EPERM) or an unreachable route is a lost datagram, as
        on the wire; the core repairs it. (The aio data path only expects EAGAIN and
        ECONNREFUSED here.)"""
        try:
            super()._send_control(path_id, datagram, not_before_ns, overtake)
        except OSError as exc:
            self.local_send_errors += 1
            log.debug("path %d: control datagram not sent (%s)", path_id, exc.strerror or exc)


class RekeyPythonDatapath(PythonDatapath, _KeyCounters):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reset_counters(0)

    def use_send_key(self, phase: int, key: DirectionKey) -> None:
        self._sealer.keys = {phase & 1: AeadProtection(key.cipher, key.key, key.iv)}
        self._sealer.key_phase = phase & 1
        self._reset_counters(phase)

    def install_recv_key(self, phase: int, key: DirectionKey) -> None:
        self.opener.keys[phase & 1] = AeadProtection(key.cipher, key.key, key.iv)

    def send(self, plans: list[Plan]) -> None:
        for plan in plans:
            self.packets_under_key += plan.count if isinstance(plan, DataPlan) else 1
            self.bytes_under_key += plan.length if isinstance(plan, DataPlan) else 0
        super().send(plans)


class GatewayEndpoint(Endpoint):
    """``Endpoint`` whose data path supports ``use_send_key`` / ``install_recv_key``."""

    def _make_datapath(self) -> Any:
        cfg = self.config
        if self.datapath_name == "python":
            return RekeyPythonDatapath(self.sockets, cfg.send_key, cfg.recv_key, cfg.remote_conn_id,
                                       cfg.local_conn_id)
        slot = max(p.mtu for p in cfg.session.paths)
        return RekeyNativeDatapath(self.sockets, cfg.send_key, cfg.recv_key, cfg.remote_conn_id,
                                   cfg.local_conn_id, slot_size=max(2048, slot), capacity=cfg.pacer_capacity,
                                   spin_ns=cfg.pacer_spin_ns, burst_ns=cfg.pacer_burst_ns)

    def use_send_key(self, phase: int, key: DirectionKey) -> None:
        self.datapath.use_send_key(phase, key)

    def install_recv_key(self, phase: int, key: DirectionKey) -> None:
        self.datapath.install_recv_key(phase, key)

    @property
    def packets_under_key(self) -> int:
        return int(self.datapath.packets_under_key)

    @property
    def bytes_under_key(self) -> int:
        return int(self.datapath.bytes_under_key)

    @property
    def pacer_name(self) -> str | None:
        pacer = getattr(self.datapath, "pacer", None)
        return None if pacer is None else str(pacer.name)
