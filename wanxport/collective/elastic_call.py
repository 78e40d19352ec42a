"""One call of an elastic group, across the attempts a membership change may cost it.

A call that a lost member interrupts is issued again on the next epoch's group as if the
first attempt had never run. Its input array is put back from the copy taken when the
call was made. So is its error-feedback residual: a compressed attempt records the
compression error of a value no site applied as the residual, and keeping that for the
retry (or for the step the caller redoes after a failed call) would add an error the
result never had and drop the one it carried. The residuals themselves outlive epochs
(the elastic group hands one ``ErrorFeedback`` to each epoch's group), since what this
site meant to send and did not is owed whoever the members are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy.typing as npt

from .buffers import as_array
from .codec import F32, ErrorFeedback
from .errors import CollectiveError
from .group import Group, Handle


@dataclass(eq=False)
class ElasticCall:
    index: int
    array: Any
    saved: npt.NDArray[Any]  # the input as the caller gave it
    op: str
    compress: str | None
    timeout: float | None
    name: str | None
    group: Group | None = None
    handle: Handle | None = None
    failed: CollectiveError | ValueError | None = None
    attempts: int = 0
    residual: F32 | None = None  # this call's residual before its first attempt

    def begin_attempt(self, feedback: ErrorFeedback) -> None:
        """Before an attempt: the input as given, and the residual as before the first attempt."""
        as_array(self.array)[...] = self.saved
        if self.compress is not None:
            key = feedback.key(self.name, as_array(self.array))
            if self.attempts == 0:
                self.residual = feedback.residual(key)
            else:
                feedback.store(key, self.residual)
        self.attempts += 1

    def undo(self, feedback: ErrorFeedback) -> None:
        """The call failed for good: the residual as before its first attempt, for the redo."""
        if self.attempts and self.compress is not None:
            feedback.store(feedback.key(self.name, as_array(self.array)), self.residual)
