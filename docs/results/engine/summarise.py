"""Summarise an engine A/B directory (docs/results/engine/ab.sh): one row per run.

Usage: python docs/results/engine/summarise.py DIR
"""

from __future__ import annotations

import json
import pathlib
import sys


def main(directory: str) -> None:
    for path in sorted(pathlib.Path(directory).glob("*.json")):
        report = json.loads(path.read_text())
        settings = report.get("settings", {})
        load = settings.get("load_before", [None])[0]
        print(f"{path.stem:24} steady {report.get('steady_step_s')!s:>7} s  "
              f"eff {report.get('efficiency')!s:>7}  engine {settings.get('engine_cpu_s')!s:>5} CPU-s  "
              f"{settings.get('engine_us_per_datagram')!s:>6} us/datagram  load {load}")


if __name__ == "__main__":
    main(sys.argv[1])
