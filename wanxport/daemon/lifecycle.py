"""A transfer's lifecycle as an explicit table: ``(state, event) -> state``.

The same shape as ``core/health.py``: every legal move is one entry of
:data:`TRANSITIONS`; a pair the table does not list is a bug in the caller and
raises :class:`IllegalTransition`, instead of a transfer silently jumping from,
say, ``done`` back to ``active``. Moves that can happen but change nothing are
listed as no-ops, so the table alone answers what a transfer can do next.

States (the strings are what the API and ``transfers.json`` carry):

* ``queued``: waiting for its peer's worker (a new submission, a retry after a lost
  session, a restart);
* ``active``: being sent; ``stalled``: being sent but no byte acknowledged for
  ``[transfer] stall_seconds`` (the reason says what the peer looks like);
* ``paused``: the peer's disk is full; queued again after a backoff;
* ``needs-resubmit``: its source was a descriptor the client passed, which a daemon
  restart cannot reopen; the same idempotency key submitted again continues it;
* ``done``, ``failed``, ``cancelled``: final (moved to the on-disk archive).
"""

from __future__ import annotations

from enum import StrEnum


class TransferState(StrEnum):
    QUEUED = "queued"
    ACTIVE = "active"
    STALLED = "stalled"
    PAUSED = "paused"
    NEEDS_RESUBMIT = "needs-resubmit"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class TransferEvent(StrEnum):
    SUBMIT = "submit"  # a new submission (from no state)
    START = "start"  # its peer's worker begins sending it
    PROGRESS = "progress"  # bytes were acknowledged (a stalled transfer moves again)
    STALL = "stall"  # no byte acknowledged for stall_seconds
    FINISH = "finish"  # every file verified at the peer
    FAIL = "fail"  # a reason that retrying would not change
    CANCEL = "cancel"  # the client asked
    PAUSE = "pause"  # the peer's disk is full
    RESUME = "resume"  # the pause's backoff ran out
    RETRY = "retry"  # the session ended for a reason that says nothing about the transfer
    RESTART = "restart"  # the daemon started again and found it unfinished
    RESTART_WITHOUT_SOURCE = "restart_without_source"  # likewise, its source descriptor is gone
    RESUBMIT = "resubmit"  # the same key submitted again with a new descriptor


class IllegalTransition(Exception):
    """An event the transfer's current state cannot receive: the caller's logic is wrong."""


FINAL = frozenset({TransferState.DONE, TransferState.FAILED, TransferState.CANCELLED})

_Q, _A, _S, _P = TransferState.QUEUED, TransferState.ACTIVE, TransferState.STALLED, TransferState.PAUSED
_N, _D, _F, _C = (TransferState.NEEDS_RESUBMIT, TransferState.DONE, TransferState.FAILED,
                  TransferState.CANCELLED)
_E = TransferEvent

TRANSITIONS: dict[tuple[TransferState | None, TransferEvent], TransferState] = {
    (None, _E.SUBMIT): _Q,
    (_Q, _E.START): _A,
    (_Q, _E.FAIL): _F,  # the source cannot be planned, or its peer left the config
    (_Q, _E.CANCEL): _C,
    (_Q, _E.RETRY): _Q,  # no-op: the reason changes (waiting for the peer)
    (_Q, _E.RESTART): _Q,  # no-op
    (_Q, _E.RESTART_WITHOUT_SOURCE): _N,
    (_A, _E.PROGRESS): _A,  # no-op
    (_A, _E.STALL): _S,
    (_A, _E.FINISH): _D,
    (_A, _E.FAIL): _F,
    (_A, _E.CANCEL): _C,
    (_A, _E.PAUSE): _P,
    (_A, _E.RETRY): _Q,
    (_A, _E.RESTART): _Q,
    (_A, _E.RESTART_WITHOUT_SOURCE): _N,
    (_S, _E.PROGRESS): _A,
    (_S, _E.STALL): _S,  # no-op: the reason is refreshed
    (_S, _E.FINISH): _D,
    (_S, _E.FAIL): _F,
    (_S, _E.CANCEL): _C,
    (_S, _E.PAUSE): _P,
    (_S, _E.RETRY): _Q,
    (_S, _E.RESTART): _Q,
    (_S, _E.RESTART_WITHOUT_SOURCE): _N,
    (_P, _E.RESUME): _Q,
    (_P, _E.FAIL): _F,  # its peer left the config while it waited
    (_P, _E.CANCEL): _C,
    (_P, _E.RESTART): _Q,  # the wait does not outlive the process
    (_P, _E.RESTART_WITHOUT_SOURCE): _N,
    (_N, _E.RESUBMIT): _Q,
    (_N, _E.CANCEL): _C,
    (_N, _E.FAIL): _F,  # its peer left the config
    (_N, _E.RESTART): _N,  # no-op: still no descriptor
    (_N, _E.RESTART_WITHOUT_SOURCE): _N,  # no-op
}
# Not listed, so illegal: anything from a final state (a finished transfer is history),
# START of anything but a queued transfer, FINISH of one not being sent.


def next_state(state: TransferState | None, event: TransferEvent) -> TransferState:
    """Where ``event`` takes a transfer in ``state``; IllegalTransition if nowhere."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition(f"transfer: event {event.value!r} in state "
                                f"{state.value if state is not None else 'none'!r}") from None


def legal_move(old: TransferState, new: TransferState) -> bool:
    """Some event takes a transfer from ``old`` to ``new`` (for callers that set a state)."""
    return any(src == old and dst == new for (src, _), dst in TRANSITIONS.items())
