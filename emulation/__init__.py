"""WAN emulation: scenario files -> network namespaces or Mininet, impaired by netem or our engine.

The package root imports nothing heavy on purpose: ``emulation.engine`` and
``emulation.mininet.wan`` also run under the system ``python3`` (Mininet's),
which has no pyroute2. The Python API lives in ``emulation.api``.
"""
