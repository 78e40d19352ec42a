"""A group's state as an explicit machine: open, a member gone, poisoned, closed.

"A member is gone" (its session ended or its liveness expired) and "the group is
poisoned" (this site can no longer trust that its calls pair with the others': a
call timed out with every member alive, or this site failed mid-call) are different
facts. Both stop every call of that group (the error names what happened); an
elastic group (``elastic``) continues the survivors of MEMBER_GONE in a group of
the next epoch, while POISONED never continues. The table lists every (state,
event) pair, no-ops included, so it answers every question about the machine by
itself. A mismatched or locally refused call is no transition:
every site consumed the same sequence number, so the group goes on.

An elastic group has a machine of its own above its epochs' groups
(``ElasticState``): RUNNING while its epoch's group is open; RECONFIGURING while
it agrees on the next epoch through the store and opens its group; WAITING
while it may not continue (in a minority, out of the current epoch, or the store
unreachable) until the survivors admit it again; CLOSED.
"""

from __future__ import annotations

from enum import StrEnum


class GroupState(StrEnum):
    OPEN = "open"
    MEMBER_GONE = "member_gone"  # one or more members are gone; the rest are alive
    POISONED = "poisoned"  # pairing can no longer be trusted here
    CLOSED = "closed"


class GroupEvent(StrEnum):
    MEMBER_LOST = "member_lost"  # a member's session ended or its liveness expired
    POISON = "poison"  # an op timeout with no member known gone, or a local failure mid-call
    CLOSE = "close"


_O, _G, _P, _C = GroupState.OPEN, GroupState.MEMBER_GONE, GroupState.POISONED, GroupState.CLOSED

TRANSITIONS: dict[tuple[GroupState, GroupEvent], GroupState] = {
    (_O, GroupEvent.MEMBER_LOST): _G,
    (_O, GroupEvent.POISON): _P,
    (_O, GroupEvent.CLOSE): _C,
    (_G, GroupEvent.MEMBER_LOST): _G,  # no-op: another member gone too (each is recorded)
    (_G, GroupEvent.POISON): _P,
    (_G, GroupEvent.CLOSE): _C,
    (_P, GroupEvent.MEMBER_LOST): _P,  # no-op: already unusable; the first cause stays the error
    (_P, GroupEvent.POISON): _P,  # no-op
    (_P, GroupEvent.CLOSE): _C,
    (_C, GroupEvent.MEMBER_LOST): _C,  # no-op: closing ends the sessions, which ends the links
    (_C, GroupEvent.POISON): _C,  # no-op: calls still pending when it closed fail with "closed"
    (_C, GroupEvent.CLOSE): _C,  # no-op: close is idempotent
}


def advance(state: GroupState, event: GroupEvent) -> GroupState:
    return TRANSITIONS[(state, event)]


class ElasticState(StrEnum):
    RUNNING = "running"  # the current epoch's group is open
    RECONFIGURING = "reconfiguring"  # agreeing on the next epoch and opening its group
    WAITING = "waiting"  # stopped: a minority, left out of the epoch, or the store unreachable
    CLOSED = "closed"


class ElasticEvent(StrEnum):
    MEMBER_GONE = "member_gone"  # the epoch's group lost a member (its session ended or went silent)
    NEWER_EPOCH = "newer_epoch"  # the store holds a later epoch (a change another site proposed)
    CANNOT_CONTINUE = "cannot_continue"  # no majority here, left out of the epoch, or no store
    OPENED = "opened"  # this site is a member of the agreed epoch and its group is open
    CLOSE = "close"


_R, _F, _W, _X = ElasticState.RUNNING, ElasticState.RECONFIGURING, ElasticState.WAITING, ElasticState.CLOSED
_E = ElasticEvent

ELASTIC_TRANSITIONS: dict[tuple[ElasticState, ElasticEvent], ElasticState] = {
    (_R, _E.MEMBER_GONE): _F,
    (_R, _E.NEWER_EPOCH): _F,
    (_R, _E.CANNOT_CONTINUE): _W,  # the store is unreachable at a step boundary
    (_R, _E.OPENED): _R,  # no-op: an epoch opens only from RECONFIGURING or WAITING
    (_R, _E.CLOSE): _X,
    (_F, _E.MEMBER_GONE): _F,  # no-op: the epoch being agreed leaves it out too, or the next one does
    (_F, _E.NEWER_EPOCH): _F,  # no-op: the later epoch is the one adopted
    (_F, _E.CANNOT_CONTINUE): _W,
    (_F, _E.OPENED): _R,
    (_F, _E.CLOSE): _X,
    (_W, _E.MEMBER_GONE): _W,  # no-op: it takes part in nothing while it waits
    (_W, _E.NEWER_EPOCH): _F,  # an epoch that admits it (or one it must wait out)
    (_W, _E.CANNOT_CONTINUE): _W,  # no-op: still waiting
    (_W, _E.OPENED): _R,
    (_W, _E.CLOSE): _X,
    (_X, _E.MEMBER_GONE): _X,  # no-op: closed for good
    (_X, _E.NEWER_EPOCH): _X,  # no-op
    (_X, _E.CANNOT_CONTINUE): _X,  # no-op
    (_X, _E.OPENED): _X,  # no-op
    (_X, _E.CLOSE): _X,  # no-op: close is idempotent
}


def elastic_advance(state: ElasticState, event: ElasticEvent) -> ElasticState:
    return ELASTIC_TRANSITIONS[(state, event)]
