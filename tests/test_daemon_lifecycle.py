"""The transfer lifecycle table (``daemon/lifecycle.py``) and the history a listing shows."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from wanxport.daemon.durable import read_state, write_state
from wanxport.daemon.lifecycle import (
    FINAL,
    TRANSITIONS,
    IllegalTransition,
    TransferEvent,
    TransferState,
    next_state,
)
from wanxport.daemon.store import Submission, TransferStore

S, E = TransferState, TransferEvent


def test_every_pair_is_in_the_table_or_illegal() -> None:
    legal = 0
    for state, event in itertools.product([None, *S], E):
        if (state, event) in TRANSITIONS:
            assert next_state(state, event) == TRANSITIONS[(state, event)]
            legal += 1
        else:
            with pytest.raises(IllegalTransition, match=f"event '{event.value}'"):
                next_state(state, event)
    assert legal == len(TRANSITIONS) == 35


def test_the_table_says_what_each_state_can_do() -> None:
    assert next_state(None, E.SUBMIT) is S.QUEUED
    assert [key for key in TRANSITIONS if key[0] is None] == [(None, E.SUBMIT)], "a new transfer is queued"
    for state in FINAL:  # history: nothing moves a finished transfer
        assert not [event for event in E if (state, event) in TRANSITIONS]
    reachable = {S.QUEUED}
    while True:  # every state is reachable from a submission, and each can end
        more = {dst for (src, _), dst in TRANSITIONS.items() if src in reachable} - reachable
        if not more:
            break
        reachable |= more
    assert reachable == set(S)
    for state in set(S) - FINAL:
        assert (state, E.CANCEL) in TRANSITIONS, f"a {state} transfer can be cancelled"
        assert (state, E.RESTART) in TRANSITIONS and (state, E.RESTART_WITHOUT_SOURCE) in TRANSITIONS
    assert next_state(S.ACTIVE, E.RESTART_WITHOUT_SOURCE) is S.NEEDS_RESUBMIT
    assert next_state(S.NEEDS_RESUBMIT, E.RESUBMIT) is S.QUEUED
    assert next_state(S.ACTIVE, E.STALL) is S.STALLED and next_state(S.STALLED, E.PROGRESS) is S.ACTIVE
    assert next_state(S.PAUSED, E.RESUME) is S.QUEUED and next_state(S.ACTIVE, E.RETRY) is S.QUEUED


def test_the_store_moves_only_by_the_table(tmp_path: Path) -> None:
    store = TransferStore(tmp_path / "transfers.json")
    transfer, _ = store.record_submission(Submission("gw-b", "/src/x", "x"), key="x")
    with pytest.raises(IllegalTransition):
        store.fire(transfer, E.FINISH)  # not being sent
    store.fire(transfer, E.START)
    store.fire(transfer, E.FINISH, bytes_done=10)
    for event in E:
        with pytest.raises(IllegalTransition):
            store.fire(transfer, event)
    with pytest.raises(IllegalTransition, match="done -> active"):
        store.update(transfer, state="active")
    assert store.get(transfer.id).state == "done"  # type: ignore[union-attr]


@pytest.mark.parametrize("state", ["active", "stalled", "paused", "queued"])
def test_a_restart_queues_what_was_unfinished(tmp_path: Path, state: str) -> None:
    path = tmp_path / "transfers.json"
    transfer, _ = TransferStore(path).record_submission(Submission("gw-b", "/src/x", "x"), key="x")
    write_state(path, [{**transfer.to_json(), "state": state, "bytes_done": 123}])
    reopened = TransferStore(path).get(transfer.id)
    assert reopened is not None and reopened.state == "queued" and reopened.bytes_done == 123
    assert read_state(path)[0]["id"] == transfer.id


def test_history_lists_finished_transfers_across_restarts_newest_kept(tmp_path: Path) -> None:
    path = tmp_path / "transfers.json"
    store = TransferStore(path, keep_finished=3)
    ids = []
    for i in range(12):
        submission = Submission("gw-b" if i % 2 else "gw-c", f"/src/{i}", f"f{i}")
        transfer, _ = store.record_submission(submission, key=f"k{i}")
        store.fire(transfer, E.START)
        store.fire(transfer, E.FINISH if i % 3 else E.FAIL, reason=None if i % 3 else "no")
        ids.append(transfer.id)
    waiting, _ = TransferStore(path).record_submission(Submission("gw-b", "/src/q", "q"), key="q")
    reopened = TransferStore(path, keep_finished=3)
    assert reopened.transfers.keys() == {waiting.id}, "memory holds only the unfinished"
    assert [t.id for t in reopened.history()] == [*ids, waiting.id], "oldest first, all of them"
    assert [t.id for t in reopened.history(limit=4)] == [*ids[-3:], waiting.id], "the newest 4"
    assert [t.id for t in reopened.history(state="failed")] == [ids[i] for i in (0, 3, 6, 9)]
    assert [t.id for t in reopened.history(peer="gw-c", state="done")] == [ids[i] for i in (2, 4, 8, 10)]
    assert [t.id for t in reopened.history(state="queued")] == [waiting.id]


async def test_transfer_list_shows_history_after_a_restart_and_filters(tmp_path: Path) -> None:
    import asyncio

    from daemon_helpers import make_pki, running, two_sites

    from wanxport.daemon.client import ApiError, GatewayClient

    a_cfg, b_cfg = two_sites(tmp_path, make_pki(tmp_path / "pki"))
    (tmp_path / "x.bin").write_bytes(b"x" * 1000)
    async with running(a_cfg) as a, running(b_cfg):
        client = GatewayClient(str(a.config.api_socket))
        ids = []
        for key in ("one", "two"):
            t = await asyncio.to_thread(client.submit, "gw-b", str(tmp_path / "x.bin"), key, key=key)
            assert (await asyncio.to_thread(client.wait, t["id"], 60))["state"] == "done"
            ids.append(t["id"])
    async with running(a_cfg) as a:  # restarted: memory holds none of them
        assert a.store is not None and a.store.transfers == {}
        client = GatewayClient(str(a.config.api_socket))
        assert [t["id"] for t in await asyncio.to_thread(client.list)] == ids
        assert [t["id"] for t in await asyncio.to_thread(client.list, "done", "gw-b", 1)] == ids[1:]
        assert await asyncio.to_thread(client.list, "failed") == []
        with pytest.raises(ApiError, match="state: 'finished' is not valid"):
            await asyncio.to_thread(client.list, "finished")
