"""Mistakes a user can fix on the command line: ``UsageError`` and its exit status.

The ``wanxport`` command (``wanxport/cli.py``, the top layer) catches it and
prints one line; the layers that contribute subcommands (``gateway.cli``)
raise it. It lives down here, importing nothing, so that they can raise it
without importing the command that imports them.
"""

USAGE_ERROR = 2  # exit status of a usage error (DESIGN.md section 6)


class UsageError(Exception):
    """A mistake the user can fix; reported as one line with exit status 2."""
