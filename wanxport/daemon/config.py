"""The gateway daemon's configuration file (TOML), validated strictly.

One file describes one gateway host: who it is (site name, identity, CA), where it
listens (one ``HOST:PORT`` per path), whom it talks to (peers and their paths), where
it keeps its state and files, and its limits. Every key is known: an unknown key,
a wrong type or a bad value is a ``ConfigError`` whose one line names the field and
what would be valid, because ``wanxport gateway --check`` and a reload (SIGHUP) both
print exactly that line. Relative paths are taken relative to the file's directory,
so a config and its PKI can move together.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wanxport.control import RotationLimits
from wanxport.core.cc import available_congestion_controls
from wanxport.gateway.config import Address, GatewayOptions, format_endpoint, parse_hostport
from wanxport.gateway.files import ReceivePolicy
from wanxport.tomltext import TOMLDecodeError, loads_toml
from wanxport.units import parse_size

DEFAULT_CHECKPOINT_BYTES = 64 << 20
DEFAULT_DRAIN_S = 30.0
DEFAULT_WARM_S = 300.0
DEFAULT_STALL_S = 60.0  # a transfer with no byte acknowledged this long shows "stalled"
DEFAULT_UMASK = 0o027  # received files: group may read, others nothing


class ConfigError(ValueError):
    """A config file that cannot be used: one line naming the field and what is valid."""


@dataclass(frozen=True)
class PeerConfig:
    """A gateway we exchange files with: its certificate name and its paths."""

    name: str
    paths: tuple[Address, ...]
    # Our sending rate cap per path to this peer (bits/s), overriding [limits] rate_mbps.
    rate_caps_bps: tuple[float, ...] | None = None
    dscp: int | None = None  # the DSCP of our datagrams to this peer, overriding [network] dscp
    # Our data ports for this peer's session, one per path of ours (on that path's listen host);
    # None: the path ports for the first such peer, ephemeral ports (bound at start) for others.
    data_ports: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Limits:
    memory_bytes: int = 1 << 30  # the receive budget granted to each peer's session
    concurrent_transfers: int = 4
    rate_cap_bps: float | None = None  # every path's sending rate cap, unless a peer sets its own


@dataclass(frozen=True)
class ReceiveConfig:
    """[receive]: how received files are left. Mode: the sender's, masked by ``umask``;
    owner: the daemon's user; group: ``recv_group`` (resolved to ``group_id`` when loaded),
    else the daemon's own, so that the people who should read received files can."""

    umask: int = DEFAULT_UMASK
    group: str | None = None
    group_id: int | None = None

    @property
    def policy(self) -> ReceivePolicy:
        return ReceivePolicy(self.umask, self.group_id)


@dataclass(frozen=True)
class DaemonConfig:
    site: str
    identity: Path  # PREFIX: PREFIX.pem and PREFIX.key
    ca: Path
    listen: tuple[Address, ...]
    data_dir: Path
    api_socket: Path
    api_tcp: Address | None = None  # the API also on TCP with mutual TLS (api.TlsListen)
    api_clients: tuple[str, ...] = ()  # certificate names allowed on api_tcp
    # What may be sent: local submissions only from under send_roots, an api_tcp client
    # only from under its own roots (a name without roots may look, not send).
    send_roots: tuple[Path, ...] = ()
    api_client_roots: tuple[tuple[str, tuple[Path, ...]], ...] = ()  # (certificate name, roots)
    follow_symlinks: bool = False  # the default for sources the daemon walks itself
    peers: tuple[PeerConfig, ...] = ()
    metrics: Address | None = None
    limits: Limits = field(default_factory=Limits)
    piece_bytes: int = DEFAULT_CHECKPOINT_BYTES
    drain_s: float = DEFAULT_DRAIN_S
    warm_s: float = DEFAULT_WARM_S  # an idle session to a peer is kept this long
    stall_s: float = DEFAULT_STALL_S  # [transfer] stall_seconds
    congestion_control: str = "bbr"
    rotation: RotationLimits = field(default_factory=RotationLimits)
    cipher: str = "aes-256-gcm"
    dscp: int | None = None  # [network] dscp: our datagrams' DiffServ code point
    receive: ReceiveConfig = field(default_factory=ReceiveConfig)
    source: Path | None = None  # the file this came from

    def roots_of(self, client: str | None) -> tuple[Path, ...]:
        """Where a submitter may send from: ``send_roots`` for a local one (None), else
        the api_tcp certificate's own roots (none: it may not send)."""
        if client is None:
            return self.send_roots
        return next((roots for name, roots in self.api_client_roots if name == client), ())

    def peer(self, name: str) -> PeerConfig | None:
        return next((p for p in self.peers if p.name == name), None)

    def gateway_options(self, peer: PeerConfig | None = None) -> GatewayOptions:
        """The session settings; with ``peer``, those of our sessions to it (its rate caps)."""
        caps: tuple[float | None, ...] = ()
        dscp = self.dscp
        if peer is not None:
            caps = peer.rate_caps_bps or (self.limits.rate_cap_bps,) * len(peer.paths)
            dscp = peer.dscp if peer.dscp is not None else dscp
        elif self.limits.rate_cap_bps is not None:
            caps = (self.limits.rate_cap_bps,) * len(self.listen)
        return GatewayOptions(cipher=self.cipher, credit_bytes=self.limits.memory_bytes,
                              piece_bytes=self.piece_bytes, rotation=self.rotation,
                              congestion_control=self.congestion_control, rate_caps_bps=caps,
                              dscp=dscp)

    @property
    def received_dir(self) -> Path:
        return self.data_dir / "received"


_TOP = {"site", "identity", "ca", "listen", "data_dir", "api_socket", "api_tcp", "api_clients", "metrics",
        "send_roots", "api_client_roots", "follow_symlinks", "peers", "limits", "transfer", "keys",
        "congestion", "network", "receive"}
_LIMITS = {"memory_budget", "concurrent_transfers", "rate_mbps"}
_TRANSFER = {"checkpoint_bytes", "drain_seconds", "cipher", "warm_seconds", "stall_seconds"}
_KEYS = {"rotate_bytes", "rotate_seconds"}
_CONGESTION = {"controller"}
_NETWORK = {"dscp"}
_RECEIVE = {"umask", "recv_group"}
_PEER = {"name", "paths", "rate_mbps", "dscp", "data_ports"}
# DiffServ class names (RFC 2474, 2597, 3246, 8622) -> code points; AFxy is added below.
DSCP_NAMES = {"DF": 0, "BE": 0, "LE": 1, "EF": 46, "VA": 44, **{f"CS{i}": 8 * i for i in range(8)},
              **{f"AF{x}{y}": 8 * x + 2 * y for x in range(1, 5) for y in range(1, 4)}}
CIPHERS = ("aes-256-gcm", "chacha20-poly1305")


def load_config(path: Path | str) -> DaemonConfig:
    """Read and validate ``path``; ConfigError (one line) on any problem."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    return loads_config(text, path.resolve().parent, source=path)


def loads_config(text: str, base: Path, *, source: Path | None = None) -> DaemonConfig:
    """The config in ``text`` (relative paths against ``base``); ConfigError on any problem."""
    try:
        raw = loads_toml(text)
    except TOMLDecodeError as exc:
        raise ConfigError(f"{source or 'config'}: not valid TOML ({exc})") from None
    return parse_config(raw, base, source=source)


def parse_config(raw: dict[str, Any], base: Path, *, source: Path | None = None) -> DaemonConfig:
    _known(raw, _TOP, "")
    site = _name(_required(raw, "site"), "site")
    listen = _addresses(_required(raw, "listen"), "listen")
    data_dir = _path(_required(raw, "data_dir"), "data_dir", base)
    api_socket = (_path(raw["api_socket"], "api_socket", base) if "api_socket" in raw
                  else data_dir / "api.sock")
    api_tcp = _address(raw["api_tcp"], "api_tcp", allow_zero=True) if "api_tcp" in raw else None
    clients = raw.get("api_clients", [])
    if not isinstance(clients, list):
        raise ConfigError("api_clients: must be a list of certificate names")
    api_clients = tuple(_name(c, f"api_clients[{i}]") for i, c in enumerate(clients))
    if api_tcp is not None and not api_clients:
        raise ConfigError("api_clients: missing; api_tcp needs the certificate names allowed to use it "
                          "(the peers' certificates come from the same CA)")
    send_roots = _roots(raw.get("send_roots", []), "send_roots")
    client_roots = _table(raw.get("api_client_roots", {}), "api_client_roots")
    for name in client_roots:
        if name not in api_clients:
            raise ConfigError(f"api_client_roots.{name}: not one of api_clients "
                              f"({', '.join(api_clients) or 'none'})")
    api_client_roots = tuple((name, _roots(value, f"api_client_roots.{name}"))
                             for name, value in client_roots.items())
    follow_symlinks = raw.get("follow_symlinks", False)
    if not isinstance(follow_symlinks, bool):
        raise ConfigError(f"follow_symlinks: {follow_symlinks!r} is not valid; use true or false")
    metrics = None
    if "metrics" in raw:
        metrics = _address(raw["metrics"], "metrics", allow_zero=True)
    peers = _peers(raw.get("peers", []), listen)
    limits = _limits(_table(raw.get("limits", {}), "limits"))
    transfer = _table(raw.get("transfer", {}), "transfer")
    _known(transfer, _TRANSFER, "transfer.")
    keys = _table(raw.get("keys", {}), "keys")
    _known(keys, _KEYS, "keys.")
    congestion = _table(raw.get("congestion", {}), "congestion")
    _known(congestion, _CONGESTION, "congestion.")
    network = _table(raw.get("network", {}), "network")
    _known(network, _NETWORK, "network.")
    dscp = _dscp(network["dscp"], "network.dscp") if "dscp" in network else None
    controller = congestion.get("controller", "bbr")
    if controller not in available_congestion_controls():
        raise ConfigError(f"congestion.controller: {controller!r} is not valid; use one of "
                          f"{', '.join(available_congestion_controls())}")
    cipher = transfer.get("cipher", CIPHERS[0])
    if cipher not in CIPHERS:
        raise ConfigError(f"transfer.cipher: {cipher!r} is not valid; use one of {', '.join(CIPHERS)}")
    rotation: dict[str, Any] = {}
    if "rotate_bytes" in keys:
        rotation["bytes"] = _size(keys["rotate_bytes"], "keys.rotate_bytes", minimum=1)
    if "rotate_seconds" in keys:
        rotation["seconds"] = _positive(keys["rotate_seconds"], "keys.rotate_seconds")
    return DaemonConfig(
        site=site,
        identity=_path(_required(raw, "identity"), "identity", base),
        ca=_path(_required(raw, "ca"), "ca", base),
        listen=listen, data_dir=data_dir, api_socket=api_socket, api_tcp=api_tcp,
        api_clients=api_clients, send_roots=send_roots, api_client_roots=api_client_roots,
        follow_symlinks=follow_symlinks, peers=peers, metrics=metrics,
        limits=limits,
        piece_bytes=_size(transfer.get("checkpoint_bytes", DEFAULT_CHECKPOINT_BYTES),
                          "transfer.checkpoint_bytes", minimum=1 << 16),
        drain_s=_positive(transfer.get("drain_seconds", DEFAULT_DRAIN_S), "transfer.drain_seconds"),
        warm_s=_positive(transfer.get("warm_seconds", DEFAULT_WARM_S), "transfer.warm_seconds"),
        stall_s=_positive(transfer.get("stall_seconds", DEFAULT_STALL_S), "transfer.stall_seconds"),
        congestion_control=controller, rotation=RotationLimits(**rotation), cipher=cipher,
        dscp=dscp, receive=_receive(_table(raw.get("receive", {}), "receive")), source=source)


def check_receive_group(config: DaemonConfig) -> None:
    """The daemon may give received files to ``recv_group``: root may give any group, another
    user only one it is in (its primary or a supplementary group, as fchown(2) requires).
    Checked for the user running this process: --check as the daemon's user, and at start."""
    gid = config.receive.group_id
    if gid is None or os.geteuid() == 0 or gid == os.getegid() or gid in os.getgroups():
        return
    uid = os.geteuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    raise ConfigError(f"receive.recv_group: {config.receive.group!r} (gid {gid}) is not a group of this "
                      f"user ({user}, uid {uid}), so received files cannot be given to it; add the user "
                      "to the group (in a systemd unit: SupplementaryGroups=) or name one of its groups")


# -- helpers --------------------------------------------------------------------


def _known(table: dict[str, Any], known: set[str], prefix: str) -> None:
    for key in table:
        if key not in known:
            raise ConfigError(f"{prefix}{key}: unknown key; valid keys are {', '.join(sorted(known))}")


def _required(table: dict[str, Any], key: str) -> Any:
    if key not in table:
        raise ConfigError(f"{key}: missing; it is required")
    return table[key]


def _table(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{what}: must be a table ([{what}])")
    return value


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value or not value.replace("-", "").replace("_", "").replace(
            ".", "").isalnum():
        raise ConfigError(f"{what}: {value!r} is not valid; use letters, digits, '-', '_' or '.'")
    return value


def _path(value: Any, what: str, base: Path) -> Path:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{what}: {value!r} is not valid; use a file system path (a string)")
    path = Path(value)
    return path if path.is_absolute() else base / path


def _roots(value: Any, what: str) -> tuple[Path, ...]:
    """Absolute directories, resolved now (a symlink in a root's own name is the
    operator's choice; below it, what is sent is judged by its resolved path)."""
    if not isinstance(value, list):
        raise ConfigError(f"{what}: must be a list of absolute directories")
    roots = []
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item.startswith("/"):
            raise ConfigError(f"{what}[{i}]: {item!r} is not valid; use an absolute directory")
        roots.append(Path(os.path.realpath(item)))
    return tuple(roots)


def _address(value: Any, what: str, *, allow_zero: bool = False) -> Address:
    if not isinstance(value, str):
        raise ConfigError(f"{what}: {value!r} is not valid; use \"HOST:PORT\" (e.g. \"10.0.0.2:7400\")")
    if allow_zero and value.endswith(":0"):
        return parse_hostport(value[:-1] + "1", what)[0], 0
    try:
        return parse_hostport(value, what)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _addresses(value: Any, what: str) -> tuple[Address, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{what}: must be a non-empty list of \"HOST:PORT\" (one per path)")
    addresses = tuple(_address(v, f"{what}[{i}]") for i, v in enumerate(value))
    if len(set(addresses)) != len(addresses):
        raise ConfigError(f"{what}: the same address appears twice; each path needs its own HOST:PORT")
    return addresses


def _peers(value: Any, listen: tuple[Address, ...]) -> tuple[PeerConfig, ...]:
    if not isinstance(value, list):
        raise ConfigError("peers: must be a list of tables ([[peers]] with name and paths)")
    peers: list[PeerConfig] = []
    for i, item in enumerate(value):
        table = _table(item, f"peers[{i}]")
        _known(table, _PEER, f"peers[{i}].")
        name = _name(_required_in(table, "name", f"peers[{i}]"), f"peers[{i}].name")
        if any(p.name == name for p in peers):
            raise ConfigError(f"peers[{i}].name: {name!r} appears twice; each peer once")
        paths = _addresses(_required_in(table, "paths", f"peers[{i}]"), f"peers[{i}].paths")
        caps = None
        if "rate_mbps" in table:
            caps = _rate_caps(table["rate_mbps"], len(paths), f"peers[{i}].rate_mbps")
        dscp = _dscp(table["dscp"], f"peers[{i}].dscp") if "dscp" in table else None
        data_ports = None
        if "data_ports" in table:
            data_ports = _data_ports(table["data_ports"], listen, peers, f"peers[{i}].data_ports")
        peers.append(PeerConfig(name, paths, caps, dscp, data_ports))
    return tuple(peers)


def _data_ports(value: Any, listen: tuple[Address, ...], others: list[PeerConfig],
                what: str) -> tuple[int, ...]:
    """One UDP port per path of ours, each on that path's listen host, used by no other path
    or peer (so a firewall can name each peer's data ports)."""
    if not isinstance(value, list) or len(value) != len(listen):
        raise ConfigError(f"{what}: give a list of {len(listen)} ports, one per listen path, in its order")
    taken = {address: "listen" for address in listen}
    for peer in others:
        for host_port in zip((a[0] for a in listen), peer.data_ports or (), strict=False):
            taken[host_port] = f"peer {peer.name}"
    ports = []
    for i, (port, (host, _)) in enumerate(zip(value, listen, strict=True)):
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ConfigError(f"{what}[{i}]: {port!r} is not valid; use a UDP port 1..65535")
        if (host, port) in taken:
            raise ConfigError(f"{what}[{i}]: {format_endpoint((host, port))} is already used by "
                              f"{taken[(host, port)]}; each peer needs ports of its own")
        taken[(host, port)] = f"its path {i}"
        ports.append(port)
    return tuple(ports)


def _required_in(table: dict[str, Any], key: str, where: str) -> Any:
    if key not in table:
        raise ConfigError(f"{where}.{key}: missing; it is required")
    return table[key]


def _limits(table: dict[str, Any]) -> Limits:
    _known(table, _LIMITS, "limits.")
    limits = Limits()
    memory = _size(table.get("memory_budget", limits.memory_bytes), "limits.memory_budget",
                   minimum=1 << 20)
    concurrent = table.get("concurrent_transfers", limits.concurrent_transfers)
    if isinstance(concurrent, bool) or not isinstance(concurrent, int) or concurrent < 1:
        raise ConfigError(f"limits.concurrent_transfers: {concurrent!r} is not valid; use a whole "
                          "number >= 1")
    rate = _rate(table["rate_mbps"], "limits.rate_mbps") if "rate_mbps" in table else None
    return Limits(memory, concurrent, rate)


def _receive(table: dict[str, Any]) -> ReceiveConfig:
    _known(table, _RECEIVE, "receive.")
    receive = ReceiveConfig()
    umask = receive.umask
    if "umask" in table:
        value = table["umask"]
        if not isinstance(value, str) or re.fullmatch(r"0?[0-7]{1,3}", value) is None:
            raise ConfigError(f"receive.umask: {value!r} is not valid; use an octal string 000..777 "
                              "(e.g. \"0027\": group may read, others nothing)")
        umask = int(value, 8)
    if "recv_group" not in table:
        return ReceiveConfig(umask)
    name = table["recv_group"]
    if not isinstance(name, str) or not name:
        raise ConfigError(f"receive.recv_group: {name!r} is not valid; use the name of a group on this host")
    try:
        gid = grp.getgrnam(name).gr_gid
    except KeyError:
        raise ConfigError(f"receive.recv_group: no group named {name!r} on this host; "
                          "create it (groupadd) or name an existing one") from None
    return ReceiveConfig(umask, name, gid)


def _dscp(value: Any, what: str) -> int:
    """A DiffServ code point: 0..63, or a class name ("EF", "AF41", "CS1", "LE")."""
    if isinstance(value, str) and value.upper() in DSCP_NAMES:
        return DSCP_NAMES[value.upper()]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 63:
        raise ConfigError(f"{what}: {value!r} is not valid; use 0..63 or a class name "
                          "(EF, AF11..AF43, CS0..CS7, LE)")
    return value


def _rate(value: Any, what: str) -> float:
    """A rate cap in Mb/s (10^6 bits/s) -> bits/s."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e9:
        raise ConfigError(f"{what}: {value!r} is not valid; use a rate in Mb/s > 0 (e.g. 2500)")
    return float(value) * 1e6


def _rate_caps(value: Any, n_paths: int, what: str) -> tuple[float, ...]:
    """One cap for every path of a peer, or a list with one per path (in its ``paths`` order)."""
    if not isinstance(value, list):
        return (_rate(value, what),) * n_paths
    if len(value) != n_paths:
        raise ConfigError(f"{what}: {len(value)} rates for {n_paths} paths; give one number, "
                          f"or one per path")
    return tuple(_rate(v, f"{what}[{i}]") for i, v in enumerate(value))


def _size(value: Any, what: str, *, minimum: int) -> int:
    try:
        size = parse_size(value)
    except ValueError as exc:
        raise ConfigError(f"{what}: {exc}") from None
    if size < minimum:
        raise ConfigError(f"{what}: {value!r} is not valid; use at least {minimum} bytes")
    return size


def _positive(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(f"{what}: {value!r} is not valid; use a number of seconds > 0")
    return float(value)


def describe(config: DaemonConfig) -> str:
    """One line for logs and --check: what this config sets up."""
    return (f"site {config.site}: {len(config.listen)} paths "
            f"({', '.join(format_endpoint(a) for a in config.listen)}), "
            f"{len(config.peers)} peers ({', '.join(p.name for p in config.peers) or 'none'})")
