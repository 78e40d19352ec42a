"""Shared test settings: a seeded, deadline-free hypothesis profile.

Property tests must be reproducible on a small, noisy machine, so examples are
derived from the test itself (``derandomize``) and never timed out per example.
"""

from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("wanxport", derandomize=True, deadline=None, print_blob=True)
settings.load_profile("wanxport")


# Test files that change host-wide state (mounts, systemd units, the root namespace's
# sockets under flood), and every file with a netns test: when the suite runs in parallel
# (`./dev test`, pytest-xdist) they all run one after another on one worker, so none of
# them sees another's namespaces, engines, mounts or load. (xdist_group marks added here
# are not honoured by pytest-xdist 3.8 with pytest 9, so the grouping is the scheduler's.)
HOST_STATE_FILES = frozenset({
    "test_full_disk.py",  # mounts a tmpfs
    "test_daemon_full_disk.py",  # mounts a tmpfs
    "test_deploy_units.py",  # starts transient systemd units
    "test_limits_flood.py",  # floods a socket to find the kernel's limits
    "test_kernel_overflow.py",  # fills a socket's kernel buffer
})
NETNS_FILES = frozenset(path.name for path in Path(__file__).parent.glob("test_*.py")
                        if "mark.netns" in path.read_text())


# Test files whose subject is timing on this host (a release thread's wake-ups, a daemon's
# records keeping up with its data): `./dev test` runs them after the parallel
# part, one at a time (marker `alone`), so the other tests' load is not part of what they see.
ALONE_FILES = frozenset({
    "test_native_pacer.py",  # counts the release thread's rounds and orders its queues
    "test_daemon_full_disk.py",  # a pause on a full tmpfs, then the retry once space returns
    "test_daemon_resume.py",  # bounds what a kill -9 re-sends by how far the records kept up
})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in ALONE_FILES:
            item.add_marker(pytest.mark.alone)


# Test files whose tests start processes that import torch (tens of seconds each, several
# sharing one module fixture): in parallel runs each file is one unit of work, so its fixture
# is set up once, and these units are handed out right after the host-state unit, so that
# the last minutes of the run are not one worker finishing a long file while the others idle.
def _starts_torch_processes(name: str) -> bool:
    return name.startswith("test_torch_")


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """With ``--dist loadgroup``: the host-state and netns files form one unit of work (one
    worker, one after another), each torch file one unit, and every other test a unit of its
    own, as with ``load``. Units are handed out longest first: host-state, torch, the rest."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    def rank(scope: str) -> int:
        if scope == "host-state":
            return 0
        return 1 if _starts_torch_processes(scope) else 2

    class LongestFirst(LoadScopeScheduling):  # type: ignore[misc]
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            name = _file_of(nodeid)
            if name in HOST_STATE_FILES | NETNS_FILES:
                return "host-state"
            return name if _starts_torch_processes(name) else nodeid

        def _assign_work_unit(self, node: object) -> None:
            # The queue is complete at the first hand-out; ordered once by rank (a stable
            # sort, so within a rank the larger units stay first).
            if not self.ordered:
                units = sorted(self.workqueue.items(), key=lambda unit: rank(unit[0]))
                self.workqueue.clear()
                self.workqueue.update(units)
                self.ordered = True
            super()._assign_work_unit(node)

    return LongestFirst(config, log)
