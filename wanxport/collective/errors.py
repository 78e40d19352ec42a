"""The one error a collective raises: it names the site (or the mismatch) so no caller guesses."""

from __future__ import annotations


class CollectiveError(RuntimeError):
    """A collective could not complete: a peer site died, stalled past the timeout, or called
    a different collective (op, size, dtype, compression). ``site`` names the site at fault
    when one is known; the group is then ``broken`` and must be rebuilt with ``join``. A call
    that stalled also gives the ``rank`` it waited on and the ``path`` that site was last
    heard on, so an operator knows which host and which link to look at."""

    def __init__(self, message: str, site: str | None = None, rank: int | None = None,
                 path: str | None = None) -> None:
        super().__init__(message)
        self.site = site
        self.rank = rank
        self.path = path


class MembershipChanged(CollectiveError):
    """The membership changed while this call was in flight and the survivors had not all
    reached the same call: redo the step after ``boundary``, which makes the state equal."""


class GroupEnded(CollectiveError):
    """An elastic group's members closed it (the run is over) while this site waited to be
    admitted: no one is left to admit it."""
