"""The attacker of tests/test_flood_netns.py, run in its own namespace pinned to one core.

It spoofs the sender: its interfaces carry the sender gateway's addresses and
it binds the sender's ports, so each datagram looks like the peer's to the
receiver's connected path sockets. It builds a seeded pool of hostile
datagrams (random bytes, truncated headers, oversize datagrams that are
fragmented on the way, data-plane look-alikes and real QUIC Initials from
aioquic), waits for ``go`` on stdin, then sends the pool in a loop with the C
``sendmmsg`` flood (``wanxport_lab._limits.udp_flood_send``, one thread per path,
the GIL released) for the given seconds: the rate one core reaches is the
rate of the flood. Prints one JSON object: what it sent and how fast.

    python tests/flood_blaster.py '{"paths": [[local, remote, port], ...], "seconds": S, "seed": N}'
"""

from __future__ import annotations

import json
import random
import socket
import sys
import threading
from typing import Any

from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

from wanxport_lab import _limits  # type: ignore[attr-defined]

POOL = 512


def quic_initials(rng: random.Random, count: int, remote: tuple[str, int]) -> list[bytes]:
    """Client Initials as a real QUIC stack sends them (1200+ bytes, fresh connection IDs)."""
    out = []
    for _ in range(count):
        conn = QuicConnection(configuration=QuicConfiguration(is_client=True, alpn_protocols=["wx"]))
        conn.connect(remote, now=0.0)
        out += [data for data, _ in conn.datagrams_to_send(now=0.0)]
    return out


def pool(rng: random.Random, remote: tuple[str, int]) -> list[bytes]:
    kinds: list[bytes] = quic_initials(rng, 16, remote)
    while len(kinds) < POOL:
        roll = rng.random()
        if roll < 0.4:  # random bytes, any first byte
            kinds.append(rng.randbytes(rng.randint(1, 1400)))
        elif roll < 0.6:  # data-plane look-alike: marker bits clear, a plausible header, forged tag
            kinds.append(bytes([rng.randint(0, 0x3F)]) + rng.randbytes(rng.randint(40, 1400)))
        elif roll < 0.8:  # truncated: shorter than any header
            kinds.append(rng.randbytes(rng.randint(1, 24)))
        else:  # oversize: above the path MTU (fragmented), some above a receive slot
            kinds.append(rng.randbytes(rng.randint(1500, 9000)))
    rng.shuffle(kinds)
    return kinds


def main(spec: dict[str, Any]) -> dict[str, Any]:
    rng = random.Random(spec["seed"])
    sockets, pools = [], []
    for local, remote, port in spec["paths"]:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        sock.bind((local, port))
        sock.connect((remote, port))
        sockets.append(sock)
        pools.append(pool(rng, (remote, port)))
    results: list[Any] = [None] * len(sockets)

    def flood(i: int) -> None:
        datagrams = pools[i]
        results[i] = _limits.udp_flood_send(sockets[i].fileno(), float(spec["seconds"]),
                                            b"".join(datagrams), [len(d) for d in datagrams])

    print(json.dumps({"event": "ready"}), flush=True)
    sys.stdin.readline()
    threads = [threading.Thread(target=flood, args=(i,)) for i in range(len(sockets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for sock in sockets:
        sock.close()
    sent = sum(r[0] for r in results)
    wall = max(r[3] for r in results)
    return {"event": "done", "datagrams": sent, "bytes": sum(r[1] for r in results),
            "cpu_s": sum(r[2] for r in results), "wall_s": wall, "eagain": sum(r[4] for r in results),
            "rate_pps": sent / wall if wall else 0.0, "per_path": [r[0] for r in results],
            "pool": {"datagrams": POOL, "quic_initials": 16}}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
