"""The transfer store stays bounded in memory however many transfers a daemon finishes,
while finished transfers stay findable (by id and by key) from the on-disk archive."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from wanxport.daemon.durable import read_state
from wanxport.daemon.finished import FinishedArchive
from wanxport.daemon.store import Submission, TransferStore


def _finish(store: TransferStore, n: int, start: int = 0) -> list[str]:
    ids = []
    for i in range(start, start + n):
        transfer, new = store.record_submission(Submission("gw-b", f"/src/{i}", f"f{i}"), key=f"k{i}")
        assert new
        store.update(transfer, state="active")
        store.update(transfer, state="done" if i % 3 else "failed")
        ids.append(transfer.id)
    return ids


def test_memory_keeps_the_most_recent_finished_and_the_archive_the_rest(tmp_path: Path) -> None:
    store = TransferStore(tmp_path / "transfers.json", keep_finished=5)
    waiting, _ = store.record_submission(Submission("gw-b", "/src/q", "q"), key="queued")
    ids = _finish(store, 50)
    assert set(store.transfers) == {waiting.id, *ids[-5:]}  # the queued one is never dropped
    assert len(store._by_key) == 6 and len(store._finished) == 5
    old = store.get(ids[0])
    assert old is not None and (old.key, old.state, old.submission.source) == ("k0", "failed", "/src/0")
    assert store.get_by_key("k1") is not None and store.get_by_key("k1").id == ids[1]  # type: ignore[union-attr]
    # An old key still returns its transfer (no second transfer); another submission conflicts.
    assert not store.record_submission(Submission("gw-b", "/src/0", "f0"), key="k0")[1]
    assert store.get("../transfers") is None and store.get("0" * 16) is None
    # transfers.json holds only what is unfinished: its size does not grow with history.
    assert [t["id"] for t in read_state(tmp_path / "transfers.json")] == [waiting.id]


def test_a_restart_finds_finished_transfers_on_disk_and_keeps_none_in_memory(tmp_path: Path) -> None:
    path = tmp_path / "transfers.json"
    ids = _finish(TransferStore(path), 30)
    queued, _ = TransferStore(path).record_submission(Submission("gw-b", "/src/q", "q"), key="q")
    reopened = TransferStore(path, keep_finished=4)
    assert set(reopened.transfers) == {queued.id}
    assert reopened.get(ids[7]) is not None and reopened.get_by_key("k29").id == ids[29]  # type: ignore[union-attr]


def test_finished_records_left_in_the_queue_file_by_a_crash_move_to_the_archive(tmp_path: Path) -> None:
    path = tmp_path / "transfers.json"
    store = TransferStore(path)
    transfer, _ = store.record_submission(Submission("gw-b", "/src/x", "x"), key="x")
    from wanxport.daemon.durable import write_state
    write_state(path, [{**transfer.to_json(), "state": "done"}])  # killed between the two writes
    reopened = TransferStore(path)
    assert reopened.transfers == {} and read_state(path) == []
    assert reopened.get(transfer.id).state == "done"  # type: ignore[union-attr]


def test_the_archive_removes_records_past_retention_or_beyond_its_bound(tmp_path: Path) -> None:
    archive = FinishedArchive(tmp_path / "finished", retention_s=3600, max_records=10)
    store = TransferStore(tmp_path / "transfers.json", keep_finished=2, archive=archive)
    ids = _finish(store, 15)
    base = time.time() - 60  # file times are coarse (a few ms): order them explicitly
    for k, transfer_id in enumerate(ids):
        os.utime(archive.directory / f"{transfer_id}.json", (base + k, base + k))
    assert archive.sweep() == 5  # the 5 oldest beyond the bound of 10
    assert archive.get(ids[4]) is None and archive.get(ids[5]) is not None
    assert archive.get_by_key("k4") is None and archive.get_by_key("k5") is not None
    past = time.time() - 7200
    for transfer_id in ids[5:8]:
        os.utime(archive.directory / f"{transfer_id}.json", (past, past))
    assert archive.sweep() == 3
    assert store.get(ids[7]) is None and store.get(ids[8]) is not None
    assert len(list(archive.keys.iterdir())) == 7


def test_a_sweep_holds_no_list_of_the_archive(tmp_path: Path) -> None:
    """The archive holds up to a week of records: a sweep that listed them all had a
    memory peak growing with it (the daemon's resident memory rose sweep by sweep).

    Measured in a fresh interpreter: tracemalloc's peak counts every thread's
    allocations, and threads other tests left running would be counted here."""
    directory = tmp_path / "finished"
    directory.mkdir()
    for k in range(3000):  # plain files: the sweep only looks at names and times here
        (directory / f"{k:016x}.json").write_text("{}")
    probe = (
        "import sys, tracemalloc\n"
        "from pathlib import Path\n"
        "from wanxport.daemon.finished import FinishedArchive\n"
        "archive = FinishedArchive(Path(sys.argv[1]), retention_s=3600, max_records=10_000)\n"
        "tracemalloc.start()\n"
        "removed = archive.sweep()\n"
        "print(removed, tracemalloc.get_traced_memory()[1])\n")
    out = subprocess.run([sys.executable, "-c", probe, str(directory)], check=True,
                         capture_output=True, text=True).stdout.split()
    removed, peak = int(out[0]), int(out[1])
    assert removed == 0
    assert peak < 64 * 1024, f"a sweep of 3000 records peaked at {peak} bytes"
