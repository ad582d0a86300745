"""The fault and soak benches' arithmetic: what counts as lost, hit rates around the fault, growth."""

from __future__ import annotations

import pytest

from bench.chaos import Fault, Poll, summarize
from bench.client import RequestResult
from bench.soak import summarize as soak_summary
from bench.timed_bench import check_options, requests_for
from bench.timed_load import parse_duration

T0 = 100.0


def _r(start_s: float, ok: bool = True, *, out: int = 4, took: float = 1.0, status: int | None = 200,
       error: str | None = None, prompt: int = 100, cached: int = 80, replica: str = "a",
       detail: str | None = None) -> RequestResult:
    r = RequestResult(idx=0, start=T0 + start_s, ok=ok, status=status, error=error, error_detail=detail,
                      output_tokens=out,
                      prompt_tokens=prompt if ok else None, cached_tokens=cached if ok else None, replica=replica)
    r.elapsed_s = took
    r.ttft_s = 0.1 if out else None
    r.e2e_s = took if ok else None
    return r


def test_parse_duration():
    assert parse_duration("30m") == 1800 and parse_duration("180s") == 180 and parse_duration("90") == 90
    assert parse_duration("1h") == 3600
    with pytest.raises(ValueError):
        parse_duration("0s")


def test_options():
    assert check_options(None, None, None) is None
    assert check_options("2m", "kill-engine", 1.0) == 120
    for bad in [("2m", None, None), (None, "kill-engine", 1.0), ("2m", "unplug", 1.0)]:
        with pytest.raises(ValueError):
            check_options(*bad)
    assert requests_for(1.0, 100) >= 100


def test_replica_fault_counts_unstarted_failures_as_lost_and_cut_streams_apart():
    fault = Fault("kill-engine", at_s=60.0, wall=1000.0, victim="a", pid=1)
    results = [
        _r(10), _r(59.5, took=2.0),  # before; one in flight at the fault, fine
        _r(59.8, ok=False, out=3, error="stream_error", took=1.0),  # cut mid-stream, with an event
        _r(59.9, ok=False, out=2, error="protocol: RemoteProtocolError", took=1.0),  # cut, no event
        _r(61, ok=False, out=0, status=503, error="http_503", detail="code: engine_dead"),  # lost
        _r(62, ok=False, out=0, status=503, error="http_503", detail="code: service_unavailable"),  # shed
        _r(70, cached=0, replica="c"), _r(90, replica="c"),
    ]
    polls = [Poll(59.0, ["a", "b"], True), Poll(60.4, ["a", "b"], True, {"a": {"at": 1000.6, "reason": "engine_dead"}}),
             Poll(61.0, ["b"], False), Poll(75.0, ["b", "c"], True)]
    s = summarize(fault, results, polls, T0, ["a", "b"], window_s=60.0)
    assert s["lost"] == 1 and s["shed_overloaded"] == 1
    assert s["cut_mid_stream"] == 2 and s["cut_with_error_event"] == 1
    assert s["errors_by_status"] == {"stream_error": 1, "protocol: RemoteProtocolError": 1, "503": 2}
    assert s["time_to_drop_s"] == 0.6 and s["drop_reason"] == "engine_dead"
    assert s["time_to_replacement_listed_s"] == 15.0 and s["time_to_ready_again_s"] == 15.0
    assert s["requests_on_replacement"] == 2
    assert s["time_to_replacement_serving_s"] == pytest.approx(10.1)
    assert s["time_to_replacement_cache_hit_s"] == pytest.approx(30.1)  # the first one there missed
    assert s["hit_rate_before"] == pytest.approx(0.8) and s["hit_rate_after"] == pytest.approx(0.4)
    assert s["hit_rate_delta_points"] == pytest.approx(-40.0)


def test_ingress_restart_excuses_only_requests_in_flight_on_the_killed_process():
    fault = Fault("restart-ingress", at_s=60.0, wall=1000.0, victim="ingress", pid=1)
    results = [
        _r(59.0, ok=False, out=0, status=None, error="protocol: RemoteProtocolError", took=2.0),  # in flight
        _r(65.0, ok=False, out=0, status=500, error="http_5xx"),  # sent after: lost
        _r(80.0),
    ]
    s = summarize(fault, results, [], T0, ["a", "b"])
    assert s["lost"] == 1 and s["failed_in_flight_on_killed_process"] == 1
    assert s["time_to_serving_again_s"] == pytest.approx(21.0)
    assert s["time_to_drop_s"] is None


def test_soak_growth_is_measured_from_the_warmup_end():
    def sample(at, rss, fds):  # type: ignore[no-untyped-def]
        u = {"rss_mib": rss, "fds": fds, "tree_rss_mib": rss, "tree_fds": fds}
        return {"at_s": at, "procs": {"ingress": u, "replica:a": dict(u, tree_rss_mib=2 * rss)}}

    samples = [sample(0, 50, 10), sample(60, 100, 20), sample(120, 102, 20), sample(180, 103, 21)]
    s = soak_summary(samples, duration_s=180)
    assert s["warmup_s"] == 60
    ing = s["processes"]["ingress"]
    assert ing["rss_mib_at_warmup"] == 100 and ing["rss_mib_growth_pct"] == 3.0 and ing["rss_mib_max"] == 103
    assert s["max_rss_growth_pct"] == 3.0 and s["rss_growth_under_limit"] and s["fds_flat"]
    s = soak_summary(samples + [sample(240, 120, 40)], duration_s=240)
    assert not s["rss_growth_under_limit"] and not s["fds_flat"]
