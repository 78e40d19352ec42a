"""torchrun, the three ways of docs/notes/torch.md's recipe: examples/torchrun_sites.py on loopback.

Two "sites" on this machine, each launched by its own ``python -m torch.distributed.run``
with one config per site (``WANXPORT_TORCH_CONFIG``, relative names), the ranks'
ports derived from ``LOCAL_RANK``: the world of sites (``init_process_group("wanxport")``
through torchrun's env://), the global world (a 2-D DeviceMesh with a wanxport
replicate dimension under FSDP2, and DDP on a wanxport group equal to DDP on a gloo
group), and a world per site with the DDP hook between them.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="wanxport.torch needs the torch extra (pip install 'wanxport[torch]')")

from gateway_helpers import free_path_ports  # noqa: E402

from wanxport.control.certs import make_test_pki  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "torchrun_sites.py"
pytestmark = [pytest.mark.timeout(400), pytest.mark.slow]


def _tcp_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    for sock in socks:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in socks]
    for sock in socks:
        sock.close()
    return ports


def _configs(tmp_path: Path) -> list[Path]:
    """site-0.toml and site-1.toml beside their PKI, each path's port block far from the other's."""
    make_test_pki(tmp_path / "pki", ["site-0", "site-1"])
    first = free_path_ports(2 * 64)[0]
    files = []
    for site in range(2):
        file = tmp_path / f"site-{site}.toml"
        file.write_text(f'identity = "pki/site-{site}"\nca = "pki/ca.pem"\n'
                        f'paths = ["127.0.0.1:{first + 64 * site}"]\n')
        files.append(file)
    return files


def _run_sites(commands: list[list[str]], configs: list[Path], out: Path) -> None:
    procs = []
    for command, config in zip(commands, configs, strict=True):
        env = {**os.environ, "WANXPORT_TORCH_CONFIG": str(config), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *command],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=300)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    codes = [p.returncode for p in procs]
    assert codes == [0, 0], "\n----\n".join(o[-3000:] for o in outputs)


def _results(out: Path, mode: str) -> list[dict[str, object]]:
    return [json.loads(f.read_text()) for f in sorted(out.glob(f"{mode}-*.json"))]


def test_world_of_sites_under_torchrun(tmp_path: Path) -> None:
    configs, (master,) = _configs(tmp_path), _tcp_ports(1)
    commands = [["--nnodes", "2", "--node-rank", str(s), "--nproc-per-node", "1", "--master-addr",
                 "127.0.0.1", "--master-port", str(master), str(SCRIPT), "sites", "--out", str(tmp_path)]
                for s in range(2)]
    _run_sites(commands, configs, tmp_path)
    results = _results(tmp_path, "sites")
    assert [(r["backend"], r["rank"], r["size"]) for r in results] == [("wanxport", 0, 2),
                                                                       ("wanxport", 1, 2)]
    assert all(r["sum"] == [3.0] * 3 and r["received"] == [0.0, 1.0, 2.0, 3.0, 4.0] for r in results)


def test_global_world_mesh_fsdp2_and_ddp_on_a_wanxport_group_under_torchrun(tmp_path: Path) -> None:
    configs, (master,) = _configs(tmp_path), _tcp_ports(1)
    commands = [["--nnodes", "2", "--node-rank", str(s), "--nproc-per-node", "2", "--master-addr",
                 "127.0.0.1", "--master-port", str(master), str(SCRIPT), "mesh", "--out", str(tmp_path)]
                for s in range(2)]
    _run_sites(commands, configs, tmp_path)
    results = _results(tmp_path, "mesh")
    assert len(results) == 4
    for r in results:
        backends = (r["replicate_backend"], r["shard_backend"], r["ddp_backend"])
        assert backends == ("wanxport", "gloo", "wanxport")
        assert r["fsdp_shards_equal_across_sites"] is True and r["ddp_wanxport_equals_ddp_gloo"] is True


def test_a_world_per_site_and_the_ddp_hook_under_torchrun(tmp_path: Path) -> None:
    configs, (first, second, store) = _configs(tmp_path), _tcp_ports(3)
    commands = [["--nnodes", "1", "--nproc-per-node", "2", "--master-port", str(port), str(SCRIPT), "hook",
                 "--site", str(s), "--sites", "2", "--store", f"127.0.0.1:{store}", "--out", str(tmp_path)]
                for s, port in enumerate((first, second))]
    _run_sites(commands, configs, tmp_path)
    results = _results(tmp_path, "hook")
    assert len(results) == 4 and all(r["params_equal_across_sites"] is True for r in results)
