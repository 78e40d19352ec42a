"""Names and addresses of everything a scenario creates.

Names derive from the scenario name (plus a short hash, so two scenarios whose
names sanitise alike still differ), which lets two scenarios coexist on a host
and lets ``down`` find what ``up`` made without any saved state.

One namespace per site: ``<prefix>-a`` and ``<prefix>-b`` for the first two
sites (as for a two-site scenario's gateways ``a`` and ``b``), ``<prefix>-s<i>``
for site i >= 2 (0-based), and the middle ``<prefix>-m`` where every path's
impairment runs.

Addresses: path k (1-based) uses 10.200.k.0/30 (paths 251.. continue in
10.201.x, 10.202.x, ...), ``.1`` at the path's first site (``between[0]``;
gateway ``a`` of a two-site scenario) and ``.2`` at its second. They only
exist inside the namespaces we create, so they cannot clash with the host's
own networks; at most 1000 paths.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from wanxport.scenario import Scenario

STATE_ROOT = "/run/wanxport-emulation"
PREFIXLEN = 30
MAX_PATHS = 1000


@dataclass(frozen=True)
class PathPlan:
    """One path: its interfaces (gateway side and middle side) and addresses."""

    name: str
    index: int  # 1-based
    gw_ifname: str  # in both gateways: the interface that carries this path
    mid_a_ifname: str  # in the middle namespace, towards a
    mid_b_ifname: str  # in the middle namespace, towards b
    a_addr: str
    b_addr: str
    mtu: int
    #: The namespaces of the path's two sites: ``a_addr`` lives in the first, ``b_addr`` in the second.
    ends: tuple[str, str]


@dataclass(frozen=True)
class Plan:
    """Everything one scenario creates."""

    prefix: str
    ns_a: str
    ns_b: str
    ns_mid: str
    paths: tuple[PathPlan, ...]
    #: site name -> its namespace, in site order (a two-site scenario: ``a`` and ``b``).
    site_namespaces: dict[str, str]

    @property
    def namespaces(self) -> tuple[str, ...]:
        """Every namespace: the sites' in site order, then the middle."""
        return (*self.site_namespaces.values(), self.ns_mid)

    @property
    def state_dir(self) -> str:
        return f"{STATE_ROOT}/{self.prefix}"


def scenario_prefix(name: str) -> str:
    """``wx-<sanitised name, <= 20 chars>-<6 hex of its hash>``."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()[:20] or "scenario"
    digest = hashlib.sha1(name.encode()).hexdigest()[:6]
    return f"wx-{slug}-{digest}"


def path_subnet(k: int) -> str:
    """First three octets of path ``k``'s /30 (k is 1-based)."""
    return f"10.{200 + (k - 1) // 250}.{(k - 1) % 250 + 1}"


def plan(scenario: Scenario) -> Plan:
    """The namespaces, interfaces and addresses of ``scenario``."""
    if len(scenario.paths) > MAX_PATHS:
        raise ValueError(f"paths: {len(scenario.paths)} paths; at most {MAX_PATHS} can be emulated")
    prefix = scenario_prefix(scenario.name)
    site_ns = {site: site_namespace(prefix, i) for i, site in enumerate(scenario.sites)}
    paths = tuple(
        PathPlan(
            name=spec.name,
            index=k,
            gw_ifname=f"wan{k}",
            mid_a_ifname=f"a{k}",
            mid_b_ifname=f"b{k}",
            a_addr=f"{path_subnet(k)}.1",
            b_addr=f"{path_subnet(k)}.2",
            mtu=max(spec.forward.mtu, spec.reverse.mtu),
            ends=(site_ns[spec.between[0]], site_ns[spec.between[1]]),
        )
        for k, spec in enumerate(scenario.paths, start=1)
    )
    return Plan(
        prefix=prefix,
        ns_a=site_namespace(prefix, 0),
        ns_b=site_namespace(prefix, 1),
        ns_mid=f"{prefix}-m",
        paths=paths,
        site_namespaces=site_ns,
    )


def site_namespace(prefix: str, index: int) -> str:
    """Site ``index``'s namespace (0-based): ``-a``, ``-b``, then ``-s2``, ``-s3``, ..."""
    return f"{prefix}-{'ab'[index]}" if index < 2 else f"{prefix}-s{index}"
