"""A group's state as an explicit machine: open, a member gone, poisoned, closed.

"A member is gone" (its session ended or its liveness expired) and "the group is
poisoned" (this site can no longer trust that its calls pair with the others': a
call timed out with every member alive, or this site failed mid-call) are different
facts. Today both stop every call (the error names what happened), but keeping them
apart is what lets an elastic mode continue among the survivors of MEMBER_GONE
later, while POISONED never continues. The table lists every (state, event)
pair, no-ops included, so it answers every question about the machine by
itself. A mismatched or locally refused call is no transition:
every site consumed the same sequence number, so the group goes on.
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
