"""Liveness apart from op timeouts: a site killed or cut off is named at every other site
within the liveness bound (3 s here), long before the op timeout (60 s); joining names a
site that never arrives, and a refused certificate says whose, at once, at both sites."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from collective_helpers import make_pki, mesh_paths, paths_of, site_names
from gateway_helpers import loopback_netns

from wanxport.collective import LIVENESS_MIN_S, CollectiveError, GroupState, join
from wanxport.control.certs import make_test_pki

pytestmark = pytest.mark.timeout(120)

OP_TIMEOUT_S = 60.0  # far beyond the liveness bound: an error before it is liveness's
PEER = str(Path(__file__).with_name("collective_peer.py"))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"), 3)


async def test_a_killed_site_fails_every_pending_call_on_its_groups_naming_it(pki: Path) -> None:
    """Sites 0 and 2 here, site 1 in a process that is SIGKILLed while both wait on it."""
    names, pairs = site_names(3), mesh_paths(3)
    spec = {"pki": str(pki), "site": 1, "names": names, "paths": paths_of(1, 3, pairs)}
    peer = subprocess.Popen([sys.executable, PEER, json.dumps(spec)], stdout=subprocess.PIPE, text=True)
    groups = []
    try:
        groups = list(await asyncio.gather(*(
            join(k, names, identity=pki / names[k], ca=pki / "ca.pem", paths=paths_of(k, 3, pairs),
                 timeout=OP_TIMEOUT_S, join_timeout=30.0) for k in (0, 2))))
        await asyncio.gather(*(g.all_reduce(np.ones(1000, np.float32)) for g in groups))
        assert await asyncio.to_thread(peer.stdout.readline) == "joined\n"
        survivors = [g.new_group([0, 2]) for g in groups]
        pending = [asyncio.ensure_future(g.all_reduce(np.ones(10, np.float32))) for g in groups]
        os.kill(peer.pid, signal.SIGKILL)
        started = time.monotonic()
        errors = await asyncio.gather(*pending, return_exceptions=True)
        elapsed = time.monotonic() - started
        for error in errors:
            assert isinstance(error, CollectiveError) and error.site == "site-1", errors
            assert "site site-1 (rank 1)" in str(error) and "last heard on path" in str(error), str(error)
        assert elapsed < OP_TIMEOUT_S / 2, elapsed  # liveness, not the op timeout
        assert all(g.state is GroupState.MEMBER_GONE for g in groups)
        with pytest.raises(CollectiveError, match="site-1"):
            await groups[0].barrier()  # later calls fail at once, naming it
        both = [np.full(3, 1.0) for _ in survivors]  # a group without it goes on
        await asyncio.gather(*(s.all_reduce(b) for s, b in zip(survivors, both, strict=True)))
        assert all(b.tolist() == [2.0] * 3 for b in both)
    finally:
        if peer.poll() is None:
            peer.kill()
        peer.wait()
        await asyncio.gather(*(g.close(drain_s=0.0) for g in groups))


@pytest.fixture
def netns() -> Iterator[str]:
    with loopback_netns("wxcl") as name:
        yield name


@pytest.mark.netns
def test_a_site_cut_off_by_a_blackhole_is_named_at_the_other_within_the_bound(pki: Path, netns: str) -> None:
    """Both sites in a namespace, each waiting on a receive from the other; then every
    datagram of their paths is dropped (nftables): each names the other within the bound."""
    names = site_names(2)
    ports = [47311, 47312]
    paths = [f"127.0.0.1:{p}" for p in ports]
    procs = []
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here.parent), str(here)])}
    try:
        for k in range(2):
            spec = {"pki": str(pki), "site": k, "names": names, "paths": paths, "then": "recv",
                    "timeout": OP_TIMEOUT_S}
            command = ["ip", "netns", "exec", netns, sys.executable, PEER, json.dumps(spec)]
            procs.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env))
        for proc in procs:
            assert proc.stdout.readline() == "joined\n"
            assert proc.stdout.readline() == "pending\n"
        ports_set = ", ".join(map(str, ports))
        rules = (f"table inet wxcl {{\n chain out {{\n  type filter hook output priority 0;\n"
                 f"  udp dport {{ {ports_set} }} drop\n  udp sport {{ {ports_set} }} drop\n }}\n}}\n")
        subprocess.run(["ip", "netns", "exec", netns, "nft", "-f", "-"], input=rules, text=True, check=True)
        started = time.monotonic()
        results = [json.loads(proc.stdout.readline()) for proc in procs]
        elapsed = time.monotonic() - started
        for k, result in enumerate(results):
            other = names[1 - k]
            assert result["site"] == other and "dead or cut off" in result["error"], result
            assert f"site {other} (rank {1 - k})" in result["error"], result
            assert "last heard on path" in result["error"], result
            # It went on queueing heartbeats and probes, each refused by this host's firewall (the
            # drop is in the output hook): not a stalled sender, and the count says where they went.
            counts = re.search(r"queued it (\d+) packets, its sockets sent (\d+) datagrams and had (\d+) "
                               r"refused", result["error"])
            assert counts is not None, result
            queued, _, refused = map(int, counts.groups())
            assert queued > 0 and refused > 0, result
            assert result["elapsed_s"] < OP_TIMEOUT_S / 2, result
        assert elapsed < OP_TIMEOUT_S / 2, elapsed
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


async def test_a_site_that_never_arrives_is_named_at_every_site(pki: Path) -> None:
    names, pairs = site_names(3), mesh_paths(3)
    results = await asyncio.gather(*(
        join(k, names, identity=pki / names[k], ca=pki / "ca.pem", paths=paths_of(k, 3, pairs),
             join_timeout=2.0) for k in (0, 1)), return_exceptions=True)
    for result in results:
        assert isinstance(result, CollectiveError) and result.site == "site-2", results
        assert "site site-2 never arrived" in str(result)


@pytest.mark.parametrize("refused", [0, 1])
async def test_a_refused_certificate_is_named_at_once_by_both_sites(tmp_path: Path, refused: int) -> None:
    """Site ``refused`` holds a certificate of another CA: it says its own was refused, the
    other says the peer's was, both at once (well within the join timeout)."""
    names = site_names(2)
    make_test_pki(tmp_path / "group", names)
    make_test_pki(tmp_path / "stranger", names)
    paths = mesh_paths(2)[(0, 1)]
    started = time.monotonic()
    results = await asyncio.gather(*(
        join(k, names, identity=tmp_path / ("stranger" if k == refused else "group") / names[k],
             ca=tmp_path / "group" / "ca.pem", paths=paths, join_timeout=30.0) for k in range(2)),
        return_exceptions=True)
    assert time.monotonic() - started < 15.0
    mine, theirs = results[refused], results[1 - refused]
    assert isinstance(mine, CollectiveError) and "this site's own certificate or CA was refused" in str(mine)
    assert isinstance(theirs, CollectiveError), results
    assert f"site {names[refused]}'s certificate is refused" in str(theirs), results
    assert LIVENESS_MIN_S == 3.0
