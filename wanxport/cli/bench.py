"""``wanxport bench``: loopback goodput and pacing benchmarks."""

from __future__ import annotations

from typing import Any

from wanxport.bench.cli import add_bench_arguments, bench_main


def register(sub: Any) -> None:
    """``wanxport bench``."""
    p = sub.add_parser("bench", help="loopback goodput and pacing benchmarks (native data path)",
                       description="Loopback benchmarks: a multipath transfer between two processes, "
                                   "or the pacer's precision.")
    add_bench_arguments(p)
    p.set_defaults(func=bench_main)
