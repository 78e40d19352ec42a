"""The daemon's own certificate: refused at start when unusable, warned about before it expires.

At start, the identity checks of ``--check`` (``control.certcheck``) run again: a key
that is not the certificate's, a garbage CA file, a misnamed or expired certificate
stop the daemon with the same one line ``--check`` prints (a unit whose
``ExecStartPre`` was skipped would otherwise run and fail every handshake). The
warnings (expiring within 14 days) are logged at WARNING.

While running, the identity's expiry is looked at once a day and logged at WARNING
when it is within 14 days or past: an operator reading only the default log level
hears about it before the peers start refusing sessions (the certificate may have been
renewed and reloaded meanwhile, so each look re-reads the current identity).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable
from pathlib import Path

from cryptography import x509

from wanxport.control.certcheck import EXPIRY_WARNING_DAYS, days_left, inspect_identity

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 86400.0


class IdentityUnusable(Exception):
    """The identity cannot be used (the first problem, one line)."""


def check_at_start(identity: Path, ca: Path, site: str) -> None:
    """Raise IdentityUnusable with the first problem (naming how many more there are);
    log each warning."""
    report = inspect_identity(identity, ca, site)
    for warning in report.warnings:
        log.warning("%s", warning)
    if report.errors:
        more = len(report.errors) - 1
        raise IdentityUnusable(report.errors[0] + (f" (and {more} more: `wanxport gateway --check CONFIG` "
                                                   "lists them)" if more else ""))


def expiry_warning(pem: Path, now: dt.datetime | None = None) -> str | None:
    """The WARNING line for the certificate in ``pem``, or None while it has time left."""
    now = now or dt.datetime.now(dt.UTC)
    try:
        not_after = x509.load_pem_x509_certificate(pem.read_bytes()).not_valid_after_utc
    except (OSError, ValueError) as exc:
        return f"own certificate {pem} cannot be read ({exc})"
    left = days_left(not_after, now)
    if left < 0:
        return f"own certificate {pem} expired {-left:.1f} days ago: peers refuse new sessions; renew it"
    if left < EXPIRY_WARNING_DAYS:
        return f"own certificate {pem} expires in {left:.1f} days; renew it, then `systemctl reload`"
    return None


async def watch_expiry(current_pem: Callable[[], Path], interval_s: float = CHECK_INTERVAL_S) -> None:
    """Once every ``interval_s`` (the first time one interval after start, which made its own
    check): log the expiry warning of the identity in use then."""
    while True:
        await asyncio.sleep(interval_s)
        warning = expiry_warning(current_pem())
        if warning:
            log.warning("%s", warning)
