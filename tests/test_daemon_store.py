"""The transfer store stays bounded however many transfers a daemon finishes."""

from __future__ import annotations

from pathlib import Path

from wanxport.daemon.store import Submission, TransferStore


def _finish(store: TransferStore, n: int, start: int = 0) -> list[str]:
    ids = []
    for i in range(start, start + n):
        transfer, new = store.submit(Submission("gw-b", f"/src/{i}", f"f{i}"), key=f"k{i}")
        assert new
        store.update(transfer, state="active")
        store.update(transfer, state="done" if i % 3 else "failed")
        ids.append(transfer.id)
    return ids


def test_only_the_most_recent_finished_transfers_are_kept(tmp_path: Path) -> None:
    store = TransferStore(tmp_path / "transfers.json", keep_finished=5)
    waiting, _ = store.submit(Submission("gw-b", "/src/q", "q"), key="queued")
    ids = _finish(store, 50)
    assert set(store.transfers) == {waiting.id, *ids[-5:]}  # the queued one is never dropped
    assert store.get_by_key("k0") is None and store.get_by_key("k49") is not None
    # A forgotten key makes a new transfer; a kept one still returns its transfer.
    assert store.submit(Submission("gw-b", "/src/0", "f0"), key="k0")[1]
    assert not store.submit(Submission("gw-b", "/src/49", "f49"), key="k49")[1]


def test_the_file_is_pruned_too_and_a_restart_keeps_the_bound(tmp_path: Path) -> None:
    path = tmp_path / "transfers.json"
    _finish(TransferStore(path, keep_finished=1000), 30)
    reopened = TransferStore(path, keep_finished=4)
    assert len(reopened.transfers) == 4
    assert {t.key for t in reopened.transfers.values()} == {"k26", "k27", "k28", "k29"}
    _finish(reopened, 10, start=30)
    assert len(TransferStore(path, keep_finished=4).transfers) == 4
