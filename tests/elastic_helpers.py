"""Shared pieces of the elastic-group tests: a store double, a step loop, a cut site.

``MemoryStore`` has the c10d store methods membership uses, with the same
compare-and-set answer as torch's TCPStore (the value held afterwards); a test
can cut it off (every call raises) and heal it. The step loop is the one
documented for users: ``boundary`` before each step, one all-reduce per step,
``MembershipChanged`` redoes the step.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from wanxport.collective import ArrayState, ElasticGroup, MembershipChanged, elastic_join


class MemoryStore:
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.lock = threading.Condition()

    async def until(self, predicate: Callable[[dict[str, bytes]], bool], timeout: float = 60.0) -> None:
        """Wait (bounded) until ``predicate(data)`` holds, woken by every change."""
        def wait() -> bool:
            with self.lock:
                return self.lock.wait_for(lambda: predicate(self.data), timeout)
        assert await asyncio.to_thread(wait), "the store never reached the state waited for"

    def _changed(self) -> None:
        self.lock.notify_all()

    def _check_cut(self) -> None:
        pass

    def set(self, key: str, value: str | bytes) -> None:
        self._check_cut()
        with self.lock:
            self.data[key] = value.encode() if isinstance(value, str) else value
            self._changed()

    def get(self, key: str) -> bytes:
        self._check_cut()
        with self.lock:
            return self.data[key]

    def check(self, keys: list[str]) -> bool:
        self._check_cut()
        with self.lock:
            return all(k in self.data for k in keys)

    def add(self, key: str, amount: int) -> int:
        self._check_cut()
        with self.lock:
            value = int(self.data.get(key, b"0")) + amount
            self.data[key] = str(value).encode()
            self._changed()
            return value

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        self._check_cut()
        old = expected.encode() if isinstance(expected, str) else expected
        new = desired.encode() if isinstance(desired, str) else desired
        with self.lock:
            held = self.data.get(key)
            if held == old or (held is None and old == b""):
                self.data[key] = new
                self._changed()
                return new
            return held if held is not None else old


class CutStore:
    """One site's view of a shared store, which the test can cut off for that site alone."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.cut = False
        self.refusals = 0
        self.retried = asyncio.Event()  # set at the second refusal: the first one was handled
        self.loop = asyncio.get_running_loop()

    def __getattr__(self, name: str):  # noqa: ANN204 - set/get/add/check/compare_set, checked first
        method = getattr(self.store, name)

        def call(*args):  # noqa: ANN002, ANN202
            if self.cut:
                self.refusals += 1
                if self.refusals >= 2:
                    self.loop.call_soon_threadsafe(self.retried.set)
                raise ConnectionError("store unreachable (cut by the test)")
            return method(*args)
        return call


def epoch_number(data: dict[str, bytes], prefix: str = "wanxport/elastic/") -> int:
    raw = data.get(prefix + "epoch")
    return -1 if raw is None else int(json.loads(raw)["number"])


def epoch_members(data: dict[str, bytes], prefix: str = "wanxport/elastic/") -> tuple[int, ...]:
    return tuple(json.loads(data[prefix + "epoch"])["members"])


def joiner(store: object, pki: Path, names: list[str], paths: dict, site: int,  # noqa: ANN201
           liveness_min_s: float = 1.0, **kw: object):
    return elastic_join(store, site, names, identity=pki / names[site], ca=pki / "ca.pem", paths=paths,
                        timeout=30.0, join_timeout=5.0, liveness_min_s=liveness_min_s, admit_timeout=2.0,
                        **kw)


def grad(site: int, step: int) -> np.ndarray:
    """Site ``site``'s contribution at ``step``: seeded, different per site and step."""
    return np.random.default_rng(1000 * site + step).standard_normal(257).astype(np.float32)


async def train(group: ElasticGroup, state: ArrayState, step: int, until: int,
                redone: list[int] | None = None, reached: tuple[int, asyncio.Event] | None = None) -> int:
    """Steps until ``until`` and, after a membership change, until every configured site is
    back and three steps ran after its admission (``redone``: the steps redone; ``reached``:
    an event set once that step is done). Returns the last step."""
    configured = len(group.sites.names)
    while step < until or group.size < configured or step < group.epoch.start + 3:
        step = await group.boundary(step, state)
        g = grad(group.site, step)
        try:
            await group.all_reduce(g, op="mean")
        except MembershipChanged:
            if redone is not None:
                redone.append(step)
            continue
        state.arrays["w"] = state.arrays["w"] + g
        state.arrays["step"] = np.array([step + 1])
        step += 1
        if reached is not None and step >= reached[0]:
            reached[1].set()
    return step


def digest(state: ArrayState) -> str:
    return hashlib.sha256(b"".join(a.tobytes() for a in state.arrays.values())).hexdigest()


def fresh_state() -> ArrayState:
    return ArrayState({"w": np.zeros(257, np.float32), "step": np.array([0])})


def cut_sessions(group: ElasticGroup) -> None:
    """Every session of this site stops at once, as a killed process's would (no goodbye)."""
    for link in group.world.links.values():
        link.session.endpoint.abort()
