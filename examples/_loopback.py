"""What the examples share: loopback "sites" on one machine (test PKI, free path ports).

On a real deployment each site has its own hosts, certificates and WAN interfaces;
here every site is a set of processes on this machine and every wanxport path is a
loopback UDP port, so the examples run anywhere after ``./dev setup``.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

from wanxport.control.certs import make_test_pki

PATHS_PER_PAIR = 2  # wanxport paths between two ranks (loopback ports here)


def site_name(site: int) -> str:
    return f"site-{site}"


def make_pki(directory: Path, n_sites: int) -> Path:
    """One certificate per site (all ranks of a site share it), signed by one test CA."""
    make_test_pki(directory, [site_name(s) for s in range(n_sites)])
    return directory


def free_ports(count: int, seed: int | None = None) -> list[int]:
    """``count`` consecutive UDP ports on 127.0.0.1, free right now (below the ephemeral range)."""
    rng = random.Random(seed)
    while True:
        first = rng.randrange(20_000, 30_000 - count)
        socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(count)]
        try:
            for i, sock in enumerate(socks):
                sock.bind(("127.0.0.1", first + i))
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
        return list(range(first, first + count))
