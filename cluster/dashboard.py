"""The kvserve Grafana dashboard, built from the config (pure Python, no Ray).

`kvserve dashboard export` writes it to the chart's dashboards/kvserve.json (shipped to Grafana's
sidecar by the chart); `kvserve dashboard push` uploads it through Grafana's HTTP API. Every
query reads the metrics the ingress serves on `/metrics` (deployments/metrics.py); the unit
tests check each metric name against a real render of that registry.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from kvserve.config import SLOConfig
from cluster.helm_values import CHART_DIR

CHART_DASHBOARD = CHART_DIR / "dashboards" / "kvserve.json"
UID = "kvserve"
TITLE = "kvserve"
SCHEMA_VERSION = 39
GRID_WIDTH = 24  # Grafana's grid is 24 columns wide
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# Label filters bound to the template variables.
TENANT = 'tenant=~"$tenant"'
TENANT_CLASS = 'tenant=~"$tenant",class=~"$class"'
REPLICA = 'replica=~"$replica"'


def _rate(selector: str) -> str:
    return f"rate({selector}[$__rate_interval])"


def _per_replica(metric: str) -> str:
    # max, not sum: each ingress replica (and each scrape target) reports the same engine gauge.
    return f"max by (replica) ({metric}{{{REPLICA}}})"


def _quantile(q: float) -> str:
    return f"histogram_quantile({q}, sum by (kind, le) ({_rate(f'kvserve_request_seconds_bucket{{{TENANT}}}')}))"


def _tenant_quantile(q: float, histogram: str) -> str:
    return (f"histogram_quantile({q}, sum by (tenant, class, le) "
            f"({_rate(f'{histogram}_bucket{{{TENANT_CLASS}}}')}))")


@dataclass(frozen=True)
class Panel:
    title: str
    targets: tuple[tuple[str, str], ...]  # (PromQL, legend)
    unit: str = "short"
    width: int = 8
    height: int = 8
    kind: str = "timeseries"
    slo: float | None = None  # drawn as a red threshold line
    fraction: bool = False  # a 0..1 ratio: percentunit, axis pinned to 0..1
    description: str = ""


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


def _rows(slo: SLOConfig) -> tuple[Row, ...]:
    requests = _rate(f"kvserve_requests_total{{{TENANT}}}")
    errors = _rate(f'kvserve_requests_total{{{TENANT},status=~"4..|5.."}}')
    overload = _rate(f'kvserve_requests_total{{{TENANT},status=~"429|503"}}')
    hits = _rate(f"kvserve_engine_prefix_cache_hits_total{{{REPLICA}}}")
    queries = _rate(f"kvserve_engine_prefix_cache_queries_total{{{REPLICA}}}")
    cached = _rate(f"kvserve_cached_prompt_tokens_total{{{TENANT}}}")
    prompt = _rate(f"kvserve_prompt_tokens_total{{{TENANT}}}")
    return (
        Row("Traffic", (
            Panel("Replicas", (("count(max by (replica) (kvserve_engine_running))", "replicas"),),
                  kind="stat", width=4, description="Engine replicas reporting to the ingress."),
            Panel("Requests by tenant", ((f"sum by (tenant) ({requests})", "{{tenant}}"),),
                  unit="reqps", width=10),
            Panel("Requests by status", ((f"sum by (status) ({requests})", "{{status}}"),),
                  unit="reqps", width=10),
            Panel("Error ratio by tenant",
                  # `or ... * 0`: a tenant without errors shows 0, not a gap.
                  ((f"(sum by (tenant) ({errors}) or sum by (tenant) ({requests}) * 0)"
                    f" / sum by (tenant) ({requests})",
                    "{{tenant}}"),),
                  fraction=True, width=12,
                  description="Share of requests answered 4xx/5xx (499 = client went away mid-stream)."),
            Panel("Overload (429 / 503)",
                  ((f"sum by (tenant, status) ({overload})",
                    "{{tenant}} {{status}}"),),
                  unit="reqps", width=12, description="Rate-limited (429) and queue-full (503) requests."),
        )),
        Row("Latency", (
            Panel("Request latency by kind",
                  tuple((_quantile(q), f"p{round(q * 100)} {{{{kind}}}}") for q in (0.5, 0.9, 0.99)),
                  unit="s", description="Ingress-side, for the selected tenants; for streams, until the last byte."),
            Panel("TTFT p90 per replica (rolling)", ((_per_replica("kvserve_replica_ttft_p90_ms"), "{{replica}}"),
                                                     (_per_replica("kvserve_replica_ttft_p90_low_ms"),
                                                      "{{replica}} lower bound")),
                  unit="ms", slo=slo.ttft_p90_ms,
                  description=f"SLO line: slo.ttft_p90_ms = {slo.ttft_p90_ms:g} ms. The autoscaler adds replicas "
                  "for latency only when the lower bound (95% one-sided) is over the line too."),
            Panel("ITL p90 per replica (rolling)", ((_per_replica("kvserve_replica_itl_p90_ms"), "{{replica}}"),),
                  unit="ms", slo=slo.itl_p90_ms, description=f"SLO line: slo.itl_p90_ms = {slo.itl_p90_ms:g} ms."),
        )),
        _tenants_row(),
        Row("Engines", (
            Panel("Waiting per replica", ((_per_replica("kvserve_engine_waiting"), "{{replica}}"),), width=6),
            Panel("Running per replica", ((_per_replica("kvserve_engine_running"), "{{replica}}"),), width=6),
            Panel("KV cache usage per replica", ((_per_replica("kvserve_engine_kv_usage"), "{{replica}}"),),
                  fraction=True, width=6),
            Panel("Cached prefix blocks per replica", ((_per_replica("kvserve_engine_cached_blocks"), "{{replica}}"),),
                  width=6),
        )),
        Row("Prefix cache", (
            # A replica's counters restart with it (a new replica label): rate() handles both.
            Panel("Prefix-cache hit rate per replica",
                  ((f"max by (replica) ({hits}) / max by (replica) ({queries})", "{{replica}}"),),
                  fraction=True, width=12, description="Prompt tokens found cached / prompt tokens looked up."),
            Panel("Cached prompt-token ratio by tenant",
                  ((f"sum by (tenant) ({cached}) / sum by (tenant) ({prompt})", "{{tenant}}"),),
                  fraction=True, width=12, description="From response usage: non-streamed requests, and streams that ask for usage."),
        )),
    )


def _tenants_row() -> Row:
    """Per tenant (and its class, tenants.classes): what it sends, what it is refused, what it gets."""
    by = "sum by (tenant, class)"
    requests = _rate(f"kvserve_requests_total{{{TENANT_CLASS}}}")
    limited = _rate(f'kvserve_requests_total{{{TENANT_CLASS},status="429"}}')
    return Row("Tenants", (
        Panel("Requests by tenant and status",
              ((f"sum by (tenant, class, status) ({requests})", "{{tenant}} ({{class}}) {{status}}"),),
              unit="reqps", description="429: over the tenant's limits (tenants.classes); 503: overload."),
        Panel("Rate-limited share by tenant",
              ((f"({by} ({limited}) or {by} ({requests}) * 0) / {by} ({requests})", "{{tenant}} ({{class}})"),),
              fraction=True, description="Share of the tenant's requests answered 429 (requests/min, tokens/min "
              "or max_concurrent)."),
        Panel("Tokens by tenant",
              tuple((f"{by} ({_rate(f'kvserve_{m}_total{{{TENANT_CLASS}}}')})", f"{{{{tenant}}}} {label}")
                    for m, label in (("prompt_tokens", "prompt"), ("cached_prompt_tokens", "cached"),
                                     ("completion_tokens", "completion"))),
              unit="short", description="Tokens a second from each response's usage (every stream included)."),
        Panel("Tenant TTFT p90", ((_tenant_quantile(0.9, "kvserve_ttft_seconds"), "{{tenant}} ({{class}})"),),
              unit="s", description="At the ingress, streamed requests."),
        Panel("Tenant ITL p90", ((_tenant_quantile(0.9, "kvserve_itl_seconds"), "{{tenant}} ({{class}})"),),
              unit="s", description="Gaps between a stream's chunks, at the ingress."),
        Panel("Tenant queue wait p90",
              ((_tenant_quantile(0.9, "kvserve_queue_wait_seconds"), "{{tenant}} ({{class}})"),),
              unit="s", description="From arrival at the ingress until a replica took the request."),
        Panel("Tenant end-to-end p90",
              ((_tenant_quantile(0.9, "kvserve_request_seconds"), "{{tenant}} ({{class}})"),),
              unit="s", width=24, height=7, description="Until the last byte, every kind of request."),
    ))


def _field_config(p: Panel) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": "percentunit" if p.fraction else p.unit}
    if p.fraction:
        defaults.update(min=0, max=1)
    if p.slo is not None:
        defaults["thresholds"] = {"mode": "absolute",
                                  "steps": [{"color": "green", "value": None}, {"color": "red", "value": p.slo}]}
        defaults["custom"] = {"thresholdsStyle": {"mode": "line"}}
    return {"defaults": defaults, "overrides": []}


def _panel(p: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    targets = [{"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": chr(ord("A") + i)}
               for i, (expr, legend) in enumerate(p.targets)]
    out = {"id": panel_id, "type": p.kind, "title": p.title, "datasource": DATASOURCE, "targets": targets,
           "gridPos": {"x": x, "y": y, "w": p.width, "h": p.height}, "fieldConfig": _field_config(p)}
    if p.description:
        out["description"] = p.description
    if p.kind == "timeseries":
        out["options"] = {"legend": {"displayMode": "list", "placement": "bottom"},
                          "tooltip": {"mode": "multi", "sort": "desc"}}
    return out


def _layout(rows: tuple[Row, ...]) -> list[dict[str, Any]]:
    """Row headers and panels with ids and gridPos: panels fill left to right, wrapping at 24."""
    panels: list[dict[str, Any]] = []
    y = 0
    for row in rows:
        panels.append({"id": len(panels) + 1, "type": "row", "title": row.title, "collapsed": False, "panels": [],
                       "gridPos": {"x": 0, "y": y, "w": GRID_WIDTH, "h": 1}})
        y += 1
        x = line_height = 0
        for p in row.panels:
            if x + p.width > GRID_WIDTH:
                x, y, line_height = 0, y + line_height, 0
            panels.append(_panel(p, len(panels) + 1, x, y))
            x, line_height = x + p.width, max(line_height, p.height)
        y += line_height
    return panels


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {"name": name, "label": label, "type": "query", "datasource": DATASOURCE, "query": query,
            "definition": query, "refresh": 2, "sort": 1, "multi": True, "includeAll": True, "allValue": ".*",
            "current": {}, "options": [], "hide": 0}


def build_dashboard(slo: SLOConfig | None = None) -> dict[str, Any]:
    """Grafana dashboard JSON model; SLO threshold lines come from `slo` (defaults: SLOConfig())."""
    slo = slo or SLOConfig()
    datasource = {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
                  "current": {}, "options": [], "refresh": 1, "regex": "", "hide": 0}
    return {
        "uid": UID,
        "title": TITLE,
        "description": "kvserve ingress, engine and prefix-cache metrics (generated by `kvserve dashboard export`).",
        "tags": ["kvserve", "llm"],
        "schemaVersion": SCHEMA_VERSION,
        "editable": True,
        "graphTooltip": 1,  # shared crosshair
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "browser",
        "annotations": {"list": []},
        "templating": {"list": [
            datasource,
            _variable("replica", "Replica", "label_values(kvserve_engine_running, replica)"),
            _variable("tenant", "Tenant", "label_values(kvserve_requests_total, tenant)"),
            _variable("class", "Tenant class", "label_values(kvserve_requests_total, class)"),
        ]},
        "panels": _layout(_rows(slo)),
    }


def dashboard_text(dashboard: dict[str, Any]) -> str:
    """The committed form: pretty, sorted keys, trailing newline (stable diffs)."""
    return json.dumps(dashboard, indent=2, sort_keys=True) + "\n"


def push(dashboard: dict[str, Any], url: str, credential: str | tuple[str, str] | None,
         folder_uid: str | None = None) -> dict[str, Any]:
    """Create or overwrite the dashboard (matched by uid) in Grafana; returns Grafana's answer."""
    from grafana_client import GrafanaApi

    # grafana-client appends "api" to the URL path as is: a sub-path needs its trailing slash.
    parts = urlsplit(url)
    url = urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/"))
    payload: dict[str, Any] = {"dashboard": dashboard, "overwrite": True, "message": "kvserve dashboard push"}
    if folder_uid:
        payload["folderUid"] = folder_uid
    return GrafanaApi.from_url(url, credential=credential).dashboard.update_dashboard(payload)
