"""A job you can watch: the collective group's Prometheus endpoint after real collectives on
loopback, the job dashboard's queries against it, promtool, membership, and a stalled call whose
error and metrics name the site, rank and path it waits on."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from collective_helpers import close_all, join_all, make_pki

from wanxport.collective import CollectiveError, GroupState
from wanxport.collective.metrics import expected_received, serve

pytestmark = pytest.mark.timeout(90)
ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "wanxport-job.json"
PROMTOOL = shutil.which("promtool")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"), 3)


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


Series = tuple[str, frozenset[tuple[str, str]]]
# Series only while a call runs or after the group broke, and those of an elastic group.
ON_DEMAND = {"wanxport_collective_in_flight_progress_ratio", "wanxport_collective_waiting_seconds",
             "wanxport_collective_error_info", "wanxport_collective_elastic_state",
             "wanxport_collective_waiting_for_store"}


def samples(text: str) -> dict[Series, float]:
    """Each sample line's (name, labels) -> value."""
    out: dict[Series, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            name, _, labels = series.partition("{")
            out[(name, frozenset(re.findall(r'(\w+)="([^"]*)"', labels)))] = float(value)
    return out


def value(got: dict[Series, float], name: str, **labels: str) -> float:
    return got[(name, frozenset(labels.items()))]


def names(text: str) -> set[str]:
    """Names with samples, and families declared (a histogram's ``_bucket`` has samples)."""
    declared = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    return {name for name, _ in samples(text)} | declared


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    queries += [v["definition"].removeprefix("label_values(").split(",")[0]
                for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return [q.replace("$instance", ".*") for q in queries]


async def test_endpoint_after_real_collectives_serves_the_dashboard_and_passes_promtool(
        pki: Path, tmp_path: Path) -> None:
    groups = await join_all(pki, 2)
    endpoint = serve(0, groups[0], host="127.0.0.1")
    try:
        xs = [np.arange(50_000, dtype=np.float32) * (k + 1) for k in range(2)]
        for compress in (None, "int4", "int4"):
            await asyncio.gather(*(g.all_reduce(x.copy(), op="mean", compress=compress, name="w")
                                   for g, x in zip(groups, xs, strict=True)))
        await asyncio.gather(*(g.barrier() for g in groups))
        text = await asyncio.to_thread(scrape, endpoint.url)
        got = samples(text)
        calls = groups[0].stats()
        int4 = [s for s in calls if s.compress == "int4"]
        series = {"group": "world", "op": "all_reduce", "schedule": "direct", "compress": "int4"}
        assert value(got, "wanxport_collective_calls_total", **series, outcome="ok") == 2
        assert value(got, "wanxport_collective_sent_bytes_total", **series) == sum(s.sent_bytes for s in int4)
        assert value(got, "wanxport_collective_received_bytes_total", **series) == \
            sum(s.received_bytes for s in int4)
        assert value(got, "wanxport_collective_duration_seconds_count", **series) == 2
        assert value(got, "wanxport_collective_members", group="world", state="live") == 2
        assert value(got, "wanxport_collective_info", group="world", site="site-0", rank="0", sites="2") == 1
        assert value(got, "wanxport_collective_state", group="world", state="open") == 1
        assert value(got, "wanxport_collective_in_flight", group="world") == 0
        paths = {dict(labels)["path"] for name, labels in got if name == "wanxport_path_state"}
        assert len(paths) == 2 and all(dict(labels)["peer"] == "site-1"  # the session's two paths
                                       for name, labels in got if name == "wanxport_path_state")
        assert any(name == "wanxport_path_state" and v == 1 for (name, _), v in got.items())
        exported, with_samples = names(text), {name for name, _ in got}
        for query in dashboard_queries():
            used = set(re.findall(r"\b(wanxport_[a-z_]+)\b", query))
            assert used and used <= exported, f"{query}: {used - exported} not exported"
            assert used - ON_DEMAND <= with_samples, f"{query}: {used - with_samples} has no series"
        # a second scrape counts nothing twice; a new call is counted once
        await asyncio.gather(*(g.all_reduce(x.copy(), compress="int4", name="w")
                               for g, x in zip(groups, xs, strict=True)))
        again = samples(await asyncio.to_thread(scrape, endpoint.url))
        assert value(again, "wanxport_collective_calls_total", **series, outcome="ok") == 3
        await groups[1].close()  # a member leaves: the survivors see it gone and count the change
        for _ in range(500):
            if groups[0].state is GroupState.MEMBER_GONE:
                break
            await asyncio.sleep(0.01)
        after = samples(await asyncio.to_thread(scrape, endpoint.url))
        assert value(after, "wanxport_collective_member_up", group="world", site="site-1", rank="1") == 0
        assert value(after, "wanxport_collective_membership_changes_total", group="world") == 1
        assert value(after, "wanxport_collective_members", group="world", state="gone") == 1
        if PROMTOOL is None:
            pytest.skip("promtool is not installed (Debian package: prometheus; ./dev setup installs it): "
                        "metric names checked only")
        lint = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True,
                              timeout=60)
        assert lint.returncode == 0, lint.stdout + lint.stderr
        rules = tmp_path / "dashboard-rules.yml"
        rules.write_text("groups:\n  - name: dashboard\n    rules:\n" + "".join(
            f"      - record: dashboard:query{i}\n        expr: {json.dumps(q)}\n"
            for i, q in enumerate(dashboard_queries())))
        checked = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True,
                                 timeout=60)
        assert checked.returncode == 0, checked.stdout + checked.stderr
    finally:
        endpoint.close()
        await close_all(groups)


async def test_a_stalled_collective_names_site_rank_and_path_in_its_error_and_metrics(pki: Path) -> None:
    groups = await join_all(pki, 3)
    endpoint = serve(0, groups[0], host="127.0.0.1")
    try:
        # site 2 never calls: sites 0 and 1 wait on it
        stalled = [asyncio.ensure_future(g.all_reduce(np.ones(1000, np.float32), timeout=3.0))
                   for g in groups[:2]]
        waiting: list[dict[str, str]] = []
        for _ in range(300):  # until site 1's part has come (or the calls gave up)
            during = samples(await asyncio.to_thread(scrape, endpoint.url))
            waiting = [dict(labels) for name, labels in during
                       if name == "wanxport_collective_waiting_seconds"]
            if (waiting and all(w["site"] == "site-2" for w in waiting)) or all(t.done() for t in stalled):
                break
        path_names = {p.name for p in groups[0].links[2].path_stats()}
        assert waiting and all((w["site"], w["rank"]) == ("site-2", "2") and w["path"] in path_names
                               for w in waiting), waiting
        progress = [v for (name, _), v in during.items()
                    if name == "wanxport_collective_in_flight_progress_ratio"]
        assert len(progress) == 1 and 0 <= progress[0] < 1  # site 1's part came, site 2's did not
        with pytest.raises(CollectiveError) as info:
            await stalled[0]
        text = str(info.value)
        assert "site-2 (rank 2, last heard on path p" in text and "stalled" in text
        assert (info.value.site, info.value.rank) == ("site-2", 2) and info.value.path in path_names
        after = samples(await asyncio.to_thread(scrape, endpoint.url))
        error = [dict(labels) for name, labels in after if name == "wanxport_collective_error_info"]
        assert error == [{"group": "world", "state": "poisoned", "site": "site-2", "rank": "2",
                          "path": info.value.path}]
        await asyncio.gather(*stalled, return_exceptions=True)
    finally:
        endpoint.close()
        await close_all(groups)


def test_expected_bytes_follow_the_direct_schedules() -> None:
    from wanxport.collective.message import HEADER_BYTES, Call

    call = Call(0, "all_reduce", 1000, "<f4", "int4", "mean")
    assert expected_received(call, 0, 2) == HEADER_BYTES + 500 + 4 * 8
    plain = Call(0, "all_reduce", 999, "<f4", None, "sum")
    # three sites: our part from both peers, then each peer's part: 333 elements each
    assert expected_received(plain, 1, 3) == 2 * (HEADER_BYTES + 333 * 4) + 2 * (HEADER_BYTES + 333 * 4)
    assert expected_received(Call(0, "barrier", 0, "|u1"), 0, 3) == 2 * HEADER_BYTES
