"""Monitoring as operators run it: alert rules unit-tested, dashboard queries checked against a
live /metrics, promtool on a live scrape, and a real Prometheus scraping two gateways."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from daemon_helpers import make_pki, two_sites
from gateway_helpers import ROOT
from test_daemon_transfers import call, payload, running

from wanxport.daemon.client import GatewayClient

pytestmark = pytest.mark.timeout(180)
PROMTOOL = shutil.which("promtool")
PROMETHEUS = "/usr/bin/prometheus"
DEPLOY = ROOT / "deploy"
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian package: "
                                                              "prometheus; ./dev setup installs it as root)")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"))


def dashboard_queries() -> list[str]:
    dashboard = json.loads((DEPLOY / "grafana" / "wanxport.json").read_text())
    queries = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    queries += [v["definition"].replace("label_values(", "").split(",")[0]
                for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return [q.replace("$instance", ".*") for q in queries]


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def exported_names(text: str) -> set[str]:
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines()
            if line and not line.startswith("#")}


@needs_promtool
def test_alert_rules_check_and_unit_tests() -> None:
    for args in (["check", "rules", "alerts.yml"], ["test", "rules", "alerts.test.yml"],
                 ["check", "config", "prometheus.yml"]):
        result = subprocess.run([PROMTOOL, *args], cwd=DEPLOY, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0 and "SUCCESS" in result.stdout + result.stderr, result
    tested = set(re.findall(r"alertname: (\w+)", (DEPLOY / "alerts.test.yml").read_text()))
    defined = set(re.findall(r"- alert: (\w+)", (DEPLOY / "alerts.yml").read_text()))
    assert tested == defined, "every alert has a promtool unit test"


async def test_dashboard_and_promtool_against_live_metrics(pki: Path, tmp_path: Path) -> None:
    a_cfg, b_cfg = two_sites(tmp_path, pki, extra='metrics = "127.0.0.1:0"')
    src = tmp_path / "m.bin"
    payload(src, 8 << 20, 11)
    async with running(a_cfg) as a, running(b_cfg) as b:
        client = GatewayClient(str(a.config.api_socket))
        t = await call(client, "submit", "gw-b", str(src))
        assert (await call(client, "wait", t["id"], 60))["state"] == "done"  # type: ignore[index]
        scrapes = [await asyncio.to_thread(scrape, d.metrics_server.url) for d in (a, b)]  # type: ignore[union-attr]
    names = exported_names(scrapes[0]) | exported_names(scrapes[1])
    assert {"wanxport_certificate_expiry_timestamp_seconds", "wanxport_transfers",
            "wanxport_transfers_finished_total", "wanxport_path_srtt_seconds",
            "wanxport_key_age_seconds"} <= names
    assert 'wanxport_transfers_finished_total{state="done"} 1.0' in scrapes[0]  # the counter alerts use
    expiry = re.search(r'wanxport_certificate_expiry_timestamp_seconds\{certificate="identity"\} (\S+)',
                       scrapes[0])
    assert expiry is not None and 29 * 86400 < float(expiry.group(1)) - time.time() < 31 * 86400
    for query in dashboard_queries():
        used = set(re.findall(r"\b(wanxport_[a-z_]+)\b", query))
        assert used and used <= names, f"{query}: {used - names} not exported"
    if PROMTOOL is None:
        pytest.skip("promtool is not installed (Debian package: prometheus): metric names checked only")
    rules = tmp_path / "dashboard-rules.yml"
    rules.write_text("groups:\n  - name: dashboard\n    rules:\n" + "".join(
        f"      - record: dashboard:query{i}\n        expr: {json.dumps(q)}\n"
        for i, q in enumerate(dashboard_queries())))
    result = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    for text in scrapes:
        lint = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True,
                              timeout=60)
        assert lint.returncode == 0, lint.stdout + lint.stderr


def _free_tcp_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _query(base: str, promql: str) -> list[dict[str, object]]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    body = json.loads(scrape(url))
    assert body["status"] == "success", body
    return list(body["data"]["result"])


@pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason=f"{PROMETHEUS} is not installed (Debian package: "
                                                         "prometheus; ./dev setup installs it as root)")
async def test_a_real_prometheus_scrapes_two_gateways_during_a_transfer(pki: Path, tmp_path: Path) -> None:
    a_cfg, b_cfg = two_sites(tmp_path, pki, extra='metrics = "127.0.0.1:0"')
    src = tmp_path / "p.bin"
    payload(src, 192 << 20, 12)
    port = _free_tcp_port()
    base = f"http://127.0.0.1:{port}"
    async with running(a_cfg) as a, running(b_cfg) as b:
        targets = [f"127.0.0.1:{d.metrics_server.port}" for d in (a, b)]  # type: ignore[union-attr]
        config = tmp_path / "prometheus.yml"
        shutil.copy(DEPLOY / "alerts.yml", tmp_path / "alerts.yml")
        config.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                          "rule_files: [alerts.yml]\n"
                          "scrape_configs:\n  - job_name: wanxport\n    static_configs:\n"
                          f"      - targets: {json.dumps(targets)}\n")
        server = subprocess.Popen([PROMETHEUS, f"--config.file={config}",
                                   f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                                  stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "w"))
        try:
            client = GatewayClient(str(a.config.api_socket))
            t = await call(client, "submit", "gw-b", str(src))
            deadline = time.monotonic() + 90
            seen: set[str] = set()
            while time.monotonic() < deadline and len(seen) < 2:  # until both gateways' series are in
                try:
                    result = await asyncio.to_thread(_query, base, 'up{job="wanxport"} == 1')
                    seen = {str(r["metric"]["instance"]) for r in result}  # type: ignore[index]
                except OSError:
                    pass  # Prometheus still starting
                await asyncio.sleep(0.2)
            assert seen == set(targets), (tmp_path / "prometheus.log").read_text()
            assert (await call(client, "wait", t["id"], 90))["state"] == "done"  # type: ignore[index]
            await asyncio.sleep(1.5)  # one more scrape interval: the final counters are in
            sent = await asyncio.to_thread(
                _query, base, 'max_over_time(wanxport_acked_bytes_total[5m])')
            assert {str(r["metric"]["instance"]) for r in sent} == set(targets)  # type: ignore[index]
            by_instance = {str(r["metric"]["instance"]): float(r["value"][1]) for r in sent}  # type: ignore[index]
            assert by_instance[targets[0]] >= 192 << 20, by_instance
            rtt = await asyncio.to_thread(_query, base, "wanxport_path_srtt_seconds")
            assert {str(r["metric"]["path"]) for r in rtt} >= {"p0", "p1"}  # type: ignore[index]
            rules = json.loads(await asyncio.to_thread(scrape, f"{base}/api/v1/rules"))
            loaded = {r["name"] for g in rules["data"]["groups"] for r in g["rules"]}
            assert "WanxportCertificateExpiresSoon" in loaded
        finally:
            server.terminate()
            server.wait(30)
