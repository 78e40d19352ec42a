"""Mistakes a user can fix on the command line: ``UsageError`` and its exit status.

The ``wanxport`` command (the ``wanxport.cli`` package, the top layer) catches
it and prints one line; the subcommands and the layers beneath them raise it.
It lives down here, importing nothing, so that any layer can raise it without
importing the command that imports it.
"""

USAGE_ERROR = 2  # exit status of a usage error (docs/design.md section 6)


class UsageError(Exception):
    """A mistake the user can fix; reported as one line with exit status 2."""
