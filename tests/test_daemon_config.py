"""The daemon's config file: strict validation, one line naming the field, --check."""

from __future__ import annotations

import grp
import os
import pwd
import socket
from pathlib import Path

import pytest
from daemon_helpers import make_pki, two_sites, write_config
from gateway_helpers import free_path_ports, run

from wanxport.daemon.config import ConfigError, check_receive_group, load_config
from wanxport.gateway.files import ReceivePolicy


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_a_full_config_parses(pki: Path, tmp_path: Path) -> None:
    extra = "\n".join(['api_socket = "run/api.sock"', 'metrics = "127.0.0.1:0"',
                       "[limits]", 'memory_budget = "256MiB"', "concurrent_transfers = 2",
                       "[transfer]", 'checkpoint_bytes = "8MiB"', "drain_seconds = 5",
                       'cipher = "chacha20-poly1305"',
                       "[keys]", 'rotate_bytes = "1GiB"', "rotate_seconds = 600",
                       "[congestion]", 'controller = "cubic"'])
    path = write_config(tmp_path / "gw.toml", "gw-a", pki, [7400, 7401], {"gw-b": [7500]}, extra)
    config = load_config(path)
    assert config.listen == (("127.0.0.1", 7400), ("127.0.0.1", 7401))
    assert config.peer("gw-b") is not None and config.peer("gw-b").paths == (("127.0.0.1", 7500),)  # type: ignore[union-attr]
    assert config.api_socket == tmp_path / "run/api.sock"  # relative to the file
    assert config.metrics == ("127.0.0.1", 0)
    assert (config.limits.memory_bytes, config.limits.concurrent_transfers) == (256 << 20, 2)
    assert (config.piece_bytes, config.drain_s, config.cipher) == (8 << 20, 5.0, "chacha20-poly1305")
    assert (config.rotation.bytes, config.rotation.seconds) == (1 << 30, 600.0)
    options = config.gateway_options()
    assert (options.congestion_control, options.credit_bytes) == ("cubic", 256 << 20)
    assert options.rate_caps_bps == ()


def test_rate_caps_global_and_per_peer(pki: Path, tmp_path: Path) -> None:
    path = write_config(tmp_path / "gw.toml", "gw-a", pki, [7400, 7401], {"gw-b": [7500, 7501]},
                        "[limits]\nrate_mbps = 2500")
    config = load_config(path)
    assert config.gateway_options(config.peer("gw-b")).rate_caps_bps == (2500e6, 2500e6)
    assert config.gateway_options().rate_caps_bps == (2500e6, 2500e6), "the listener's paths too"
    text = path.read_text() + "rate_mbps = [100, 250.5]\n"  # in the last [[peers]] table
    path.write_text(text)
    config = load_config(path)
    assert config.gateway_options(config.peer("gw-b")).rate_caps_bps == (100e6, 250.5e6)
    path.write_text(text.replace("[100, 250.5]", "40"))
    assert load_config(path).gateway_options(load_config(path).peer("gw-b")).rate_caps_bps == (40e6, 40e6)
    path.write_text(text.replace("[100, 250.5]", "[100]"))
    with pytest.raises(ConfigError, match=r"peers\[0\].rate_mbps: 1 rates for 2 paths"):
        load_config(path)


def test_data_ports_one_per_path_never_shared(pki: Path, tmp_path: Path) -> None:
    path = write_config(tmp_path / "gw.toml", "gw-a", pki, [7400, 7401],
                        {"gw-b": [7500, 7501], "gw-c": [7600, 7601]})
    text = path.read_text()
    path.write_text(text + "data_ports = [7410, 7411]\n")  # in the last [[peers]] table: gw-c's
    config = load_config(path)
    assert [(p.name, p.data_ports) for p in config.peers] == [("gw-b", None), ("gw-c", (7410, 7411))]
    for bad, message in (("[7410]", r"peers\[1\].data_ports: give a list of 2 ports, one per listen path"),
                         ("[7410, 70000]", r"peers\[1\].data_ports\[1\]: 70000 is not valid; use a UDP port"),
                         ("[7410, 7401]", r"data_ports\[1\]: 127.0.0.1:7401 is already used by listen"),
                         ("[7410, 7410]", r"data_ports\[1\]: 127.0.0.1:7410 is already used by its path 0")):
        path.write_text(text + f"data_ports = {bad}\n")
        with pytest.raises(ConfigError, match=message):
            load_config(path)
    gw_b = 'paths = ["127.0.0.1:7500", "127.0.0.1:7501"]\n'
    path.write_text(text.replace(gw_b, gw_b + "data_ports = [7420, 7421]\n") + "data_ports = [7430, 7421]\n")
    with pytest.raises(ConfigError, match=r"peers\[1\].data_ports\[1\]: 127.0.0.1:7421 is already used by "
                                          "peer gw-b"):
        load_config(path)


@pytest.mark.parametrize(("text", "field"), [
    ("colour = 1", "colour: unknown key"),
    ("[limits]\nmemory = 1", "limits.memory: unknown key"),
    ("[limits]\nconcurrent_transfers = 0", "limits.concurrent_transfers: 0 is not valid"),
    ("[limits]\nmemory_budget = \"12 potatoes\"", "limits.memory_budget:"),
    ("[congestion]\ncontroller = \"reno\"", "congestion.controller: 'reno' is not valid; use one of"),
    ("[transfer]\ncipher = \"rot13\"", "transfer.cipher: 'rot13' is not valid"),
    ("[transfer]\ndrain_seconds = -1", "transfer.drain_seconds: -1 is not valid"),
    ("[transfer]\ncheckpoint_bytes = 10", "transfer.checkpoint_bytes: 10 is not valid; use at least"),
    ("metrics = \"nowhere\"", "metrics: 'nowhere' is not valid; use HOST:PORT"),
    ("[limits]\nrate_mbps = 0", "limits.rate_mbps: 0 is not valid; use a rate in Mb/s > 0"),
    ("[limits]\nrate_mbps = \"fast\"", "limits.rate_mbps: 'fast' is not valid"),
    ("[receive]\numask = \"0999\"", "receive.umask: '0999' is not valid; use an octal string 000..777"),
    ("[receive]\numask = 27", "receive.umask: 27 is not valid; use an octal string"),
    ("[receive]\nrecv_group = \"no-such-group-here\"", "receive.recv_group: no group named "
                                                      "'no-such-group-here' on this host"),
    ("[receive]\nrecv_group = 4", "receive.recv_group: 4 is not valid; use the name of a group"),
    ("[receive]\nmode = 1", "receive.mode: unknown key; valid keys are recv_group, umask"),
])
def test_bad_values_name_the_field(pki: Path, tmp_path: Path, text: str, field: str) -> None:
    path = write_config(tmp_path / "gw.toml", "gw-a", pki, [7400], {"gw-b": [7500]}, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(field) or field in str(err.value), err.value
    assert "\n" not in str(err.value)


def test_receive_umask_and_group(pki: Path, tmp_path: Path) -> None:
    path = write_config(tmp_path / "gw.toml", "gw-a", pki, [7400], {})
    assert load_config(path).receive.policy == ReceivePolicy(0o027, None), "the default: group reads"
    write_config(path, "gw-a", pki, [7400], {}, '[receive]\numask = "0077"\nrecv_group = "adm"')
    receive = load_config(path).receive
    assert (receive.umask, receive.group, receive.group_id) == (0o077, "adm", grp.getgrnam("adm").gr_gid)
    assert receive.policy.mode(0o4755) == 0o700 and receive.policy.mode(None) == 0o600


def test_recv_group_is_one_of_the_daemon_users_groups_unless_root(
        pki: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fchown(2) gives a file only to a group its user is in; root to any. --check (and the
    start) say so in one line instead of failing on the first file received."""
    path = write_config(tmp_path / "gw.toml", "gw-a", pki, [7400], {}, '[receive]\nrecv_group = "adm"')
    config = load_config(path)
    check_receive_group(config)  # as root: any group
    nobody = pwd.getpwnam("nobody")
    monkeypatch.setattr(os, "geteuid", lambda: nobody.pw_uid)
    monkeypatch.setattr(os, "getegid", lambda: nobody.pw_gid)
    monkeypatch.setattr(os, "getgroups", lambda: [nobody.pw_gid])
    with pytest.raises(ConfigError, match=r"^receive.recv_group: 'adm' \(gid \d+\) is not a group of this "
                                          r"user \(nobody, uid 65534\)"):
        check_receive_group(config)
    monkeypatch.setattr(os, "getgroups", lambda: [nobody.pw_gid, grp.getgrnam("adm").gr_gid])
    check_receive_group(config)  # a supplementary group will do


def test_structural_errors(pki: Path, tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    for text, field in [("site = \"a\"", "listen: missing"),
                        ("site = \"a\"\nlisten = []", "listen: must be a non-empty list"),
                        ("site = \"a b\"", "site: 'a b' is not valid"),
                        ("site = \"a\"\nlisten = [\"1.2.3.4:7\", \"1.2.3.4:7\"]", "listen: the same address"),
                        ("site = [", "not valid TOML"),
                        ("site = " + "[" * 1000 + "]" * 1000, "nested too deeply")]:
        path.write_text(text)
        with pytest.raises(ConfigError) as err:
            load_config(path)
        assert field in str(err.value), (text, err.value)
    path = write_config(path, "gw-a", pki, [7400], {})
    path.write_text(path.read_text() + '[[peers]]\nname = "b"\npaths = ["127.0.0.1:1"]\nport = 3\n')
    with pytest.raises(ConfigError, match=r"peers\[0\]\.port: unknown key"):
        load_config(path)


def test_check_exit_codes(pki: Path, tmp_path: Path) -> None:
    a_cfg, _ = two_sites(tmp_path, pki)
    ok = run("gateway", "--check", str(a_cfg))
    assert ok.returncode == 0 and "ok (site gw-a: 2 paths" in ok.stdout, ok
    bad = tmp_path / "bad.toml"
    bad.write_text(a_cfg.read_text() + "\n[limits]\nfoo = 1\n")
    result = run("gateway", "--check", str(bad))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "wanxport gateway: limits.foo: unknown key; valid keys are concurrent_transfers, memory_budget, "
        "rate_mbps"], result.stderr
    missing = write_config(tmp_path / "m.toml", "gw-a", tmp_path / "nopki", [7400], {})
    result = run("gateway", "--check", str(missing))
    assert result.returncode == 2 and "identity:" in result.stderr and "does not exist" in result.stderr


def test_a_port_in_use_is_one_line_at_start(pki: Path, tmp_path: Path) -> None:
    [port] = free_path_ports(1)
    path = write_config(tmp_path / "gw.toml", "gw-a", pki, [port], {})
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", port))
        result = run("gateway", str(path), timeout=30)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "listen: port in use" in lines[0] and str(port) in lines[0], result.stderr
