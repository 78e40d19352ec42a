"""Shared test settings: a seeded, deadline-free hypothesis profile.

Property tests must be reproducible on a small, noisy machine, so examples are
derived from the test itself (``derandomize``) and never timed out per example.
"""

import pytest
from hypothesis import settings

settings.register_profile("wanxport", derandomize=True, deadline=None, print_blob=True)
settings.load_profile("wanxport")


# Test files that change host-wide state (mounts, systemd units, the root namespace's
# sockets under flood) without the netns marker: with the netns tests, they run one at
# a time on one worker when the suite runs in parallel (`./dev test`, pytest-xdist's
# --dist loadgroup), so none of them sees another's namespaces, mounts or load.
HOST_STATE_FILES = frozenset({
    "test_full_disk.py",  # mounts a tmpfs
    "test_daemon_full_disk.py",  # mounts a tmpfs
    "test_deploy_units.py",  # starts transient systemd units
    "test_limits_flood.py",  # floods a socket to find the kernel's limits
    "test_kernel_overflow.py",  # fills a socket's kernel buffer
})


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
        if item.get_closest_marker("netns") or item.path.name in HOST_STATE_FILES:
            item.add_marker(pytest.mark.xdist_group("host-state"))
        if item.path.name in ALONE_FILES:
            item.add_marker(pytest.mark.alone)
