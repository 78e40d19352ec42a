"""How many transfers ended, and how, since the daemon started: a counter for alerts.

``wanxport_transfers{state=...}`` is a gauge of what the store holds in memory, and the
store drops finished transfers from memory at a restart (and beyond the newest 100):
an alert on that gauge falling or rising read a restart (1 -> 0 failed) as an event.
A counter of transitions into a final state reads a restart as what Prometheus calls a
reset, so ``increase()`` over it counts only transfers that really ended in the window.

The store is wrapped, not changed: ``CountingStore.update`` is the store's one way to
change a transfer's state, so counting there sees every transition exactly once.
"""

from __future__ import annotations

from typing import Any

from .store import FINAL, Transfer, TransferStore


class CountingStore(TransferStore):
    """A ``TransferStore`` that counts transfers entering each final state (``ended``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.ended = dict.fromkeys(FINAL, 0)
        super().__init__(*args, **kwargs)

    def update(self, transfer: Transfer, **changes: Any) -> Transfer:
        before = transfer.state
        updated = super().update(transfer, **changes)
        if before not in FINAL and updated.state in FINAL:
            self.ended[updated.state] += 1
        return updated
