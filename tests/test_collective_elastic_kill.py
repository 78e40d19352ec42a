"""An elastic group of three site processes meeting through a TCPStore: one site is
SIGKILLed in the middle of a collective; the other two finish that step with the mean
over the two of them; the killed site is started again and rejoins with the state
bit-identical to theirs."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from collective_helpers import make_pki, mesh_paths, paths_of, site_names
from elastic_helpers import grad

torch_distributed = pytest.importorskip("torch.distributed", reason="the test's store is torch's TCPStore")

pytestmark = pytest.mark.timeout(180)

PEER = str(Path(__file__).with_name("elastic_peer.py"))
N = 3
STALL_AT = 3


class Site:
    def __init__(self, spec: dict) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent),
                                                            os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen([sys.executable, PEER, json.dumps(spec)], stdout=subprocess.PIPE,
                                     text=True, env=env)
        self.lines: list[dict] = []

    def until(self, key: str) -> dict:
        """Lines up to the first with ``key`` (the process ending first fails the test)."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(json.loads(line))
            if os.environ.get("ELASTIC_DEBUG"):
                print(self.proc.pid, line, end="", file=sys.stderr)
            if key in self.lines[-1]:
                return self.lines[-1]
        raise AssertionError(f"the site ended (code {self.proc.wait()}) before saying {key!r}: {self.lines}")

    def steps(self) -> dict[int, dict]:
        return {line["step"]: line for line in self.lines if "step" in line}


@pytest.fixture
def sites() -> Iterator[list[Site]]:
    started: list[Site] = []
    yield started
    for site in started:
        if site.proc.poll() is None:
            site.proc.kill()
        site.proc.wait()


def test_a_site_killed_mid_collective_the_others_go_on_and_it_rejoins_bit_identical(
        tmp_path: Path, sites: list[Site]) -> None:
    pki = make_pki(tmp_path / "pki", N)
    store = torch_distributed.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))
    names, pairs = site_names(N), mesh_paths(N)

    def spec(k: int, **extra: object) -> dict:
        return {"pki": str(pki), "site": k, "names": names, "paths": paths_of(k, N, pairs),
                "store_port": store.port, "until": 6, **extra}

    sites.extend(Site(spec(k, **({"stall_at": STALL_AT} if k == 2 else {}))) for k in range(N))
    assert sites[2].until("stalled") == {"stalled": STALL_AT}  # both others now wait on it mid-call
    os.kill(sites[2].proc.pid, signal.SIGKILL)
    assert sites[2].proc.wait() == -signal.SIGKILL
    restarted = Site(spec(2))
    sites.append(restarted)
    finals = [sites[0].until("final"), sites[1].until("final"), restarted.until("final")]

    two = (grad(0, STALL_AT) + grad(1, STALL_AT)) / np.float32(2)
    for survivor in sites[:2]:
        step = survivor.steps()[STALL_AT]
        assert step["live"] == [0, 1]
        assert step["reduced"] == hashlib.sha256(two.tobytes()).hexdigest()  # the mean over the 2 live
        assert all(survivor.steps()[s]["live"] == [0, 1, 2] for s in range(STALL_AT))
    admitted = finals[2]["admitted_at"]
    assert STALL_AT < admitted and min(restarted.steps()) == admitted  # it took part from its admission on
    assert all(s["live"] == [0, 1, 2] for s in restarted.steps().values())
    assert finals[0]["final"] == finals[1]["final"] == finals[2]["final"] == admitted + 3
    assert finals[0]["digest"] == finals[1]["digest"] == finals[2]["digest"]  # bit-identical state
    for site in (sites[0], sites[1], restarted):
        assert site.proc.wait(timeout=30) == 0
