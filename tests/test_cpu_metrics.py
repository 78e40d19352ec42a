"""``wanxport_cpu_seconds_total{role}``: a gateway's CPU by thread role, as a counter."""

from __future__ import annotations

import threading
import time

import pytest
from cpu_helpers import busy_in_role, spin
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from wanxport.aio import threadcpu
from wanxport.gateway.cpu_metrics import ThreadCpuCollector


def scrape(registry: CollectorRegistry) -> dict[str, float]:
    text = generate_latest(registry).decode()
    return {sample.labels["role"]: sample.value
            for family in text_string_to_metric_families(text) if family.name == "wanxport_cpu_seconds"
            for sample in family.samples if sample.name == "wanxport_cpu_seconds_total"}


def test_each_role_counts_its_threads_cpu_and_the_roles_add_up_to_the_process() -> None:
    registry = CollectorRegistry()
    registry.register(ThreadCpuCollector())
    first = scrape(registry)
    assert set(first) == set(threadcpu.ROLES)
    released = threading.Thread(target=spin, args=(0.03,), name="wx-release-test")
    released.start()
    released.join()  # ended before the scrape: its CPU was never read under its role
    with threadcpu.thread_role("loop"):  # a role counts where the thread holds it when read
        spin(0.03)
        started = time.process_time()
        second = scrape(registry)
    assert second["loop"] - first["loop"] >= 0.03
    assert all(second[role] >= first[role] for role in threadcpu.ROLES)
    assert second["other"] - first["other"] >= 0.03  # the ended thread's CPU is not lost
    # Every role together is the process's CPU clock (give or take the scrape itself).
    assert sum(second.values()) == pytest.approx(started, abs=0.05)


def test_a_thread_that_ends_between_scrapes_keeps_what_its_role_was_given() -> None:
    registry = CollectorRegistry()
    registry.register(ThreadCpuCollector())
    with busy_in_role("receive", 0.03):
        while_alive = scrape(registry)
    after_it_ended = scrape(registry)
    assert while_alive["receive"] >= 0.03
    assert after_it_ended["receive"] == while_alive["receive"]  # a counter never goes down
