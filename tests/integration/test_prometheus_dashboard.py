"""A real Prometheus scrapes the live test cluster; every query of the Grafana dashboard returns data.

Prometheus comes from the system package (`make install-system`: Debian's `prometheus`); without
it this test fails and names that target, it does not skip.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from urllib.parse import urlsplit

import httpx
import pytest

from cluster.dashboard import build_dashboard
from tests.integration.conftest import MODEL

pytestmark = pytest.mark.integration

MISSING = ("prometheus is not installed (the dashboard test runs a real one): run `make install-system` "
           "(Debian/Ubuntu package `prometheus`)")
# Grafana's variables, as a viewer with every tenant, class and replica selected would send them.
VARIABLES = {"$__rate_interval": "1m", "$tenant": ".*", "$class": ".*", "$replica": ".*"}
LABEL_VALUES = re.compile(r"label_values\((\w+),\s*(\w+)\)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def prometheus(cluster, tmp_path):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail(MISSING)
    target = urlsplit(cluster.url).netloc
    config = tmp_path / "prometheus.yml"
    config.write_text(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: kvserve
    metrics_path: /metrics
    static_configs:
      - targets: ["{target}"]
""")
    port = _free_port()
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            try:
                if httpx.get(url + "/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "prometheus did not get ready in 60 s"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def _query(prom: str, expr: str) -> list:
    r = httpx.get(prom + "/api/v1/query", params={"query": expr}, timeout=10)
    assert r.status_code == 200, f"{expr}: {r.text}"
    return r.json()["data"]["result"]


def _label_values(prom: str, metric: str, label: str) -> list:
    r = httpx.get(f"{prom}/api/v1/label/{label}/values", params={"match[]": metric}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()["data"]


def _traffic(cluster) -> None:
    """What every panel shows: streamed and plain requests of two tenants, and a 429."""
    for tenant in ("tenant-a", "tenant-b"):
        client = cluster.openai(tenant)
        client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0)
        stream = client.chat.completions.create(model=MODEL, max_tokens=8, temperature=0, stream=True,
                                                messages=[{"role": "user", "content": "Count to five."}])
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    with cluster.client("tenant-rpm") as c:  # 3 requests a minute: a few more are refused
        codes = [c.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2}).status_code
                 for _ in range(4)]
    assert 429 in codes, codes


def test_every_dashboard_query_returns_data_from_a_real_prometheus(cluster, prometheus):
    deadline = time.monotonic() + 60
    while not any(t["health"] == "up" for t in
                  httpx.get(prometheus + "/api/v1/targets").json()["data"]["activeTargets"]):
        assert time.monotonic() < deadline, httpx.get(prometheus + "/api/v1/targets").text
        time.sleep(0.5)
    # Two rounds with a scrape between: a series' first sample is where rate() starts from.
    _traffic(cluster)
    deadline = time.monotonic() + 60
    while not _query(prometheus, 'kvserve_ttft_seconds_count{tenant="tenant-b"}'):
        assert time.monotonic() < deadline, "no scrape saw the first round"
        time.sleep(0.5)
    _traffic(cluster)
    dashboard = build_dashboard()
    queries = [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]
    variables = [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    assert len(queries) >= 20 and len(variables) == 3
    # Scrapes after the traffic must land, and rate() needs two of them: poll, bounded.
    deadline = time.monotonic() + 90
    empty: list[str] = []
    while True:
        empty = []
        for title, expr in queries:
            for name, value in VARIABLES.items():
                expr = expr.replace(name, value)
            if not _query(prometheus, expr):
                empty.append(f"{title}: {expr}")
        for q in variables:
            metric, label = LABEL_VALUES.fullmatch(q).groups()
            if not _label_values(prometheus, metric, label):
                empty.append(q)
        if not empty or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert not empty, "queries without data:\n" + "\n".join(empty)
    tenants = _label_values(prometheus, "kvserve_requests_total", "tenant")
    classes = _label_values(prometheus, "kvserve_requests_total", "class")
    assert {"tenant-a", "tenant-b", "tenant-rpm"} <= set(tenants) and {"default", "tenant-rpm"} <= set(classes)
    # Values, not just series: tenant-a's streams have a TTFT p90 of a positive, finite number of seconds.
    ttft = _query(prometheus, 'histogram_quantile(0.9, sum by (le) (rate(kvserve_ttft_seconds_bucket'
                              '{tenant="tenant-a"}[5m])))')
    assert ttft and 0 < float(ttft[0]["value"][1]) < 120, ttft
