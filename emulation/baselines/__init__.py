"""Baseline transports for side-by-side experiments (issue #6).

Each baseline is a pair of small programs run inside the gateway namespaces:
a receiver in ``b`` that counts and hashes what arrives, and a sender in ``a``
that generates the payload from a seed (``payload``) and writes it. They talk
to the runner (``emulation.run``) with one JSON line per event on stdout, so
the runner never shares memory or sockets with them.
"""
