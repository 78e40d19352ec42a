"""The counter behind WanxportTransfersFailing: each transfer counted once, when it ends,
and a restart starts it over (a reset to Prometheus) instead of changing a gauge."""

from __future__ import annotations

from pathlib import Path

from wanxport.daemon.outcomes import CountingStore
from wanxport.daemon.store import Submission


def test_each_transfer_is_counted_once_when_it_ends(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "transfers.json")
    done, failed, cancelled, running = (
        store.record_submission(Submission("gw-b", f"/src/{i}", f"f{i}"), None)[0] for i in range(4))
    store.update(done, state="active")
    store.update(done, state="done")
    store.update(failed, state="active")
    store.update(failed, state="failed", reason="the peer refused it")
    store.update(failed, reason="a later note on a failed transfer")  # still failed: not again
    store.update(cancelled, state="cancelled")
    store.update(running, state="active")
    store.update(running, state="queued", reason="session lost, will retry")
    assert store.ended == {"done": 1, "failed": 1, "cancelled": 1}


def test_a_restart_starts_the_counter_over(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "transfers.json")
    transfer, _ = store.record_submission(Submission("gw-b", "/src/a", "a"), None)
    store.update(transfer, state="failed", reason="no")
    again = CountingStore(tmp_path / "transfers.json")
    assert again.ended == {"done": 0, "failed": 0, "cancelled": 0}
    assert again.get(transfer.id) is not None and again.get(transfer.id).state == "failed"  # type: ignore[union-attr]
