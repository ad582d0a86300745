"""Bench metrics against hand-computed values, the engines' hit-rate deltas, and the JSON/table report."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.client import RequestResult
from bench.metrics import meets_slo, percentile, share_max_over_mean, summarize
from bench.report import JSON_KEYS, MAX_TENANT_ROWS, REQUEST_FIELDS, comparison_table, result_json, tenant_table, write_requests_jsonl
from bench.runner import PolicyRun
from bench.server_stats import parse_stats, prefix_hit_rate
from bench.timeline import StatsSample, build_timeline


def _ok(idx, start, ttft, itl, replica, out=None):
    e2e = ttft + sum(itl)
    return RequestResult(idx=idx, start=start, ok=True, status=200, ttft_s=ttft, e2e_s=e2e, elapsed_s=e2e,
                         itl_s=list(itl), output_tokens=out if out is not None else len(itl) + 1, replica=replica)


def _err(idx, start, kind, status):
    return RequestResult(idx=idx, start=start, ok=False, status=status, error=kind, elapsed_s=0.01)


def test_percentile_hand_computed():
    assert percentile([], 50) is None
    assert percentile([7.0], 99) == 7.0
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)  # 1 + 0.9*3 = 3.7 -> between 3 and 4
    assert percentile(list(range(1, 11)), 99) == pytest.approx(9.91)


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50), st.floats(0, 100))
def test_percentile_matches_numpy(xs, q):
    assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)), rel=1e-9, abs=1e-6)


def test_share_max_over_mean_counts_idle_replicas():
    assert share_max_over_mean({"a": 6, "b": 2}) == pytest.approx(1.5)  # mean 4
    assert share_max_over_mean({"a": 6, "b": 2}, ["a", "b", "c"]) == pytest.approx(6 / (8 / 3))
    assert share_max_over_mean({"a": 5, "b": 5}) == 1.0
    assert share_max_over_mean({}) is None


@given(st.dictionaries(st.text(min_size=1, max_size=3), st.integers(0, 100), min_size=1))
def test_share_is_at_least_one(counts):
    s = share_max_over_mean(counts)
    assert s is None or s >= 1.0 - 1e-12


def test_summarize_hand_computed():
    results = [
        _ok(0, 0.0, 0.100, [0.010, 0.030], "a"),  # mean ITL 20 ms, e2e 140 ms
        _ok(1, 0.0, 0.300, [0.020, 0.020], "a"),  # TTFT breaks a 250 ms SLO
        _ok(2, 1.0, 0.200, [0.050, 0.070], "b"),  # mean ITL 60 ms breaks a 40 ms SLO
        _err(3, 1.0, "http_503", 503),
        _err(4, 1.5, "http_429", 429),
    ]
    m = summarize(results, slo_ttft_ms=250, slo_itl_ms=40, duration_s=2.0, replicas=["a", "b"])
    assert (m.requests, m.ok, m.errors) == (5, 3, 2)
    assert m.errors_by_kind == {"http_503": 1, "http_429": 1}
    assert m.ttft_p50_ms == pytest.approx(200.0)
    assert m.ttft_p90_ms == pytest.approx(280.0)  # 200 + 0.8*(300-200)
    # pooled ITL gaps [10, 20, 20, 30, 50, 70] ms: p50 = 25
    assert m.itl_p50_ms == pytest.approx(25.0)
    assert m.e2e_p50_ms == pytest.approx(320.0)  # e2e [140, 340, 320]
    assert m.request_per_s == pytest.approx(1.5)
    assert m.output_tok_per_s == pytest.approx(9 / 2.0)
    assert m.goodput_req_per_s == pytest.approx(0.5)  # only request 0 meets both SLOs
    assert m.replica_requests == {"a": 2, "b": 1}
    assert m.share_max_over_mean == pytest.approx(2 / 1.5)


def test_summarize_default_duration_spans_first_send_to_last_done():
    m = summarize([_ok(0, 10.0, 0.1, [0.1], "a"), _ok(1, 11.0, 0.5, [0.5], "a")], slo_ttft_ms=1e9, slo_itl_ms=1e9)
    assert m.duration_s == pytest.approx(2.0)


def test_meets_slo_single_token_has_no_itl():
    assert meets_slo(_ok(0, 0, 0.1, [], "a"), 200, 1)
    assert not meets_slo(_err(0, 0, "timeout", None), 1e9, 1e9)


def _snap(**reps):
    return parse_stats({"replicas": [{"replica_id": k, "prefix_cache_queries": q, "prefix_cache_hits": h,
                                      "num_requests": 0} for k, (q, h) in reps.items()]})


def test_prefix_hit_rate_from_counter_deltas():
    before = _snap(a=(1000, 500), b=(200, 0))
    after = _snap(a=(3000, 2100), b=(1200, 600))
    assert prefix_hit_rate(before, after) == pytest.approx((1600 + 600) / (2000 + 1000))
    # a replica born during the run counts from zero; a vanished one is gone
    assert prefix_hit_rate(before, _snap(a=(3000, 2100), c=(100, 50))) == pytest.approx(1650 / 2100)
    # a restarted replica (counters went backwards) counts from zero too
    assert prefix_hit_rate(before, _snap(a=(400, 100))) == pytest.approx(100 / 400)
    assert prefix_hit_rate(before, before) is None


def _run(name, ttft_ms):
    results = [_ok(i, 0.0, t / 1000, [0.01], "a" if i % 2 else "b") for i, t in enumerate(ttft_ms)]
    m = summarize(results, slo_ttft_ms=1000, slo_itl_ms=100, duration_s=1.0)
    m.prefix_hit_rate = 0.5
    return PolicyRun(name, m, results)


def test_json_has_exactly_the_issue_keys():
    out = result_json([_run("pow2", [100, 200]), _run("kvserve", [50, 60])], {"workload": "multi-tenant", "seed": 0})
    assert set(out) == {"policies", "workload"}
    assert list(out["policies"]) == ["pow2", "kvserve"]
    for v in out["policies"].values():
        assert tuple(v) == (*JSON_KEYS, "tenants")
        assert set(v["tenants"]) == {"default"}  # these requests carry no tenant
        assert v["tenants"]["default"]["requests"] == 2 and v["tenants"]["default"]["slo_attainment"] == 1.0
    assert out["policies"]["kvserve"]["ttft_p50_ms"] == pytest.approx(55.0)
    assert out["policies"]["pow2"]["errors"] == 0


def test_tenant_table_only_for_few_tenants():
    from rich.console import Console

    runs = [_run("pow2", [100, 3000]), _run("kvserve", [50, 60])]
    for r in runs:
        for i, res in enumerate(r.results):
            res.tenant = f"t{i}"
    console = Console(width=120, record=True)
    console.print(tenant_table(runs))
    text = console.export_text()
    assert "t0" in text and "t1" in text and "3000 / 0.00" in text and "60 / 1.00" in text
    many = [_run("pow2", [10.0] * (MAX_TENANT_ROWS + 1))]
    for i, res in enumerate(many[0].results):
        res.tenant = f"t{i}"
    assert tenant_table(many) is None


def test_requests_jsonl_one_line_per_request_in_send_order(tmp_path):
    import json

    a = _ok(0, 10.5, 0.2, [0.01], "r1")
    a.tenant, a.prompt_tokens, a.cached_tokens = "t3", 1030, 1008
    b = _err(1, 10.0, "http_503", 503)
    run = PolicyRun("kvserve", summarize([a, b], slo_ttft_ms=1000, slo_itl_ms=100, duration_s=1.0), [a, b])
    path = tmp_path / "req.jsonl"
    write_requests_jsonl(path, [run, _run("pow2", [100])])
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["policy"], r["idx"]) for r in rows] == [("kvserve", 1), ("kvserve", 0), ("pow2", 0)]
    assert all(tuple(r) == REQUEST_FIELDS for r in rows)
    first, second = rows[0], rows[1]
    assert first["ok"] is False and first["error"] == "http_503" and first["ttft_ms"] is None and first["sent_s"] == 0.0
    assert second["sent_s"] == pytest.approx(0.5) and second["ttft_ms"] == pytest.approx(200.0)
    assert (second["tenant"], second["replica"], second["cached_tokens"]) == ("t3", "r1", 1008)


def test_comparison_table_shows_ratios_vs_first():
    from rich.console import Console

    console = Console(width=250, record=True)
    console.print(comparison_table([_run("pow2", [100, 100]), _run("kvserve", [50, 50])]))
    text = console.export_text()
    assert "kvserve" in text and "(0.50×)" in text and "ratio vs pow2" in text


def test_timeline_buckets_per_second():
    t0 = 100.0
    results = [_ok(0, 100.2, 0.1, [0.1], "a"), _ok(1, 100.5, 0.7, [0.1], "a"), _ok(2, 101.1, 0.2, [2.0], "a")]
    samples = [StatsSample(100.9, 1, 0, 2, 0.1), StatsSample(101.9, 2, 1, 1, 0.2)]
    rows = build_timeline(results, samples, t0)
    assert [r.sent for r in rows] == [2, 1, 0, 0]
    assert [r.completed for r in rows] == [1, 1, 0, 1]  # done at 100.4, 101.3, 103.3
    assert rows[0].ttft_p90_ms == pytest.approx(100.0)
    assert rows[1].ttft_p90_ms == pytest.approx(200 + 0.9 * (700 - 200))  # first tokens at 101.2, 101.3
    assert [r.replicas for r in rows] == [1, 2, None, None]
    assert [r.inflight for r in rows] == [1, 1, 1, 0]


def test_ttft_breakdown_table_shows_each_layer_per_policy():
    from rich.console import Console

    from bench.report import ttft_breakdown_table

    plain, broken = _run("pow2", [100, 100]), _run("kvserve", [50, 50])
    assert ttft_breakdown_table([plain]) is None  # no server counters: no table
    layer = (lambda p50, mean: {"mean": mean, "p50": p50, "p90": None})
    broken.metrics.ttft_breakdown_ms = {"client": layer(50.0, 61.0), "ingress": layer(45.0, 55.0),
                                        "engine": layer(30.0, 40.0), "engine_queue": layer(None, None),
                                        "engine_prefill": layer(20.0, 25.0)}
    broken.metrics.engine_step_ms = 12.34
    console = Console(width=250, record=True)
    console.print(ttft_breakdown_table([plain, broken]))
    text = console.export_text()
    assert "50 / 61" in text and "20 / 25" in text and "12.3" in text and "- / -" in text
