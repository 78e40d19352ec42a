"""Fuzz target: the gateway's configuration, today the ``wanxport send`` / ``recv`` arguments.

Operators type these and scripts generate them; every mistake must be a
``UsageError`` (one line, exit 2), never a traceback. The input is split at
NUL bytes into an argument vector for ``recv`` or ``send`` (first byte), parsed
by the real parser (whose ``error`` exits 2, the usage-error status), then converted the
way the commands do before they touch the network: addresses, sizes, the
metrics address and ``GatewayOptions``.

    python fuzz/fuzz_gateway_config.py -max_total_time=600 /tmp/fuzz-gwconfig fuzz/corpus/gateway_config
"""

from __future__ import annotations

import harness


def _is_help(arg: str) -> bool:
    """``-h``/``--help`` (or an abbreviation, or ``-vh``) prints and exits 0: not a parse path."""
    if arg.startswith("--"):
        return len(arg) > 2 and "--help".startswith(arg.split("=")[0])
    return arg.startswith("-") and "h" in arg


def load() -> harness.Check:
    import contextlib
    import io

    from wanxport.cli import build_parser
    from wanxport.cli import gateway as cli
    from wanxport.usage import USAGE_ERROR, UsageError

    parser = build_parser()
    common = ["--identity", "id", "--ca", "ca.pem"]

    def check(data: bytes) -> None:
        if not data:
            return
        command = "send" if data[0] & 1 else "recv"
        args = [a for a in data[1:].decode("utf-8", "replace").split("\0") if a and not _is_help(a)]
        argv = [command, *common, *args, *(["f"] if command == "send" else [])]
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                ns = parser.parse_args(argv)
            if command == "send":
                cli._addresses(ns.to, "--to")
                cli._options(ns, cipher=ns.cipher, piece_bytes=cli._size(ns.piece, "--piece"))
            else:
                cli._addresses(ns.listen, "--listen")
                cli._options(ns, credit_bytes=cli._size(ns.credit, "--credit"))
            cli._metrics_address(ns)
        except UsageError:
            pass
        except SystemExit as exc:
            assert exc.code == USAGE_ERROR, f"parser exited {exc.code!r}"

    return check


if __name__ == "__main__":
    harness.run(load)
