"""Checks on the host and running commands inside a network namespace.

Commands run inside a namespace through util-linux's ``nsenter --net``, which enters it
and execs the tool in the same process (same pid, so signals and process groups work as
for the tool itself). Not a ``preexec_fn``: code between fork and exec in a process with
threads (test workers, our own data-path threads) may deadlock or fail in the child.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import subprocess
from collections.abc import Sequence
from typing import Any

from emulation.errors import EmulationError

CLONE_NEWNET = 0x40000000
NETNS_RUN_DIR = "/run/netns"

# Debian package that provides each external tool, for the one-line error.
TOOL_PACKAGES = {
    "ping": "iputils-ping",
    "iperf3": "iperf3",
    "ethtool": "ethtool",
    "mn": "mininet",
    "nft": "nftables",
    "nsenter": "util-linux",
}

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def require_root() -> None:
    """Creating namespaces and links needs CAP_NET_ADMIN; say so in one line."""
    if os.geteuid() != 0:
        raise EmulationError(
            "emulation needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) to create network "
            "namespaces; run it with sudo"
        )


def require_tool(name: str) -> str:
    """Absolute path of ``name``, or one line naming the Debian package to install."""
    path = shutil.which(name)
    if path is None:
        package = TOOL_PACKAGES.get(name, name)
        raise EmulationError(f"{name} not found: install the Debian package '{package}'")
    return path


def setns(name: str) -> None:
    """Move the calling thread into network namespace ``name``."""
    fd = os.open(f"{NETNS_RUN_DIR}/{name}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({name}): {os.strerror(err)}")
    finally:
        os.close(fd)


def in_namespace(ns: str, argv: Sequence[str]) -> list[str]:
    """``argv`` prefixed to run inside namespace ``ns`` (the tool must exist: ``require_tool``)."""
    require_tool(argv[0])
    return [require_tool("nsenter"), f"--net={NETNS_RUN_DIR}/{ns}", "--", *argv]


def popen_in(ns: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """Start ``argv`` inside namespace ``ns`` (the tool must exist; see ``require_tool``)."""
    return subprocess.Popen(in_namespace(ns, argv), **kwargs)


def run_in(ns: str, argv: Sequence[str], timeout: float = 60.0, check: bool = True,
           **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` inside ``ns`` to completion, capturing text output."""
    proc = subprocess.run(in_namespace(ns, argv), capture_output=True, text=True, timeout=timeout,
                          check=False, **kwargs)
    if check and proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise EmulationError(f"{' '.join(argv)} in {ns} failed ({proc.returncode}): {last[0]}")
    return proc


def disable_offloads(ns: str, ifname: str) -> None:
    """Turn off checksum, segmentation and receive offloads on ``ifname``.

    The engine reads and writes whole frames with AF_PACKET: with offloads on,
    it would see 64 KB GSO super-frames and frames whose checksum the kernel
    meant to fill in later, and the receiver would drop them.
    """
    run_in(ns, ["ethtool", "-K", ifname, "tx", "off", "tso", "off", "gso", "off", "gro", "off"])


def nic_offloads(ns: str, ifname: str, *, gateway: bool) -> None:
    """Offloads as the emulated hosts' NICs have them, for the engine, which reads and
    writes frames with their virtio-net headers (``ext/impair/offload.h``).

    A gateway's end keeps checksum offload and UDP segmentation offload, so its UDP GSO
    sends cross the veth whole with their checksums owed, as they would reach a NIC;
    the engine cuts them into the link's datagrams and hands each on with its checksum
    still owed, which the receiving gateway's veth takes as verified, as a NIC's
    receive offload would. TCP is still cut by the sender's kernel (``tso off``), and
    the middle's ends pass single frames only. Without this the sending thread cut and
    summed every datagram and the receiving one summed it again, in software.
    """
    gso = "on" if gateway else "off"
    run_in(ns, ["ethtool", "-K", ifname, "tx", "on", "tso", "off", "gso", gso, "gro", "off",
                "tx-udp-segmentation", gso])
