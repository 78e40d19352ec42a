"""Replays of captured bytes: every datagram of a real session, re-injected later (root only).

``tests/replay_capture.py`` runs in a namespace of its own (so ``lo`` carries
only this session): it captures the receiver-bound datagrams of a 4 MiB transfer
with AF_PACKET and re-injects them unchanged through a raw socket, shuffled, during a second
transfer of the same session and again after the session ended. Every one must
be rejected and counted (data-plane replays as ``rejected_replay`` during the
session and ``no_session`` after it, QUIC ones as aioquic drops, except a
replayed client Initial after the session, which is a new handshake attempt
for admission), the later transfers must stay byte-exact, nothing placed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.netns, pytest.mark.timeout(180)]

TESTS = Path(__file__).resolve().parent


def test_captured_datagrams_replayed_late_are_all_rejected_and_counted(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("ethtool") is None:
        pytest.skip("needs root, iproute2 and ethtool for a network namespace")
    ns = f"wxreplay-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        # Datagrams as on a wire: no 64 KiB GSO batches on lo (the sender segments in software).
        subprocess.run(["ip", "netns", "exec", ns, "ethtool", "-K", "lo", "tx-udp-segmentation", "off"],
                       check=True, capture_output=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)])}
        done = subprocess.run(["ip", "netns", "exec", ns, sys.executable, str(TESTS / "replay_capture.py"),
                               str(tmp_path)], capture_output=True, text=True, timeout=150, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
            subprocess.run(["kill", "-9", pid], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    result = json.loads(done.stdout)
    print(json.dumps(result))
    assert result["intact"] is True, "the transfers during the replays are byte-exact"
    assert result["captured_data"] > 1000 and result["captured_quic"] > 0
    during = result["during"]
    # Every data-plane replay was rejected as a replay (none authenticated as new, none placed).
    assert during.get("rejected_replay") == result["captured_data"], during
    assert set(during) <= {"rejected_replay", "accepted_data", "accepted_control", "opened_phase0",
                           "passed_quic"}, during
    # Each replayed QUIC datagram was handed to aioquic and dropped (duplicate / old keys).
    assert result["quic_during"] == result["captured_quic"], result
    after = result["after"]
    assert after.get("no_session") == result["captured_data"], after
    # After the session a replayed client Initial is a new (never completing) handshake
    # attempt, put to admission; every other QUIC replay is dropped and counted.
    # (An admitted one that then does not decrypt, keyed for the old connection, is also
    # counted as an aioquic drop: counted twice, never missed.)
    assert after["handshake_attempts"] <= result["captured_initials"], after
    assert after.get("quic", 0) <= result["captured_quic"], after
    assert after.get("quic", 0) + after["handshake_attempts"] >= result["captured_quic"], after
