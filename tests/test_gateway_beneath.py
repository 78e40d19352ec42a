"""Receiving beneath a directory: no symlink followed, no '..', with openat2 and without."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from wanxport.gateway import beneath
from wanxport.gateway.beneath import (
    UnsafeName,
    entry_kind,
    link_target_inside,
    open_directory,
    open_file,
    split,
)


@pytest.fixture(params=["openat2", "per-component walk"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each test runs with the kernel's openat2 and with the walk forced (as on a kernel
    without openat2); ``calls`` counts openat2 so each test shows which one it ran."""
    calls: list[str] = []
    real = beneath.openat2.__call__

    def counted(dir_fd: int, path: str, flags: int) -> int:
        calls.append(path)
        return real(dir_fd, path, flags)

    if request.param == "openat2":
        if not beneath.openat2.available:
            pytest.skip("this kernel has no openat2")
        monkeypatch.setattr(beneath, "openat2", counted)
        counted.available = True  # type: ignore[attr-defined]
    else:
        monkeypatch.setattr(beneath.openat2, "available", False)
    yield request.param
    assert bool(calls) == (request.param == "openat2")


@pytest.fixture
def root(tmp_path: Path) -> Iterator[int]:
    (tmp_path / "in").mkdir()
    fd = os.open(tmp_path / "in", beneath.DIR_FLAGS)
    yield fd
    os.close(fd)


def test_a_nested_destination_is_created_and_found_again(tmp_path: Path, root: int, resolver: str) -> None:
    fd = open_directory(root, ["run-7", "ckpt", "shards"], create=True)
    try:
        assert os.fstat(fd).st_ino == (tmp_path / "in/run-7/ckpt/shards").stat().st_ino
    finally:
        os.close(fd)
    again = open_directory(root, ["run-7", "ckpt"], create=False)  # exists: one openat2 call
    os.close(again)
    with pytest.raises(FileNotFoundError):
        open_directory(root, ["run-8"], create=False)


def test_a_symlinked_directory_is_not_followed(tmp_path: Path, root: int, resolver: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "in/evil").symlink_to(outside)
    (tmp_path / "in/ok").mkdir()
    (tmp_path / "in/ok/deeper").symlink_to(outside)
    with pytest.raises(UnsafeName, match="^'evil' is a symlink; not followed$"):
        open_directory(root, ["evil", "sub"], create=True)
    with pytest.raises(UnsafeName, match="^'deeper' is a symlink; not followed$"):
        open_directory(root, ["ok", "deeper"], create=False)
    assert list(outside.iterdir()) == [], "nothing was created through the link"


def test_a_file_where_a_directory_should_be_is_named(tmp_path: Path, root: int, resolver: str) -> None:
    (tmp_path / "in/plain").write_bytes(b"")
    with pytest.raises(UnsafeName, match="^'plain' is a file, not a directory$"):
        open_directory(root, ["plain", "sub"], create=True)


def test_a_symlinked_final_name_is_not_followed(tmp_path: Path, root: int) -> None:
    target = tmp_path / "outside.bin"
    target.write_bytes(b"keep")
    (tmp_path / "in/x.bin").symlink_to(target)
    (tmp_path / "in/dangling").symlink_to(tmp_path / "nothing-here")
    for name in ("x.bin", "dangling"):
        with pytest.raises(UnsafeName, match=f"^'{name}' is a symlink; not followed$"):
            os.close(open_file(root, name, os.O_RDWR | os.O_CREAT | os.O_TRUNC))
    assert target.read_bytes() == b"keep" and not (tmp_path / "nothing-here").exists()
    assert entry_kind(root, "x.bin") == "symlink" and entry_kind(root, "absent") is None


@pytest.mark.parametrize("name", ["../escape.bin", "a/../../escape.bin", "a/./b", "a//b", ""])
def test_dot_dot_and_empty_components_are_refused(name: str) -> None:
    with pytest.raises(UnsafeName, match="is not a plain name|absolute or empty"):
        split(name)


def test_absolute_names_are_refused(root: int) -> None:
    with pytest.raises(UnsafeName, match="absolute"):
        split("/etc/shadow")
    with pytest.raises(UnsafeName, match="not a plain name"):  # even past split
        open_directory(root, [".."], create=False)


def test_a_kernel_without_openat2_falls_back_to_the_walk(tmp_path: Path, root: int,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSYS (an old kernel, or a seccomp filter) switches openat2 off for good; the walk
    then gives the same answers."""
    monkeypatch.setattr(beneath, "_OPENAT2", 100_000)  # no such system call: ENOSYS
    monkeypatch.setattr(beneath, "openat2", beneath._Openat2())
    monkeypatch.setattr(beneath.openat2, "available", True)
    fd = open_directory(root, ["a", "b"], create=True)
    os.close(fd)
    assert not beneath.openat2.available
    (tmp_path / "in/evil").symlink_to(tmp_path)
    with pytest.raises(UnsafeName, match="'evil' is a symlink"):
        open_directory(root, ["evil"], create=False)


@pytest.mark.parametrize(("parts", "target", "depth", "inside"), [
    (["d"], "f", 1, True),
    (["d", "sub"], "../f", 1, True),
    (["d"], ".", 1, True),
    (["d"], "../e/f", 1, False),  # another transfer's tree beside it
    (["d", "sub"], "../../../etc/shadow", 1, False),
    (["d"], "/etc/shadow", 1, False),
    (["d"], "sub/../../d/f", 1, False),  # lexically leaves d on the way
    ([], "f", 0, True),
    ([], "../f", 0, False),
    (["d"], "", 1, False),
])
def test_a_link_target_is_judged_lexically(parts: list[str], target: str, depth: int, inside: bool) -> None:
    assert link_target_inside(parts, target, depth) is inside
