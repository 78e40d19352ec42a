"""The transport a gateway host installs runs without the lab side's dependencies.

``pip install wanxport`` carries numpy, cryptography, aioquic and the rest of what
the transport needs; matplotlib and pyroute2 come with ``wanxport[emulation]``.
A fresh interpreter whose import system refuses those modules (and the lab's own
packages) must still import the API, the daemon and the CLI, and ``wanxport bench``
must say in one line which baselines it skips.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAB_DEPENDENCIES = ("matplotlib", "pyroute2")

# Installed first in the child: any import of a refused top-level module fails as if absent.
BLOCKER = """
import sys
REFUSED = {refused!r}
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in REFUSED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (refused)", name=name)
        return None
sys.meta_path.insert(0, Refuse())
"""


def _run_without(refused: tuple[str, ...], body: str, *args: str) -> subprocess.CompletedProcess[str]:
    code = BLOCKER.format(refused=set(refused)) + body
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)


def test_the_transport_imports_without_the_lab_dependencies_or_packages() -> None:
    body = """
import wanxport.api, wanxport.daemon.service, wanxport.cli, wanxport.gateway, wanxport.collective
import wanxport.bench.cli
loaded = sorted(m for m in sys.modules if m.split(".")[0] in REFUSED)
print("loaded:", loaded)
"""
    done = _run_without((*LAB_DEPENDENCIES, "emulation", "wanxport_lab"), body)
    assert done.returncode == 0, done.stderr
    assert "loaded: []" in done.stdout


def test_the_lab_dependencies_are_an_extra_not_a_requirement() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    required = {dep.split(">")[0].split("=")[0].split(";")[0].strip() for dep in project["dependencies"]}
    assert not required & set(LAB_DEPENDENCIES)
    extra = {dep.split(">")[0].strip() for dep in project["optional-dependencies"]["emulation"]}
    assert set(LAB_DEPENDENCIES) <= extra


def test_bench_without_the_lab_skips_its_baselines_in_one_line() -> None:
    body = """
from wanxport.bench.cli import main_for_scripts as main
sys.exit(main(["--paths", "1", "--size", "1MiB", "--baseline", "aead", "--baseline", "raw-udp", "--json"]))
"""
    done = _run_without(("wanxport_lab",), body)
    assert done.returncode == 0, done.stderr
    skipped = [line for line in done.stderr.splitlines() if "skipping" in line]
    assert skipped == ["wanxport bench: skipping --baseline raw-udp, aead: "
                       "install the lab side: pip install 'wanxport[emulation]'"]
    assert '"limits"' not in done.stdout


def test_bench_refuses_the_aioquic_baseline_without_the_lab_in_one_line() -> None:
    body = """
from wanxport.bench.cli import main_for_scripts as main
sys.exit(main(["--transport", "aioquic", "--paths", "1", "--size", "1MiB"]))
"""
    done = _run_without(("wanxport_lab",), body)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith(
        "--transport aioquic is a lab baseline (install the lab side: pip install 'wanxport[emulation]')")
