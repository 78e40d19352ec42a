"""``wanxport bench``: loopback transfer, pacing precision and the iperf3 baseline."""

from wanxport.bench.cli import add_bench_arguments, bench_main

__all__ = ["add_bench_arguments", "bench_main"]
