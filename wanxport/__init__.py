"""wanxport: a multipath WAN transport for moving training shards between datacenters."""

__version__ = "0.1.0"
