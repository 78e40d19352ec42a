"""The gateway daemon: ``wanxport gateway CONFIG.toml`` (docs/operations.md)."""
