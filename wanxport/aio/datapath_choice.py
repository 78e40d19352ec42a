"""Which data path an endpoint runs, and opening it over the endpoint's sockets.

The native path does the per-datagram work in C; the Python path is the
reference of the same protocol (``aio.datapath``). "auto" takes the native one
when its extension imports, so a host without a compiler still runs.
"""

from __future__ import annotations

import logging
import socket

from wanxport.aio.config import EndpointConfig
from wanxport.aio.datapath import Datapath
from wanxport.aio.python_path import PythonDatapath
from wanxport.wire import native

log = logging.getLogger(__name__)


def resolve_datapath(requested: str) -> str:
    """"native", "python", or "auto": native when the extension imports, else python (logged once)."""
    if requested == "auto":
        if native.NATIVE_AVAILABLE:
            return "native"
        log.warning("%s; using the Python data path", native.import_error)
        return "python"
    if requested == "native" and not native.NATIVE_AVAILABLE:
        raise RuntimeError(native.import_error)
    return requested


def open_datapath(cfg: EndpointConfig, name: str, sockets: list[socket.socket], *, shared: bool) -> Datapath:
    """The data path ``name`` ("native" or "python") over ``sockets``; ``shared``: the sockets
    are shared ports, unconnected, so each path sends to its peer by address."""
    destinations = [spec.remote for spec in cfg.sockets] if shared else None
    if name == "python":
        return PythonDatapath(sockets, cfg.send_key, cfg.recv_key, cfg.remote_conn_id,
                              cfg.local_conn_id, destinations=destinations)
    from wanxport.aio.native_path import NativeDatapath

    slot = max(p.mtu for p in cfg.session.paths)
    return NativeDatapath(sockets, cfg.send_key, cfg.recv_key, cfg.remote_conn_id,
                          cfg.local_conn_id, slot_size=max(2048, slot), capacity=cfg.pacer_capacity,
                          spin_ns=cfg.pacer_spin_ns, burst_ns=cfg.pacer_burst_ns,
                          destinations=destinations, workers=cfg.workers)
