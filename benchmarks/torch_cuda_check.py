"""The one prepared check of wanxport.torch on a host with an NVIDIA GPU.

    python benchmarks/torch_cuda_check.py --out DIR [--device cuda|cpu]

Run from a checkout whose C extensions are built (``python setup.py build_ext --inplace``)
and whose runtime dependencies import (the first step records whether they do). In
order, each step bounded by a timeout and its output kept under ``DIR``:

1. versions: python, torch, CUDA, the GPU's name (``versions.json``);
2. the CUDA tests: every op of the backend on GPU tensors against gloo
   (tests/test_torch_cuda.py), the staging test on a real GPU
   (tests/test_torch_config.py) and the staging order with a stand-in device
   (tests/test_torch_staging.py), ``pytest -rs`` so skips say why (``pytest.txt``);
3. examples/hsdp_two_sites.py with one rank per site, both sites on GPU 0, against
   gloo HSDP (``hsdp.json``).

``--device cpu`` rehearses the same steps where no GPU is (the CUDA tests then skip with
their reason and the example runs on the CPU). ``summary.json`` holds every step's exit
code and seconds; the exit code is 0 only when every step passed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

VERSIONS = """
import json, platform, torch
cuda = torch.cuda.is_available()
print(json.dumps({"python": platform.python_version(), "torch": torch.__version__,
                  "cuda": torch.version.cuda, "cuda_available": cuda,
                  "gpu": torch.cuda.get_device_name(0) if cuda else None}))
import wanxport.torch  # the project's runtime dependencies import
"""


def step(name: str, command: list[str], out: Path, timeout: float) -> dict[str, object]:
    """Run one step; its output to ``out/<name>.txt``; its verdict."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        code, text = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        code, text = None, f"timed out after {timeout:g} s\n{exc.stdout or ''}{exc.stderr or ''}"
    (out / f"{name}.txt").write_text(text if isinstance(text, str) else str(text))
    return {"step": name, "exit_code": code, "seconds": round(time.monotonic() - started, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    python = sys.executable
    steps = [step("versions", [python, "-c", VERSIONS], args.out, 120)]
    versions = (args.out / "versions.txt").read_text().splitlines()
    if versions and versions[0].startswith("{"):
        (args.out / "versions.json").write_text(versions[0] + "\n")
    steps.append(step("pytest", [python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                                 "tests/test_torch_cuda.py", "tests/test_torch_config.py",
                                 "tests/test_torch_staging.py"], args.out, 420))
    steps.append(step("hsdp", [python, "examples/hsdp_two_sites.py", "--device", args.device,
                               "--ranks-per-site", "1", "--steps", "3",
                               "--json", str(args.out / "hsdp.json")],
                      args.out, 300))
    summary = {"device": args.device, "steps": steps, "passed": all(s["exit_code"] == 0 for s in steps)}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
