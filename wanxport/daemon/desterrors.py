"""What a receiver's destination error means for the transfer: wait, or fail.

A receiver that cannot write a file ends the session with a reason that names the
destination and the errno ("dest x.bin: Read-only file system (EROFS)"); the sender
reads the errno's name back from that reason. Two kinds:

* the space may come back through someone else's action on the receiving host (files
  moved away, a volume grown, a quota raised): ``ENOSPC``, ``EDQUOT``, and errors of a
  passing kind (``EIO``, ``EMFILE``...). The transfer is paused and queued again with a
  backoff (``service.py``), so a disk that stays full costs one attempt a minute;
* the receiver's configuration refuses the write, and no retry will change that until
  an operator acts: a read-only file system, a permission denied (``EROFS``,
  ``EACCES``, ``EPERM``), a path that is not a directory or is too long. The transfer
  fails at once at both ends with that reason; the operator resubmits once it is fixed.

Unknown errno names count as passing: a pause costs a retry a minute at most, a wrong
failure costs a transfer.
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass
from enum import Enum
from typing import Literal

from wanxport.gateway.files import describe_os_error

Verdict = Literal["pause", "fail"]

REFUSING = frozenset({"EROFS", "EACCES", "EPERM", "ENOTDIR", "EISDIR", "ENAMETOOLONG", "ELOOP"})
NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# Anywhere in a reason, also without "dest ": what receivers have always said.
_NO_SPACE = re.compile(r"\((ENOSPC|EDQUOT)\)")
_DEST_ERRNO = re.compile(r"\bdest .*?\((E[A-Z0-9]+)\)")


class DestErrorKind(Enum):
    """Why a receiver could not write, as far as the sender's next step goes."""

    NO_SPACE = "no-space"  # a full disk or quota: paused until space comes back
    PASSING = "passing"  # an error that may pass (EIO, EMFILE, unknown): paused
    REFUSED = "refused"  # the receiver's configuration refuses the write: failed


@dataclass(frozen=True)
class DestError:
    """A destination error read back from the reason a receiver ended its session with."""

    kind: DestErrorKind
    errno_name: str

    @property
    def verdict(self) -> Verdict:
        return "fail" if self.kind is DestErrorKind.REFUSED else "pause"


def dest_error(name: str, exc: OSError) -> str:
    """One line for a destination that cannot be written: names the file and the errno."""
    return f"dest {name}: {describe_os_error(exc)}"


def refuses(exc: OSError) -> bool:
    """The receiver's configuration refuses this write (no retry will change it)."""
    return errno.errorcode.get(exc.errno or 0, "") in REFUSING


def classify(reason: str) -> DestError | None:
    """The destination error ``reason`` names, or None when it names none (the caller's
    other rules apply)."""
    no_space = _NO_SPACE.search(reason)
    if no_space is not None:
        return DestError(DestErrorKind.NO_SPACE, no_space.group(1))
    match = _DEST_ERRNO.search(reason)
    if match is None:
        return None
    name = match.group(1)
    return DestError(DestErrorKind.REFUSED if name in REFUSING else DestErrorKind.PASSING, name)
