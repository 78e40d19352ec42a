"""The README's Python API example runs as written and prints what the README says it prints.

A newcomer copies that block first; if the API changes under it, this test fails
instead of the newcomer. The block is run in a child process from a directory
holding the test PKI that ``wanxport certs pki`` would write; only its fixed
ports are swapped for free ones, so concurrent test runs do not collide.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from gateway_helpers import ROOT, env, free_path_ports

from wanxport.control.certs import make_test_pki

pytestmark = pytest.mark.timeout(60)

README = ROOT / "README.md"


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", markdown, flags=re.DOTALL | re.MULTILINE)


def test_readme_has_exactly_one_python_example() -> None:
    blocks = python_blocks(README.read_text())
    assert len(blocks) == 1, "the README's API example is the one ```python block"


def test_readme_api_example_runs_and_prints_what_it_claims(tmp_path: Path) -> None:
    text = README.read_text()
    (block,) = python_blocks(text)
    ports = re.findall(r'"127\.0\.0\.1:(\d+)"', block)
    assert ports, "the example names its loopback paths"
    for old, new in zip(sorted(set(ports)), free_path_ports(len(set(ports))), strict=True):
        block = block.replace(f'"127.0.0.1:{old}"', f'"127.0.0.1:{new}"')
    make_test_pki(tmp_path / "pki", ["gw-a", "gw-b"])
    (tmp_path / "example.py").write_text(block)

    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=env(),
                          capture_output=True, text=True, timeout=50)

    assert done.returncode == 0, done.stderr
    claimed = re.search(r"It prints `([^`]*)`", text)
    assert claimed is not None, "the README says what the example prints"
    assert done.stdout.strip() == claimed.group(1)
