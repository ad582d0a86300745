"""The comparison table (rich) and the JSON result file of a bench run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

from rich.table import Table

from bench.runner import PolicyRun
from bench.tenant_slo import TargetsOf, tenants_json
from kvserve.policy_params import SLOTargets

# The per-policy keys of the JSON file, exactly (issue 3 fixes them).
JSON_KEYS = (
    "ttft_p50_ms",
    "ttft_p90_ms",
    "itl_p50_ms",
    "e2e_p50_ms",
    "output_tok_per_s",
    "prefix_hit_rate",
    "share_max_over_mean",
    "errors",
    "client_loop_lag_max_ms",
    "replicas",
    "cold_start_requests",
    "cold_start_ttft_s",
    "ttft_breakdown_ms",
    "engine_step_ms",
)

# (column header, RunMetrics attribute, format, lower is better)
_COLUMNS = (
    ("replicas", "replicas", "{}", False),
    ("TTFT p50 ms", "ttft_p50_ms", "{:.0f}", True),
    ("TTFT p90 ms", "ttft_p90_ms", "{:.0f}", True),
    ("TTFT p99 ms", "ttft_p99_ms", "{:.0f}", True),
    ("ITL p50 ms", "itl_p50_ms", "{:.1f}", True),
    ("E2E p50 ms", "e2e_p50_ms", "{:.0f}", True),
    ("out tok/s", "output_tok_per_s", "{:.1f}", False),
    ("req/s", "request_per_s", "{:.2f}", False),
    ("goodput req/s", "goodput_req_per_s", "{:.2f}", False),
    ("prefix hit", "prefix_hit_rate", "{:.3f}", False),
    ("share max/mean", "share_max_over_mean", "{:.2f}", True),
    ("errors", "errors", "{}", True),
    ("cold-start TTFT s", "cold_start_ttft_s", "{:.1f}", True),
)


def policy_json(run: PolicyRun, targets: TargetsOf | None = None, tenant: str | None = None) -> dict[str, Any]:
    """JSON_KEYS, plus `tenants` (`bench.tenant_slo`): per tenant, against its class's targets
    (`targets`; None: the run's SLO for everyone). `tenant`: every request's tenant (the API key's)."""
    m = run.metrics
    targets = targets or (lambda _t: SLOTargets(m.slo_ttft_ms, m.slo_itl_ms))
    return {**{k: getattr(m, k) for k in JSON_KEYS}, "tenants": tenants_json(run.results, targets, tenant)}


def result_json(runs: Sequence[PolicyRun], workload: dict[str, Any], targets: TargetsOf | None = None,
                tenant: str | None = None) -> dict[str, Any]:
    return {"policies": {r.policy: policy_json(r, targets, tenant) for r in runs}, "workload": dict(workload)}


def write_json(path: str | Path, runs: Sequence[PolicyRun], workload: dict[str, Any], targets: TargetsOf | None = None,
               tenant: str | None = None) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result_json(runs, workload, targets, tenant), indent=2) + "\n")


# The fields of one `--requests-jsonl` record; `kvserve sim --requests-jsonl` writes the same.
REQUEST_FIELDS = ("policy", "idx", "tenant", "replica", "sent_s", "ttft_ms", "e2e_ms", "prompt_tokens",
                  "cached_tokens", "output_tokens", "ok", "error", "status", "elapsed_ms", "error_detail")


def request_rows(run: PolicyRun) -> list[dict[str, Any]]:
    """One record per measured request, in send order: what a per-request analysis needs
    (which replica, how much came from cache, when it was sent relative to the run's first send)."""
    t0 = min((r.start for r in run.results), default=0.0)

    def ms(s: float | None) -> float | None:
        return None if s is None else round(s * 1000.0, 3)

    return [
        {
            "policy": run.policy, "idx": r.idx, "tenant": r.tenant, "replica": r.replica,
            "sent_s": round(r.start - t0, 6), "ttft_ms": ms(r.ttft_s), "e2e_ms": ms(r.e2e_s),
            "prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens,
            "output_tokens": r.output_tokens, "ok": r.ok, "error": r.error,
            "status": r.status, "elapsed_ms": ms(r.elapsed_s), "error_detail": r.error_detail,
        }
        for r in sorted(run.results, key=lambda r: (r.start, r.idx))
    ]


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    """One JSON object per line (also `kvserve sim --requests-jsonl`'s writer)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with Path(path).open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def write_requests_jsonl(path: str | Path, runs: Sequence[PolicyRun]) -> None:
    write_jsonl(path, (row for run in runs for row in request_rows(run)))


def _cell(value: Any, base: Any, fmt: str, lower_better: bool, with_ratio: bool) -> str:
    if value is None:
        return "-"
    text = fmt.format(value)
    if with_ratio and isinstance(base, (int, float)) and base and not isinstance(value, bool):
        ratio = value / base
        better = ratio < 1 if lower_better else ratio > 1
        colour = "green" if better else ("red" if ratio != 1 else "white")
        text += f" [{colour}]({ratio:.2f}×)[/{colour}]"
    return text


def comparison_table(runs: Sequence[PolicyRun], title: str = "kvserve bench") -> Table:
    """One column per policy (fits a terminal); cells after the first column show the ratio to the first."""
    table = Table(title=title, caption=f"(ratio vs {runs[0].policy})" if len(runs) > 1 else None)
    table.add_column("metric", style="bold")
    for run in runs:
        table.add_column(run.policy, justify="right")
    first = runs[0].metrics if runs else None
    for header, attr, fmt, lower in _COLUMNS:
        cells = [
            _cell(getattr(run.metrics, attr), getattr(first, attr), fmt, lower,
                  with_ratio=i > 0 and attr not in ("errors", "replicas"))
            for i, run in enumerate(runs)
        ]
        table.add_row(header, *cells)
    return table


BREAKDOWN_LAYERS = (("client", "client"), ("ingress", "ingress"), ("engine (vLLM in the replica)", "engine"),
                    ("  scheduler wait", "engine_queue"), ("  prefill", "engine_prefill"))


def ttft_breakdown_table(runs: Sequence[PolicyRun]) -> Table | None:
    """Where TTFT went, per policy: p50 / mean ms at each layer, outermost first (`ttft_breakdown_ms`);
    None when no run has one (a server without kvserve's counters)."""
    if not any(run.metrics.ttft_breakdown_ms for run in runs):
        return None
    table = Table(title="where TTFT goes", caption="p50 / mean ms; each layer's clock starts later than the one above")
    table.add_column("layer", style="bold")
    for run in runs:
        table.add_column(run.policy, justify="right")

    def cell(run: PolicyRun, key: str) -> str:
        q = (run.metrics.ttft_breakdown_ms or {}).get(key) or {}
        return " / ".join("-" if q.get(k) is None else f"{q[k]:.0f}" for k in ("p50", "mean"))

    for header, key in BREAKDOWN_LAYERS:
        table.add_row(header, *(cell(run, key) for run in runs))
    table.add_row("engine step", *("-" if run.metrics.engine_step_ms is None else f"{run.metrics.engine_step_ms:.1f}"
                                   for run in runs))
    return table


MAX_TENANT_ROWS = 8  # more tenants than this: the JSON has them, the terminal does not


def tenant_table(runs: Sequence[PolicyRun], targets: TargetsOf | None = None, tenant: str | None = None) -> Table | None:
    """Per tenant, per policy: TTFT p90 and SLO attainment; None when there are more than MAX_TENANT_ROWS tenants."""
    per = [policy_json(r, targets, tenant)["tenants"] for r in runs]
    names = sorted({t for p in per for t in p})
    if not names or len(names) > MAX_TENANT_ROWS:
        return None
    table = Table(title="per tenant: TTFT p90 ms / SLO attainment")
    table.add_column("tenant", style="bold")
    for run in runs:
        table.add_column(run.policy, justify="right")
    for name in names:
        cells = []
        for p in per:
            row = p.get(name)
            p90 = "-" if not row or row["ttft_p90_ms"] is None else f"{row['ttft_p90_ms']:.0f}"
            att = "-" if not row or row["slo_attainment"] is None else f"{row['slo_attainment']:.2f}"
            cells.append(f"{p90} / {att}")
        table.add_row(name, *cells)
    return table
