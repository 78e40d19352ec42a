"""An operator's sending rate cap per path: a ceiling on the pacer, whatever the controller says.

A gateway's reload lowers or lifts its caps on a running session (``Session.set_rate_caps``)
instead of setting up a new one.
"""

from __future__ import annotations

from collections.abc import Sequence

from wanxport.core.paths import Path


def apply_rate_caps(paths: Sequence[Path], caps_bps: tuple[float | None, ...]) -> None:
    """Each path's cap (bits/s, in path order; None or a missing entry: none)."""
    for index, path in enumerate(paths):
        cap = caps_bps[index] if index < len(caps_bps) else None
        if cap is not None and not cap > 0:
            raise ValueError(f"path {path.name!r}: a rate cap must be > 0 bits/s (or None), got {cap!r}")
        path.max_rate_bps = float("inf") if cap is None else float(cap)


def rate_caps(paths: Sequence[Path]) -> tuple[float | None, ...]:
    """Each path's cap in force (None: uncapped), in path order."""
    return tuple(None if p.max_rate_bps == float("inf") else p.max_rate_bps for p in paths)
