"""A regular (non-editable) ``pip install .``: ``wanxport bench`` run inside a checkout works.

Why: the bench's receiver child once ran ``python -m wanxport.bench.transfer``
with the checkout as working directory, so it imported the source tree (which has no
built C extensions) instead of the installed package, and the transfer failed with
"native data path unavailable". This builds the wheel from a copy of the sources
(no ``.so`` in it, like a fresh clone), installs it into a new virtualenv and runs
the bench from inside that copy.

The wheel is built without mypyc (compiling is ``./dev test``'s compiled run's
business, and takes minutes) and without build isolation; the new virtualenv sees
the test environment's packages for the runtime dependencies through a ``.pth``
line, so nothing is downloaded. That line adds a plain directory: the editable
install's own ``.pth`` hook in it is not run, so the only wanxport the new
environment can import is the installed one.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("wanxport", "emulation", "ext", "setup.py", "pyproject.toml", "README.md")
IGNORED = shutil.ignore_patterns("*.so", "__pycache__", "*.egg-info", "build")


def make_checkout(where: Path) -> Path:
    where.mkdir()
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, where / name, ignore=IGNORED)
        else:
            shutil.copy2(source, where / name)
    return where


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["WANXPORT_MYPYC"] = "0"
    return env


def regular_install(checkout: Path, tmp_path: Path) -> Path:
    """A new virtualenv with wanxport installed from a wheel of ``checkout``; its bin/ directory."""
    env = clean_env()
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(checkout)], check=True, env=env, cwd=tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, env=env)
    python = venv / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    venv_site = subprocess.run([str(python), "-c", purelib],
                               check=True, capture_output=True, text=True, env=env).stdout.strip()
    (Path(venv_site) / "test-dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    "--no-index", *map(str, wheels.glob("*.whl"))], check=True, env=env)
    return venv / "bin"


@pytest.mark.slow
def test_bench_inside_a_checkout_uses_the_installed_package(tmp_path: Path) -> None:
    checkout = make_checkout(tmp_path / "checkout")
    bin_dir = regular_install(checkout, tmp_path)
    env = clean_env()
    where = subprocess.run([str(bin_dir / "python"), "-c", "import wanxport; print(wanxport.__file__)"],
                           cwd=tmp_path, check=True, capture_output=True, text=True, env=env).stdout
    assert where.startswith(str(tmp_path / "venv")), f"the new environment imports {where}"
    bench = subprocess.run([str(bin_dir / "wanxport"), "bench", "--paths", "2", "--size", "4MiB", "--json"],
                           cwd=checkout, capture_output=True, text=True, env=env, timeout=120)
    assert bench.returncode == 0, bench.stderr
    report = json.loads(bench.stdout)
    assert report["intact"] is True and report["datapath"] == "native"
    assert report["payload_bytes"] == 4 << 20
