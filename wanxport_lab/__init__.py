"""Measuring instruments for wanxport's benchmarks: the lab side, not the transport.

A gateway host installs ``wanxport`` (the transport and what it needs at run time);
``wanxport[emulation]`` adds the lab: this package (the C limits a bench run is
compared with, the aioquic baseline, the control channel's loopback check) and
``emulation`` (namespaces, the link-impairment engine, the baselines, the plots).
Nothing in ``wanxport`` imports this package except ``wanxport bench``, which says
in one line what it skips when the lab side is absent.
"""
