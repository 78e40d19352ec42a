"""Fuzz target: the gateway daemon's CONFIG.toml (``wanxport gateway --check`` and SIGHUP reload).

An operator edits this file by hand and a reload applies it to a running
gateway, so every mistake must be a ``ConfigError`` (one line naming the field),
never a traceback that would kill ``--check`` or a reload. Two kinds of input,
chosen by the first byte:

* even: the rest is the file's text, through ``loads_config`` (what
  ``load_config`` does after reading the file: ``tomllib``, then
  ``parse_config``);
* odd: structure-aware. A valid config (``VALID``) is parsed into its tables and
  the rest of the input drives up to 8 edits of it (delete a key, replace a value
  with one of another type or an edge value, add an unknown key, repeat a list
  item), so the fuzzer spends its time past the TOML syntax, in the validation of
  each field.

A config that is accepted must also give what the daemon builds from it at start
(``gateway_options()``, ``describe``) without an exception.

    python fuzz/fuzz_daemon_config.py -max_total_time=600 /tmp/fuzz-daemonconfig fuzz/corpus/daemon_config
"""

from __future__ import annotations

import copy
import datetime
import math
from pathlib import Path
from typing import Any

import harness

VALID = """
site = "gw-a"
identity = "pki/gw-a"
ca = "pki/ca.pem"
listen = ["127.0.0.1:7400", "[::1]:7401"]
data_dir = "/var/lib/wanxport"
api_socket = "run/api.sock"
metrics = "127.0.0.1:0"

[limits]
memory_budget = "1GiB"
concurrent_transfers = 4

[transfer]
checkpoint_bytes = "64MiB"
drain_seconds = 30
warm_seconds = 300.5
cipher = "chacha20-poly1305"

[keys]
rotate_bytes = "1TiB"
rotate_seconds = 3600

[congestion]
controller = "cubic"

[[peers]]
name = "gw-b"
paths = ["10.0.0.2:7400", "10.0.1.2:7400"]

[[peers]]
name = "gw-c"
paths = ["gw-c.example:7400"]
"""

STRINGS = ["", "0", "-1", "1", "64KiB", "65535", "1GiB", "16EiB", "1e9", "nan", "1.5MiB", "2 MiB",
           "127.0.0.1:0", "127.0.0.1:65536", "[::1]:7400", "[::1]", "::1:7400", "host:", ":7400",
           "a:b:c", "/", "..", "../x", "\0", "gw-a", "gw b", "aes-256-gcm", "bbr", "reno", "é" * 3]
NUMBERS: list[Any] = [0, 1, -1, 2**63, -(2**63), 2**64, 65535, 65536, 0.0, -0.0, 1e308, math.inf,
                      -math.inf, math.nan, True, False]
OTHER: list[Any] = [datetime.datetime(1979, 5, 27, 7, 32), datetime.date(2026, 12, 1),
                    datetime.time(7, 32), [], {}, [[]], [{}]]


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key or list index in ``node``, as a path from the root."""
    found: list[tuple[Any, ...]] = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, value in items:
        found.append((*prefix, key))
        found += _paths(value, (*prefix, key))
    return found


def _value(fdp: Any) -> Any:
    kind = fdp.ConsumeIntInRange(0, 6)
    if kind == 0:
        return fdp.PickValueInList(STRINGS)
    if kind == 1:
        return fdp.PickValueInList(NUMBERS)
    if kind == 2:
        return copy.deepcopy(fdp.PickValueInList(OTHER))  # never one object in two places
    if kind == 3:
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 24))
    if kind == 4:
        return fdp.ConsumeInt(fdp.ConsumeIntInRange(1, 9))
    if kind == 5:
        return fdp.ConsumeFloat()
    return [fdp.PickValueInList(STRINGS) for _ in range(fdp.ConsumeIntInRange(0, 3))]


def _mutate(raw: dict[str, Any], fdp: Any) -> None:
    for _ in range(fdp.ConsumeIntInRange(1, 8)):
        paths = _paths(raw)
        if not paths:
            return
        path = paths[fdp.ConsumeIntInRange(0, len(paths) - 1)]
        parent: Any = raw
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        op = fdp.ConsumeIntInRange(0, 3)
        if op == 0:
            del parent[key]
        elif op == 1:
            parent[key] = _value(fdp)
        elif op == 2 and isinstance(parent[key], dict):
            parent[key][fdp.PickValueInList(["x", "site", "paths", "name", "limits"])] = _value(fdp)
        elif op == 3 and isinstance(parent[key], list) and parent[key]:
            parent[key].append(copy.deepcopy(parent[key][0]))
        else:
            parent[key] = _value(fdp)


def load() -> harness.Check:
    import tomllib

    import atheris

    from wanxport.daemon.config import ConfigError, describe, loads_config, parse_config

    base = Path("/etc/wanxport")
    valid = tomllib.loads(VALID)
    parse_config(copy.deepcopy(valid), base)  # the seed itself must be accepted

    def check(data: bytes) -> None:
        if not data:
            return
        try:
            if data[0] & 1:
                raw = copy.deepcopy(valid)
                _mutate(raw, atheris.FuzzedDataProvider(data[1:]))
                config = parse_config(raw, base)
            else:
                try:
                    text = data[1:].decode("utf-8")
                except UnicodeDecodeError:
                    return  # load_config: "not UTF-8 text"
                config = loads_config(text, base)
        except ConfigError:
            return
        config.gateway_options()
        describe(config)

    return check


if __name__ == "__main__":
    harness.run(load)
