"""The shipped systemd units: valid, confined (exposure <= 3.0), and a daemon that works that way.

``systemd-analyze verify`` checks that ``ExecStart``'s binary exists and is executable, so
each unit is verified from a copy whose ``/usr/local/bin/wanxport`` is replaced by the
``wanxport`` entry point installed beside this interpreter (the venv's
``bin/wanxport``): the unit as an installed host would have it. The daemon itself is
then run the way the units confine it, as far as a test can without systemd: as
``nobody`` with no capabilities (``setpriv``), and under the kernel's
memory-deny-write-execute (``prctl(PR_SET_MDWE)``, what ``MemoryDenyWriteExecute=``
asks for), moving a file between two such daemons.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_helpers import NotifyListener, make_pki, two_sites
from gateway_helpers import ROOT, env

from wanxport.daemon.client import GatewayClient
from wanxport.daemon.config import load_config

pytestmark = pytest.mark.timeout(120)

UNITS = {"wanxport-gateway.service": "wanxport-gateway.service",
         "wanxport-recv@.service": "wanxport-recv@site-b.service"}  # template -> an instance of it
MAX_EXPOSURE = 3.0
NOBODY = ("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--no-new-privs")
# `python -c MDWE_EXEC COMMAND...` execs COMMAND with the kernel's memory-deny-write-execute
# set; the setting is inherited across execve and fork, so COMMAND and all it runs keep it.
PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1
MDWE_EXEC = ("import ctypes, os, sys; libc = ctypes.CDLL(None, use_errno=True); "
             f"libc.prctl({PR_SET_MDWE}, {PR_MDWE_REFUSE_EXEC_GAIN}, 0, 0, 0) == 0 "
             "or sys.exit(f'PR_SET_MDWE: {os.strerror(ctypes.get_errno())}'); "
             "os.execvp(sys.argv[1], sys.argv[1:])")


def _analyze() -> str:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian package: systemd)")
    return analyze


def _installed_wanxport() -> str:
    wanxport = shutil.which("wanxport", path=str(Path(sys.executable).parent))
    assert wanxport is not None, "the wanxport entry point installed beside this interpreter"
    return wanxport


def _render(directory: Path, template: str, binary: str) -> Path:
    """The shipped unit in ``directory``, ExecStart pointing at ``binary``; returns the path
    to give systemd-analyze (an instance's, for a template: it finds the template beside it)."""
    directory.mkdir(exist_ok=True)
    text = (ROOT / "deploy" / template).read_text()
    assert "/usr/local/bin/wanxport " in text, "the unit runs the installed command"
    (directory / template).write_text(text.replace("/usr/local/bin/wanxport", binary))
    return directory / UNITS[template]


@pytest.mark.parametrize("template", sorted(UNITS))
def test_unit_passes_systemd_analyze_verify(template: str, tmp_path: Path) -> None:
    analyze = _analyze()
    unit = _render(tmp_path / "installed", template, _installed_wanxport())
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout == "" and result.stderr == "", result
    broken = _render(tmp_path / "broken", template, str(tmp_path / "no-such-wanxport"))
    result = subprocess.run([analyze, "verify", str(broken)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "no-such-wanxport" in result.stderr, \
        "verify notices a missing ExecStart binary (so the check can fail)"


def exposure(analyze: str, unit: Path) -> float:
    result = subprocess.run([analyze, "security", "--offline=yes", "--no-pager", str(unit)],
                            capture_output=True, text=True, timeout=60, cwd=unit.parent)
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d)", result.stdout)
    assert found, result
    return float(found.group(1))


@pytest.mark.parametrize("template", sorted(UNITS))
def test_unit_exposure_is_at_most_3(template: str, tmp_path: Path) -> None:
    analyze = _analyze()
    unit = _render(tmp_path / "installed", template, _installed_wanxport())
    score = exposure(analyze, unit)
    assert score <= MAX_EXPOSURE, f"{template}: systemd-analyze security rates it {score}"
    # The same unit without its [Service] confinement rates far worse: the parse reads the figure.
    bare = tmp_path / "bare"
    bare.mkdir()
    text = unit.with_name(template).read_text()
    service = re.search(r"^ExecStart=.*$", text, re.MULTILINE)
    assert service is not None
    (bare / template).write_text(f"[Unit]\nDescription=bare\n[Service]\n{service.group(0)}\n")
    assert exposure(analyze, bare / UNITS[template]) > 9.0


def test_sysusers_file_creates_the_user_and_group(tmp_path: Path) -> None:
    sysusers = shutil.which("systemd-sysusers")
    if sysusers is None:
        pytest.skip("systemd-sysusers is not installed (Debian package: systemd)")
    result = subprocess.run([sysusers, "--dry-run", f"--root={tmp_path}",
                             str(ROOT / "deploy" / "wanxport.sysusers")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result
    said = result.stdout + result.stderr
    assert "Creating group 'wanxport'" in said and "Creating user 'wanxport'" in said, said


# -- the daemon, confined --------------------------------------------------------


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A directory of the test's own, searchable (o+x, not readable) by other users, so a
    daemon running as nobody can reach the directories it is given. Not under pytest's base
    temporary directory: pytest keeps that 0700, and a pytest started meanwhile by anyone
    else on the host resets it."""
    directory = Path(tempfile.mkdtemp(prefix="wanxport-units-", dir="/tmp"))
    directory.chmod(0o711)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _owned_by_nobody(path: Path, mode: int) -> None:
    nobody = (_id("-u"), _id("-g"))
    path.mkdir(exist_ok=True)
    os.chown(path, *nobody)
    path.chmod(mode)


def _id(flag: str) -> int:
    return int(subprocess.run(["id", flag, "nobody"], capture_output=True, text=True, check=True).stdout)


def _mdwe_supported() -> bool:
    probe = subprocess.run([sys.executable, "-c", MDWE_EXEC, sys.executable, "-c", "import mmap; mmap.mmap("
                            "-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)"],
                           capture_output=True, text=True, timeout=30)
    if "PR_SET_MDWE" in probe.stderr:
        return False
    # The check can fail: under it, a W+X mapping is refused (and so the daemon's would be).
    assert probe.returncode != 0 and "PermissionError" in probe.stderr, probe
    return True


def _start_confined(config: Path, notify: NotifyListener, mdwe: bool) -> subprocess.Popen[str]:
    """``wanxport gateway -v CONFIG`` as nobody (no capabilities, no new privileges)."""
    outer = [sys.executable, "-c", MDWE_EXEC] if mdwe else []
    with open(config.with_suffix(".log"), "a") as log:
        command = [*outer, *NOBODY, sys.executable, "-m", "wanxport", "gateway", "-v", str(config)]
        return subprocess.Popen(command,
                                stdout=subprocess.DEVNULL, stderr=log, text=True,
                                env={**env(), "NOTIFY_SOCKET": str(notify.path)})


def _ready(proc: subprocess.Popen[str], notify: NotifyListener) -> bool:
    """READY=1 came (True), or the process exited first (False)."""
    while proc.poll() is None:
        try:
            if notify.next(timeout=0.5).get("READY") == "1":
                return True
        except TimeoutError:
            continue
    return False


def _uids(pid: int) -> list[int]:
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"^Uid:\s+(.*)$", status, re.MULTILINE)
    assert found
    return [int(v) for v in found.group(1).split()]


def _caps(pid: int) -> str:
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"^CapEff:\s+(\S+)$", status, re.MULTILINE)
    assert found
    return found.group(1)


def test_two_daemons_as_nobody_without_write_execute_memory_move_a_file(reachable: Path) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (util-linux) to start the daemon as nobody")
    tmp_path = reachable
    mdwe = _mdwe_supported()
    pki = make_pki(tmp_path / "pki")
    for key in pki.glob("*.key"):  # as the unit's install says: the keys readable by its group
        os.chown(key, 0, _id("-g"))
        key.chmod(0o640)
    a_cfg, b_cfg = two_sites(tmp_path, pki)
    a, b = load_config(a_cfg), load_config(b_cfg)
    for data_dir in (a.data_dir, b.data_dir):
        _owned_by_nobody(data_dir, 0o750)  # what StateDirectory= gives it; nothing else is writable
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(3 << 20))
    src.chmod(0o644)
    notes = {name: NotifyListener(tmp_path / f"{name}-notify.sock") for name in "ab"}
    for listener in notes.values():
        listener.path.chmod(0o666)  # systemd's notify socket accepts the service's user too
    configs = {"a": a_cfg, "b": b_cfg}
    procs = {name: _start_confined(config, notes[name], mdwe) for name, config in configs.items()}
    try:
        for name, proc in procs.items():
            ready = _ready(proc, notes[name])
            assert ready, configs[name].with_suffix(".log").read_text()[-3000:]
            assert _uids(proc.pid) == [_id("-u")] * 4 and _caps(proc.pid) == "0000000000000000"
        client = GatewayClient(str(a.api_socket))
        assert client.status()["site"] == "gw-a"
        done = client.wait(client.submit("gw-b", str(src))["id"], timeout_s=60)
        assert done["state"] == "done", done
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(30) for proc in procs.values()]
        for listener in notes.values():
            listener.close()
    assert codes == [0, 0], [c.with_suffix(".log").read_text()[-2000:] for c in (a_cfg, b_cfg)]
    received = b.received_dir / "gw-a" / "src.bin"
    assert received.read_bytes() == src.read_bytes()
    assert received.stat().st_uid == _id("-u") and (a.data_dir / "lock").stat().st_uid == _id("-u")
    if not mdwe:
        pytest.skip("ran as nobody; this kernel has no PR_SET_MDWE (Linux >= 6.3), so W+X was not tested")
