"""Whose source is it: a submission's files, opened with the submitter's own rights.

The daemon may be able to read far more than whoever talks to its API, so it never
opens a path on a local submitter's behalf. ``wanxport transfer submit`` opens the
source itself (``wanxport.sources``) and passes the descriptors over the Unix socket
(``SCM_RIGHTS``): the kernel checked the submitter's permissions when they were
opened. A path alone is opened by the daemon only for a local peer whose rights are
the daemon's anyway (uid 0 or the daemon's own, by ``SO_PEERCRED``) and for an
``api_tcp`` certificate that the config gives roots of its own. In every case each
open file must lie under the roots that apply (``send_roots``, or the certificate's),
judged by the path the kernel holds for the open file, so no symlink leads out.
"""

from __future__ import annotations

import os
from typing import Any

from wanxport.gateway.files import safe_relative
from wanxport.sources import OpenedSource, SourceEntry, SourceOpenError, inside_tree, open_source

from .api import Requester
from .config import DaemonConfig
from .outbox import HeldSource, SourceError, outside_roots


class Refused(Exception):
    """This submitter may not send this source (the 403's one line)."""


def held_source(config: DaemonConfig, body: dict[str, Any], requester: Requester,
                follow_symlinks: bool) -> HeldSource:
    """The submission's source, open and checked against the roots that apply.

    Refused (403) for a submitter or a file that may not be sent; SourceError (422)
    for a malformed or unopenable one. Descriptors it keeps are taken from
    ``requester``; the rest are the API server's to close."""
    source: str = body["source"]
    if requester.certificate is not None:
        roots = config.roots_of(requester.certificate)
        if not roots:
            raise Refused(f"certificate {requester.certificate!r} has no roots to send from "
                          "(api_client_roots)")
        if "entries" in body or "fds" in body:
            raise SourceError("entries/fds: descriptors pass only over the Unix socket")
        held = _opened_by_daemon(source, follow_symlinks)
    else:
        roots = config.send_roots
        if not roots:
            raise Refused("no send_roots are configured: this gateway sends nothing submitted on "
                          "this host (send_roots)")
        if "entries" in body or "fds" in body:
            held = _passed(source, body, requester)
        elif requester.uid in (0, os.geteuid()):
            held = _opened_by_daemon(source, follow_symlinks)
        else:
            raise Refused(f"uid {requester.uid} may not have the daemon open {source}: pass "
                          "descriptors (use wanxport transfer submit)")
    refusal = outside_roots(held, roots)
    if refusal is not None:
        held.close()
        raise Refused(refusal)
    return held


def reopen(config: DaemonConfig, source: str, api_client: str | None, follow_symlinks: bool
           ) -> HeldSource:
    """A "path" transfer's source again (after a restart), under the same roots."""
    held = _opened_by_daemon(source, follow_symlinks)
    refusal = outside_roots(held, config.roots_of(api_client))
    if refusal is not None:
        held.close()
        raise SourceError(refusal)
    return held


def _opened_by_daemon(source: str, follow_symlinks: bool) -> HeldSource:
    try:
        return HeldSource.adopt(open_source(source, follow_symlinks=follow_symlinks), "path")
    except SourceOpenError as exc:
        raise SourceError(str(exc)) from None


def _passed(source: str, body: dict[str, Any], requester: Requester) -> HeldSource:
    """The entries the client walked, each regular file with one of the passed descriptors."""
    entries, count = body.get("entries"), body.get("fds")
    if not isinstance(entries, list) or not entries or not isinstance(count, int):
        raise SourceError("entries: a non-empty list of {name, fd} or {name, symlink}, with fds "
                          "the number of descriptors passed")
    if count != len(requester.fds):
        raise SourceError(f"fds: the request says {count} descriptors, {len(requester.fds)} arrived")
    opened = OpenedSource(source, skipped=_skipped(body.get("skipped")))
    used: set[int] = set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise SourceError(f"entries[{i}]: must be {{name, fd}} or {{name, symlink}}")
        name = entry["name"]
        if not (name == "" and len(entries) == 1 or safe_relative(name) == name):
            raise SourceError(f"entries[{i}].name: {name!r} is not a plain relative path")
        index, target = entry.get("fd"), entry.get("symlink")
        if isinstance(target, str) and index is None:
            if not inside_tree(name, target):
                raise Refused(f"source {source}/{name}: a symlink pointing outside the source")
            opened.entries.append(SourceEntry(name, None, target))
        elif isinstance(index, int) and 0 <= index < count and index not in used:
            used.add(index)
            opened.entries.append(SourceEntry(name, requester.fds[index]))
        else:
            raise SourceError(f"entries[{i}]: fd must be a new index below fds ({count}), "
                              "or symlink a string")
    if len(used) != count:
        raise SourceError(f"fds: {count - len(used)} descriptors passed that no entry names")
    kept = set(used)
    held = HeldSource.adopt(opened, "fd")
    requester.fds = [fd for i, fd in enumerate(requester.take_fds()) if i not in kept]
    return held


def _skipped(value: Any) -> dict[str, int]:
    """What the client's walk skipped, for the log (ignored when malformed)."""
    if not isinstance(value, dict):
        return {}
    return {str(k)[:200]: v for k, v in list(value.items())[:20] if isinstance(v, int)}
