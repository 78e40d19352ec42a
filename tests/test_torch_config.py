"""wanxport.torch's site config and store rendezvous: what a site names, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch", reason="wanxport.torch needs the torch extra (pip install 'wanxport[torch]')")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import wanxport.torch as wt  # noqa: E402
from wanxport.torch.rendezvous import _pair_paths, listen_paths  # noqa: E402


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "site.toml"
    path.write_text(text)
    return path


def test_config_file_resolves_relative_names_against_its_directory(tmp_path: Path) -> None:
    path = write(tmp_path, 'identity = "pki/site-a"\nca = "pki/ca.pem"\n'
                           'paths = ["10.0.0.1:7500", "[::1]:7501"]\n')
    config = wt.SiteConfig.load(path)
    assert config.identity == tmp_path / "pki" / "site-a" and config.ca == tmp_path / "pki" / "ca.pem"
    assert config.paths == ("10.0.0.1:7500", "[::1]:7501")


@pytest.mark.parametrize(("text", "message"), [
    ('ca = "c"\npaths = ["h:1"]\n', "missing key 'identity'"),
    ('identity = "i"\nca = "c"\npaths = []\n', "at least one path"),
    ('identity = "i"\nca = "c"\npaths = ["nohost"]\n', "HOST:PORT"),
    ('identity = "i"\nca = "c"\npaths = ["h:70000"]\n', "port 1-65535"),
    ('identity = "i"\nca = "c"\npaths = "h:1"\n', "must be a list"),
    ('identity = "i"\nca = "c"\npaths = ["h:1"]\nport = 3\n', "unknown key(s) port"),
    ('identity = \n', "not valid TOML"),
    ("paths = " + "[" * 1000 + "]" * 1000 + "\n", "nested too deeply"),
])
def test_bad_config_is_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(wt.ConfigError) as info:
        wt.SiteConfig.load(write(tmp_path, text))
    assert message in str(info.value) and "site.toml" in str(info.value)
    assert "\n" not in str(info.value).strip()


def test_missing_config_file_and_missing_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(wt.ConfigError, match="cannot read"):
        wt.SiteConfig.load(tmp_path / "absent.toml")
    monkeypatch.delenv(wt.CONFIG_ENV, raising=False)
    with pytest.raises(wt.ConfigError, match=wt.CONFIG_ENV):
        wt.SiteConfig.from_env()
    monkeypatch.setenv(wt.CONFIG_ENV, str(write(tmp_path, 'identity = "i"\nca = "c"\npaths = ["h:9"]\n')))
    assert wt.SiteConfig.from_env().paths == ("h:9",)


def test_each_pair_gets_its_own_ports_of_the_higher_site() -> None:
    published = [{"name": f"s{k}", "paths": [f"10.0.{k}.1:7500", f"10.1.{k}.1:7500"]} for k in range(3)]
    assert _pair_paths(0, published) == {1: ["10.0.1.1:7500", "10.1.1.1:7500"],
                                         2: ["10.0.2.1:7500", "10.1.2.1:7500"]}
    assert _pair_paths(2, published) == {0: ["10.0.2.1:7500", "10.1.2.1:7500"],
                                         1: ["10.0.2.1:7501", "10.1.2.1:7501"]}
    assert listen_paths(["[::1]:7000"], 3) == ["[::1]:7003"]


def test_overlapping_pair_ports_are_refused() -> None:
    published = [{"name": f"s{k}", "paths": ["127.0.0.1:7500", "127.0.0.1:7501"]} for k in range(3)]
    with pytest.raises(wt.ConfigError, match="overlap"):
        _pair_paths(0, published)


def test_backend_is_registered_for_cpu_and_cuda_and_refuses_foreign_options(tmp_path: Path) -> None:
    assert "wanxport" in dist.Backend.backend_list
    assert dist.Backend.backend_capability["wanxport"] == ["cpu", "cuda"]
    assert dist.Backend.default_device_backend_map.get("cpu") in ("gloo", "wanxport")
    with pytest.raises(wt.ConfigError, match="must be a SiteConfig or WanxportOptions"):
        dist.init_process_group("wanxport", store=dist.HashStore(), rank=0, world_size=2, pg_options={"x": 1})
    assert not dist.is_initialized()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here: staging is for GPU tensors")
def test_cuda_tensor_is_staged_in_chunks_and_reduced_in_place() -> None:
    from concurrent.futures import Future

    from wanxport.torch.staging import staged_all_reduce

    tensor = torch.arange(10_000, dtype=torch.float32, device="cuda")
    seen: list[int] = []

    def start(chunk: torch.Tensor, index: int) -> Future[None]:
        assert chunk.is_pinned() and chunk.device.type == "cpu"
        seen.append(chunk.numel())
        chunk.mul_(2)  # stands in for the cross-site sum of two equal sites
        done: Future[None] = Future()
        done.set_result(None)
        return done

    staged_all_reduce(tensor, start, chunk_bytes=4096)
    assert seen == [1024] * 9 + [784]
    assert torch.equal(tensor.cpu(), torch.arange(10_000, dtype=torch.float32) * 2)


def test_a_site_that_never_publishes_itself_is_named_by_rank(tmp_path: Path) -> None:
    from wanxport.control.certs import make_test_pki
    from wanxport.torch.rendezvous import join_through_store

    make_test_pki(tmp_path / "pki", ["site-0", "site-1", "site-2"])
    config = wt.SiteConfig.make(tmp_path / "pki" / "site-0", tmp_path / "pki" / "ca.pem", ["127.0.0.1:1"])
    store = dist.FileStore(str(tmp_path / "store"), 3)
    store.set("wanxport/site/1", '{"name": "site-1", "paths": ["127.0.0.1:2"]}')  # site 2 never comes
    with pytest.raises(wt.CollectiveError, match=r"site rank\(s\) \[2\] never arrived"):
        join_through_store(store, 0, 3, config, timeout=1.0)


def test_each_local_rank_has_its_own_port_block_and_groups_give_ports_back() -> None:
    from wanxport.torch.rendezvous import PortBlock

    config = wt.SiteConfig.make("id", "ca", ["10.0.0.1:7500", "10.0.1.1:7600"])
    ports = PortBlock()
    first, release_first = ports.take(config, 0, 8, 1)
    second, _ = ports.take(config, 0, 8, 3)  # a 4-member group: three pair ports
    other_rank, _ = ports.take(config, 2, 8, 1)
    assert first == ["10.0.0.1:7500", "10.0.1.1:7600"]
    assert second == ["10.0.0.1:7501", "10.0.1.1:7601"]
    assert other_rank == ["10.0.0.1:7516", "10.0.1.1:7616"]
    release_first()
    assert ports.take(config, 0, 8, 1)[0] == first  # reused once its group shut down
    with pytest.raises(wt.ConfigError, match="local rank 0: its block of 8 ports per path is used up"):
        ports.take(config, 0, 8, 5)


def test_local_rank_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from wanxport.torch.rendezvous import local_rank

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert local_rank() == 0
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert local_rank() == 3
    monkeypatch.setenv("LOCAL_RANK", "x")
    with pytest.raises(wt.ConfigError, match="LOCAL_RANK='x'"):
        local_rank()


def test_options_carry_the_timeout_device_mesh_reads() -> None:
    from datetime import timedelta

    options = wt.WanxportOptions(timeout=timedelta(seconds=5))
    assert options._timeout == timedelta(seconds=5) and options.config is None


def test_reduce_op_errors_name_the_op_and_dtype() -> None:
    from wanxport.torch import dtypes

    assert dtypes.op_name(dist.ReduceOp.MAX) == "MAX" and dtypes.op_name(dist.ReduceOp.BXOR) == "BXOR"
    with pytest.raises(ValueError, match=r"all_reduce: ReduceOp.BAND needs an integer or bool tensor, "
                                         r"got torch.float32"):
        dtypes.check_op("BAND", torch.float32, "all_reduce")
    with pytest.raises(ValueError, match=r"ReduceOp.AVG needs a floating tensor, got torch.int64"):
        dtypes.check_op("AVG", torch.int64, "reduce")
    with pytest.raises(ValueError, match=r"ReduceOp.PREMUL_SUM is not supported"):
        dtypes.check_op(dtypes.op_name(dist.ReduceOp.PREMUL_SUM), torch.float32, "all_reduce")
    dtypes.check_op("BOR", torch.bool, "all_reduce")
    dtypes.check_op("MAX", torch.bfloat16, "all_reduce")


def test_a_group_of_two_ranks_of_one_site_is_refused(tmp_path: Path) -> None:
    import json

    from wanxport.control.certs import make_test_pki
    from wanxport.torch.rendezvous import join_through_store

    make_test_pki(tmp_path / "pki", ["site-0"])
    config = wt.SiteConfig.make(tmp_path / "pki" / "site-0", tmp_path / "pki" / "ca.pem", ["127.0.0.1:1"])
    store = dist.FileStore(str(tmp_path / "store"), 2)
    store.set("wanxport/site/1", json.dumps({"name": "site-0", "paths": ["127.0.0.1:2"]}))
    with pytest.raises(wt.ConfigError, match=r"group ranks \[0, 1\] share one identity"):
        join_through_store(store, 0, 2, config, timeout=5.0)
