"""The Grafana dashboard: committed JSON is current, queries name real metrics, push really posts."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from autoscaling.window import SignalWindow
from deployments.metrics import IngressMetrics
from cli.app import app
from kvserve.config import SLOConfig
from cluster.dashboard import CHART_DASHBOARD, build_dashboard, dashboard_text

METRIC = re.compile(r"\bkvserve_[a-z0-9_]+")


def _queries(dashboard: dict) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    return exprs + [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]


def _window_stats() -> dict[str, float]:
    """What a replica with samples in its window reports (`record_autoscaling_stats`)."""
    w = SignalWindow(clock=lambda: 0.0)
    w.on_arrival(40, now=0.0)
    w.on_first_token(350.0, now=0.0)
    w.on_token_gap(40.0, now=0.0)
    return w.to_stats_dict(now=0.0)


def _exported_families() -> list:
    metrics = IngressMetrics({"team-a": "gold"})
    # Labelled series only appear once used: one streamed request with usage fills them all.
    usage = {"prompt_tokens": 40, "completion_tokens": 8, "prompt_tokens_details": {"cached_tokens": 32}}
    metrics.taken("team-a", 0.01)
    timer = metrics.stream_timer("team-a", 0.0)
    timer.chunk()
    timer.chunk()
    metrics.request_done("team-a", "chat", 200, 0.3, usage)
    replica = {"replica_id": "r1", "waiting": 1, "running": 2, "kv_usage": 0.4, "prefix_cache_queries": 100,
               "prefix_cache_hits": 60, "cached_blocks": 7,
               "window": _window_stats()}
    body, _ = metrics.render([replica])
    return list(text_string_to_metric_families(body.decode()))


def _exported_sample_names() -> set[str]:
    return {s.name for fam in _exported_families() for s in fam.samples}


def _sample_types() -> dict[str, str]:
    return {s.name: fam.type for fam in _exported_families() for s in fam.samples}


def _panel(dashboard: dict, title_start: str) -> dict:
    (panel,) = [p for p in dashboard["panels"] if p["title"].startswith(title_start)]
    return panel


def test_committed_dashboard_is_what_the_builder_makes():
    assert CHART_DASHBOARD.read_text() == dashboard_text(build_dashboard(SLOConfig())), (
        "helm/kvserve/dashboards/kvserve.json is stale: run `kvserve dashboard export`"
    )


def test_every_queried_metric_is_exported_by_the_ingress():
    exported = _exported_sample_names()
    used = {name for q in _queries(build_dashboard()) for name in METRIC.findall(q)}
    assert len(used) >= 10  # the regex really found the metrics
    assert used <= exported, f"not exported: {sorted(used - exported)}"


def test_rate_is_taken_of_counters_and_only_of_counters():
    types = _sample_types()
    panels = [t["expr"] for p in build_dashboard()["panels"] for t in p.get("targets", [])]
    for q in panels:
        for m in METRIC.finditer(q):
            in_rate = q[:m.start()].endswith("rate(")
            assert in_rate == (types[m.group()] in ("counter", "histogram")), (m.group(), types[m.group()], q)


def test_engine_prefix_cache_counts_are_counters_and_latency_is_per_tenant():
    families = {fam.name: fam for fam in _exported_families()}
    for name in ("kvserve_engine_prefix_cache_queries", "kvserve_engine_prefix_cache_hits"):
        assert families[name].type == "counter"
        (sample,) = families[name].samples
        assert sample.name == name + "_total" and sample.labels == {"replica": "r1"}
    assert families["kvserve_engine_prefix_cache_hits"].samples[0].value == 60
    buckets = [s for s in families["kvserve_request_seconds"].samples if s.name.endswith("_bucket")]
    assert buckets and all(s.labels["tenant"] == "team-a" and s.labels["kind"] == "chat" for s in buckets)


def test_slo_threshold_lines_follow_the_config():
    def red_line(dashboard: dict, title: str) -> float:
        steps = _panel(dashboard, title)["fieldConfig"]["defaults"]["thresholds"]["steps"]
        return steps[-1]["value"]

    default = build_dashboard()
    assert red_line(default, "TTFT p90") == SLOConfig().ttft_p90_ms
    assert red_line(default, "ITL p90") == SLOConfig().itl_p90_ms
    assert red_line(build_dashboard(SLOConfig(ttft_p90_ms=1234)), "TTFT p90") == 1234


def test_panels_tile_the_grid_without_overlap():
    cells: set[tuple[int, int]] = set()
    for p in build_dashboard()["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, p["title"]
        cells |= mine
    ids = [p["id"] for p in build_dashboard()["panels"]]
    assert len(ids) == len(set(ids))


@pytest.fixture
def fake_grafana():
    """Loopback HTTP server standing in for Grafana's POST /api/dashboards/db."""
    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": json.loads(body)})
            answer = json.dumps({"status": "success", "uid": "x", "url": "/d/x"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", received
    server.shutdown()
    server.server_close()


def test_push_posts_the_dashboard_with_the_token(fake_grafana):
    url, received = fake_grafana
    result = CliRunner().invoke(app, ["dashboard", "push", "--url", url, "--folder-uid", "llm"],
                                env={"GRAFANA_TOKEN": "glsa_secret"})
    assert result.exit_code == 0, result.output
    (req,) = received
    assert req["path"] == "/api/dashboards/db"
    assert req["auth"] == "Bearer glsa_secret"
    assert req["body"]["overwrite"] is True and req["body"]["folderUid"] == "llm"
    assert req["body"]["dashboard"] == build_dashboard()


def test_push_without_credentials_fails_before_sending(fake_grafana):
    url, received = fake_grafana
    result = CliRunner().invoke(app, ["dashboard", "push", "--url", url, "--token-env", "KVSERVE_TEST_NO_SUCH_VAR"])
    assert result.exit_code == 2 and not received


def test_export_writes_the_configured_slo(tmp_path):
    cfg = tmp_path / "kvserve.yaml"
    cfg.write_text("slo: {ttft_p90_ms: 777}\n")
    out = tmp_path / "dash.json"
    result = CliRunner().invoke(app, ["dashboard", "export", "--config", str(cfg), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text()) == build_dashboard(SLOConfig(ttft_p90_ms=777))


def test_chart_ships_the_dashboard_in_a_valid_configmap():
    pytest.importorskip("helm_python", reason="helm-python-sdk (dev extra) renders the chart")
    import kubernetes_validate

    from cluster.helm_values import render_chart

    rendered = render_chart({"grafanaDashboard": {"enabled": True}}, release="llm", namespace="serving")
    (cm,) = [o for objs in rendered.values() for o in objs if o["kind"] == "ConfigMap"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["kvserve.json"]) == build_dashboard()
    kubernetes_validate.validate(cm, "1.30", strict=True)


def test_every_per_request_series_is_labelled_by_tenant_and_class_and_counters_are_counters():
    per_request = [f for f in _exported_families() if not f.name.startswith(("kvserve_engine", "kvserve_replica"))]
    assert {f.name for f in per_request} >= {"kvserve_requests", "kvserve_request_seconds", "kvserve_queue_wait_seconds",
                                             "kvserve_ttft_seconds", "kvserve_itl_seconds", "kvserve_prompt_tokens",
                                             "kvserve_cached_prompt_tokens", "kvserve_completion_tokens"}
    for fam in per_request:
        for sample in fam.samples:
            assert sample.labels["tenant"] == "team-a" and sample.labels["class"] == "gold", sample
        if fam.name.endswith("tokens") or fam.name == "kvserve_requests":
            assert fam.type == "counter", fam.name


def test_the_tenants_row_reads_each_per_tenant_series_by_tenant_and_class():
    rows = [p["title"] for p in build_dashboard()["panels"] if p["type"] == "row"]
    assert "Tenants" in rows
    queries = " ".join(t["expr"] for p in build_dashboard()["panels"] if p["type"] != "row" for t in p["targets"])
    for metric in ("kvserve_ttft_seconds_bucket", "kvserve_itl_seconds_bucket", "kvserve_queue_wait_seconds_bucket",
                   "kvserve_completion_tokens_total", 'status="429"'):
        assert metric in queries
    assert 'class=~"$class"' in queries
