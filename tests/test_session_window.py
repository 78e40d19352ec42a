"""Nothing above the asyncio adapter reaches through an endpoint into its core session.

The layers above (gateway, collectives, daemon, the benchmark runners, the lab
apps) read and steer a session through ``GatewaySession``'s and
``aio.Endpoint``'s calls (``stats()``, ``acked_bytes()``, ``receiving_bytes()``,
``peer_credit_bytes``, rate caps, careful resume); an ``x.endpoint.session`` chain
would tie them to the core's shape again.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHAIN = re.compile(r"\bendpoint\.session\b")
# The adapter owns its session; the simulator's runner is its own adapter (a SimEndpoint's session).
OWNERS = ("wanxport/aio/", "wanxport/sim/runner.py")


def chains(text: str) -> list[str]:
    return [f"{number}: {line.strip()}" for number, line in enumerate(text.splitlines(), 1)
            if CHAIN.search(line.split("#", 1)[0])]


def sources() -> list[Path]:
    files = list((ROOT / "wanxport").rglob("*.py"))
    for folder in ("benchmarks", "emulation", "examples", "wanxport_lab"):
        files.extend((ROOT / folder).rglob("*.py"))
    return sorted(files)


def test_the_chain_check_catches_what_it_should() -> None:
    assert chains("stats = session.endpoint.session.stats()")
    assert chains("core = self.endpoint.session")
    assert chains("return endpoint.session.stats().paths")
    assert not chains("stats = session.stats()")
    assert not chains("cfg = endpoint.config.session")  # the SessionConfig: configuration
    assert not chains("n = endpoint.sessions  # a daemon's table")
    assert not chains("x = 1  # endpoint.session in a comment")


def test_nothing_outside_the_adapter_reaches_through_an_endpoint() -> None:
    problems = []
    for source in sources():
        relative = source.relative_to(ROOT).as_posix()
        if relative.startswith(OWNERS):
            continue
        problems.extend(f"{relative}:{found}" for found in chains(source.read_text()))
    assert not problems, "read the session through GatewaySession / Endpoint calls:\n" + "\n".join(problems)
