"""The daemon cut by role: its routes, metrics and reload work on small objects of their own.

Each part depends on the members it uses (a Protocol), not on ``GatewayDaemon``, and the
daemon extends the gateway only through public names: checked here by building the parts
on stand-ins and by reading the imports.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from daemon_helpers import make_pki, write_config

from wanxport.daemon.config import DaemonConfig, PeerConfig, load_config
from wanxport.daemon.listener import ListenChangeRefused
from wanxport.daemon.metrics import DaemonCollector
from wanxport.daemon.reload import reload
from wanxport.gateway.config import Address, GatewayOptions
from wanxport.gateway.files import safe_name, safe_relative

DAEMON = Path(__file__).resolve().parent.parent / "wanxport" / "daemon"


@dataclass
class StandInListener:
    options: GatewayOptions = field(default_factory=GatewayOptions)
    refuse: str | None = None
    listens: list[Address] = field(default_factory=list)

    def change_listen(self, peers: Sequence[PeerConfig], listens: Sequence[Address]) -> None:
        if self.refuse is not None:
            raise ListenChangeRefused(self.refuse)
        self.listens = list(listens)

    def reload_identity(self, identity: Path) -> None:
        pass


@dataclass
class StandInDaemon:
    config: DaemonConfig
    identity_digest: str | None = None
    listener: StandInListener | None = None


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    return write_config(tmp_path / "a.toml", "gw-a", make_pki(tmp_path / "pki"), [47001], {"gw-b": [47002]})


def test_reload_takes_a_new_path_through_the_listener_interface(config_file: Path) -> None:
    daemon = StandInDaemon(load_config(config_file), listener=StandInListener())
    text = config_file.read_text()
    config_file.write_text(text.replace('"127.0.0.1:47001"', '"127.0.0.1:47001", "127.0.0.1:47003"'))
    result = reload(daemon)
    assert result.taken and result.error is None
    assert [port for _, port in daemon.listener.listens] == [47001, 47003]  # type: ignore[union-attr]
    assert len(daemon.config.listen) == 2


def test_a_refused_listen_change_keeps_the_running_config(config_file: Path) -> None:
    before = load_config(config_file)
    daemon = StandInDaemon(before, listener=StandInListener(refuse="listen: address in use"))
    config_file.write_text(config_file.read_text().replace("47001", "47005"))
    result = reload(daemon)
    assert not result.taken and result.error == "listen: address in use"
    assert daemon.config is before


def test_metrics_collect_from_a_stand_in(config_file: Path) -> None:
    @dataclass
    class Source:
        config: DaemonConfig
        store: None = None
        draining: bool = True
        received_skipped: dict[str, int] = field(default_factory=lambda: {"symlink-outside": 2})

    families = {f.name: f for f in DaemonCollector(Source(load_config(config_file))).collect()}
    assert families["wanxport_draining"].samples[0].value == 1
    skipped = families["wanxport_received_entries_skipped"].samples
    assert [(s.labels["reason"], s.value) for s in skipped] == [("symlink-outside", 2)]


def _imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every ``from X import name`` in ``path``, relative ones resolved."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                module = "wanxport.daemon" + (f".{module}" if module else "")
            found += [(module, alias.name) for alias in node.names]
    return found


def test_routes_metrics_and_reload_do_not_import_the_service() -> None:
    for part in ("routes.py", "metrics.py", "reload.py"):
        modules = {module for module, _ in _imports(DAEMON / part)}
        assert "wanxport.daemon.service" not in modules, part


def test_the_daemon_uses_only_public_names_of_the_gateway() -> None:
    private = [(path.name, module, name) for path in sorted(DAEMON.glob("*.py"))
               for module, name in _imports(path)
               if module.startswith("wanxport.gateway") and name.startswith("_")]
    assert private == []


@pytest.mark.parametrize("name", ["a.bin", "x y", "file-1.tar.gz"])
def test_one_sanitiser_keeps_plain_names(name: str) -> None:
    assert safe_name(name, 3) == safe_relative(name) == name


@pytest.mark.parametrize("name", ["../x", ".hidden", "a/b", "/etc/passwd", "", "a\0b", "a/", None, 7])
def test_one_sanitiser_falls_back_for_anything_else(name: object) -> None:
    assert safe_name(name, 3) == "shard-3"


def test_relative_paths_are_plain_components_only() -> None:
    assert safe_relative("d/e/f.bin") == "d/e/f.bin"
    assert safe_relative("d//e") == "d/e"
    assert [safe_relative(n) for n in ("d/../e", "d/.git/x", "/abs", "", "a\0")] == [None] * 5
