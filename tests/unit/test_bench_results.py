"""bench.results: one result file per benchmarks table, with per-seed medians computed by hand here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from bench.results import collect, main, over_seeds, rows


def _sim(seed: int, kv_p90: float, rr_p90: float | None = None, section: str = "policies") -> dict:
    run = {section: {"kvserve": {"ttft_p90_ms": kv_p90, "prefix_hit_rate": 0.5 + seed / 10}},
           "details": {"kvserve": {"ttft_p90_lower_bound_ms": 100.0, "per_minute": [{"minute": 0}], "hindsight": True,
                                   "itl_p90_ms": float("nan")}},
           "workload": {"workload": "multi-tenant", "seed": seed, "tenants": 16}}
    if rr_p90 is not None:
        run[section]["round_robin"] = {"ttft_p90_ms": rr_p90}
    return run


def test_rows_merge_numeric_details_and_drop_lists_flags_and_nan() -> None:
    assert rows(_sim(0, 300.0)) == {"kvserve": {"ttft_p90_ms": 300.0, "prefix_hit_rate": 0.5,
                                                "ttft_p90_lower_bound_ms": 100.0}}


def test_rows_of_an_autoscaling_run() -> None:
    assert set(rows(_sim(0, 1.0, section="autoscalers"))) == {"kvserve"}


def test_rows_refuse_a_file_without_policies_or_autoscalers() -> None:
    with pytest.raises(ValueError, match="policies or autoscalers"):
        rows({"p50_ms": 0.2})


def test_median_min_max_over_the_seeds_that_have_the_row() -> None:
    # round_robin only ran on seed 0 (a baseline run once): its statistics are that seed's alone.
    got = over_seeds([_sim(0, 300.0, rr_p90=900.0), _sim(1, 100.0), _sim(2, 200.0)])
    assert got["median"]["kvserve"]["ttft_p90_ms"] == 200.0
    assert got["min"]["kvserve"]["ttft_p90_ms"] == 100.0 and got["max"]["kvserve"]["ttft_p90_ms"] == 300.0
    assert got["median"]["kvserve"]["prefix_hit_rate"] == pytest.approx(0.6)
    assert got["median"]["round_robin"] == {"ttft_p90_ms": 900.0}
    assert got["seed_count"] == {"kvserve": 3, "round_robin": 1}
    assert list(got["seeds"]) == ["0", "1", "2"] and got["workload"] == {"workload": "multi-tenant", "tenants": 16}


def test_even_seed_count_takes_the_mean_of_the_middle_two() -> None:
    got = over_seeds([_sim(s, p90) for s, p90 in enumerate([400.0, 100.0, 300.0, 200.0])])
    assert got["median"]["kvserve"]["ttft_p90_ms"] == 250.0


def test_a_seed_given_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="seed 1 given twice"):
        over_seeds([_sim(1, 1.0), _sim(1, 2.0)])


def test_a_name_given_once_keeps_its_file_as_it_is() -> None:
    micro = {"replicas": 64, "p50_ms": 0.2, "p99_ms": 0.5}
    got = collect([("default_gc", micro), ("cpu", _sim(0, 1.0)), ("cpu", _sim(1, 3.0))])
    assert got["default_gc"] == micro
    assert got["cpu"]["median"]["kvserve"]["ttft_p90_ms"] == 2.0


def test_cli_writes_date_host_versions_note_and_runs(tmp_path: Path) -> None:
    files = []
    for s in (0, 1):
        files.append(tmp_path / f"s{s}.json")
        files[-1].write_text(json.dumps(_sim(s, 100.0 * (s + 1))))
    out = tmp_path / "results" / "t.json"
    app = typer.Typer()
    app.command()(main)
    r = CliRunner().invoke(app, [str(out), *(f"cpu={f}" for f in files), "--date", "2026-12-05", "--note", "n"])
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    assert data["date"] == "2026-12-05" and data["note"] == "n"
    assert data["versions"]["kvserve"] and data["host"]["logical_cpus"] >= 1
    assert data["runs"]["cpu"]["median"]["kvserve"]["ttft_p90_ms"] == 150.0


def test_cli_refuses_an_argument_without_a_name(tmp_path: Path) -> None:
    app = typer.Typer()
    app.command()(main)
    r = CliRunner().invoke(app, [str(tmp_path / "t.json"), str(tmp_path / "x.json")])
    assert r.exit_code != 0 and "NAME=FILE" in r.output


def test_cold_starts_are_read_from_the_ingress_histogram_as_a_delta():
    from bench.server_stats import ColdStarts, cold_start_delta, parse_cold_starts

    text = ("# TYPE kvserve_cold_start_ttft_seconds histogram\n"
            'kvserve_cold_start_ttft_seconds_bucket{le="+Inf"} 3.0\n'
            "kvserve_cold_start_ttft_seconds_count 3.0\n"
            "kvserve_cold_start_ttft_seconds_sum 150.0\n")
    after = parse_cold_starts(text)
    assert after == ColdStarts(3.0, 150.0)
    assert cold_start_delta(ColdStarts(1.0, 40.0), after) == (2, 55.0)
    assert cold_start_delta(ColdStarts(5.0, 400.0), after) == (3, 50.0)  # the ingress restarted
    assert cold_start_delta(after, after) == (0, None)
    assert cold_start_delta(None, None) == (None, None)
    assert parse_cold_starts("# nothing here\n") == ColdStarts()


def test_ttft_breakdown_takes_the_runs_deltas_outermost_first():
    from bench.server_stats import HistogramTotals, ReplicaCounters, parse_histogram, ttft_breakdown_ms
    from kvserve import latency_hist

    def hist(*ms: float) -> tuple[int, ...]:
        counts = latency_hist.new_counts()
        for x in ms:
            latency_hist.add(counts, x)
        return tuple(counts)

    def rc(rid: str, n: int, ttft: float, queued: float, prefill: float, ttfts=()) -> ReplicaCounters:
        return ReplicaCounters(rid, 0, 0, n, first_tokens=n, ttft_sum_s=ttft, finished=n, queued_sum_s=queued,
                               prefill_sum_s=prefill, ttft_hist=hist(*ttfts))

    before = {"a": rc("a", 10, 1.0, 0.2, 0.3, [500.0] * 10)}
    # "a" served 2 more requests (0.3 s of engine TTFT); "b" appeared during the run and counts from zero.
    after = {"a": rc("a", 12, 1.3, 0.22, 0.4, [500.0] * 10 + [100.0, 200.0]),
             "b": rc("b", 2, 0.1, 0.0, 0.02, [40.0, 60.0])}
    # The ingress's histogram comes as one series per tenant: they add up.
    text = "# TYPE kvserve_ttft_seconds histogram\n" + "".join(
        f'kvserve_ttft_seconds_bucket{{tenant="{t}",le="{le}"}} {c}\n'
        f'' for t, rows in (("x", (("0.1", 1), ("0.25", 3), ("+Inf", 3))), ("y", (("0.1", 0), ("0.25", 1), ("+Inf", 1))))
        for le, c in rows) + 'kvserve_ttft_seconds_count{tenant="x"} 3\nkvserve_ttft_seconds_sum{tenant="x"} 0.5\n' \
        + 'kvserve_ttft_seconds_count{tenant="y"} 1\nkvserve_ttft_seconds_sum{tenant="y"} 0.3\n'
    ingress = parse_histogram(text, "kvserve_ttft_seconds")
    assert (ingress.count, ingress.sum_s) == (4, pytest.approx(0.8))
    out = ttft_breakdown_ms([300.0, 200.0, 250.0, 250.0], before, after, HistogramTotals(), ingress)
    assert out["client"] == {"mean": 250.0, "p50": 250.0, "p90": 300.0}
    assert out["ingress"]["mean"] == pytest.approx(200.0)
    assert 100.0 < out["ingress"]["p50"] <= 250.0  # 1 of 4 under 100 ms, all 4 under 250 ms
    assert out["engine"]["mean"] == pytest.approx(100.0)  # (0.3 + 0.1) s over 4 first tokens
    assert 40.0 < out["engine"]["p50"] < 100.0 * latency_hist.RATIO  # 40, 60, 100, 200: the run's own four
    assert out["engine_queue"]["mean"] == pytest.approx(5.0)
    assert out["engine_prefill"]["mean"] == pytest.approx(30.0)
    # A server without kvserve's metrics or counters: unknown, not zero.
    blank = ttft_breakdown_ms([], {}, {}, None, None)
    assert all(v is None for layer in blank.values() for v in layer.values()), blank


def test_engine_counters_sum_vllms_first_token_and_finished_request_times():
    from types import SimpleNamespace

    from deployments.engine_stats import CounterStatLogger, EngineCounters

    logger = CounterStatLogger.__new__(CounterStatLogger)
    logger.counters = c = EngineCounters()
    seen = []
    c.on_iteration = lambda ttfts, itls, done: seen.append((ttfts, done))
    done = [SimpleNamespace(queued_time=0.01, prefill_time=0.05, num_generation_tokens=8)]
    it = SimpleNamespace(num_generation_tokens=3, prompt_token_stats=SimpleNamespace(total=100),
                         time_to_first_tokens_iter=[0.2, 0.1], inter_token_latencies_iter=[], finished_requests=done)
    logger.record(None, it)
    logger.record(None, SimpleNamespace(**{**vars(it), "time_to_first_tokens_iter": [], "finished_requests": done}))
    assert (c.first_tokens, c.finished) == (2, 2)
    assert c.ttft_sum_s == pytest.approx(0.3)
    assert (c.queued_sum_s, c.prefill_sum_s) == (pytest.approx(0.02), pytest.approx(0.1))
    assert (sum(c.ttft_hist), sum(c.queued_hist), sum(c.prefill_hist)) == (2, 2, 2)
    assert seen[0] == ([0.2, 0.1], [8])
    assert "on_iteration" not in c.as_dict() and c.as_dict()["ttft_sum_s"] == pytest.approx(0.3)


def test_engine_step_time_is_the_runs_duration_over_each_replicas_steps():
    from bench.server_stats import ReplicaCounters, engine_step_ms

    before = {"a": ReplicaCounters("a", 0, 0, 0, steps=100)}
    after = {"a": ReplicaCounters("a", 0, 0, 0, steps=300), "b": ReplicaCounters("b", 0, 0, 0, steps=100),
             "idle": ReplicaCounters("idle", 0, 0, 0)}
    assert engine_step_ms(before, after, 2.0) == pytest.approx((10.0 + 20.0) / 2)  # idle: no steps, not counted
    assert engine_step_ms({}, {}, 2.0) is None


def test_settled_stats_wait_for_counters_taken_after_the_call():
    import asyncio
    import time

    import httpx

    from bench.server_stats import fetch_settled_stats

    calls = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        # The board still holds the counters posted before the call, then the replica posts again.
        posted = time.time() - 5.0 if len(calls) < 3 else time.time()
        return httpx.Response(200, json={"replicas": [{"replica_id": "r0", "finished": len(calls),
                                                       "posted_at": posted}]})

    async def run(**kw):
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            return await fetch_settled_stats(client, "http://x", poll_s=0.01, **kw)

    assert asyncio.run(run())["r0"].finished == 3
    calls.clear()
    assert asyncio.run(run(timeout_s=0.0))["r0"].finished == 1  # past the timeout: what there is


def test_settled_stats_take_a_server_that_does_not_say_when_at_once():
    import asyncio

    import httpx

    from bench.server_stats import fetch_settled_stats

    transport = httpx.MockTransport(lambda r: httpx.Response(200, json={"replicas": [{"replica_id": "r0"}]}))

    async def run():
        async with httpx.AsyncClient(transport=transport) as client:
            return await fetch_settled_stats(client, "http://x", timeout_s=60.0)

    assert list(asyncio.run(run())) == ["r0"]
