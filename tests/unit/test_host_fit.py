"""bench.host_fit: the host path of a live run's typical request, a line over streams per replica, and the
simulator taking it from the profile."""

from __future__ import annotations

import json

import pytest

from bench.host_fit import fit_line, host_point, main


def _run(concurrency: int, client: float, queue: float, prefill: float) -> dict:
    layer = (lambda p50: {"mean": None, "p50": p50, "p90": None})
    return {"workload": {"concurrency": concurrency},
            "policies": {"kvserve": {"replicas": 4, "ttft_breakdown_ms": {
                "client": layer(client), "engine_queue": layer(queue), "engine_prefill": layer(prefill)}}}}


def test_a_runs_host_path_is_the_client_median_less_the_engines():
    assert host_point(_run(64, 172.0, 1.0, 85.0), "kvserve") == (16.0, 86.0)


def test_the_line_is_least_squares_and_never_negative():
    assert fit_line([(4.0, 54.0), (16.0, 90.0)]) == pytest.approx((42.0, 3.0))
    assert fit_line([(4.0, 50.0)]) == (50.0, 0.0)  # one load: flat
    assert fit_line([(4.0, 90.0), (16.0, 54.0)]) == (72.0, 0.0)  # falling with load: no negative slope
    assert fit_line([(4.0, 0.0), (16.0, 120.0)])[0] == 0.0  # no negative base


def test_the_fit_lands_in_the_profile_and_the_simulator_charges_it(tmp_path):
    from kvserve.perf_model import EngineProfile

    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"kv_cache_tokens": 1000, "prefill": [{"prompt_tokens": 100, "ttft_ms": 10.0}],
                                "decode": [{"context_tokens": 100, "batch": 1, "itl_ms": 5.0}]}))
    assert EngineProfile.load(prof).host_ms(8) == 0.0  # no measurement: no host path
    runs = []
    for i, (c, client) in enumerate(((16, 66.0), (64, 102.0))):
        runs.append(tmp_path / f"r{i}.json")
        runs[-1].write_text(json.dumps(_run(c, client, 1.0, 11.0)))
    main([str(prof), *map(str, runs)])
    p = EngineProfile.load(prof)
    assert (p.host_base_ms, p.host_ms_per_stream) == pytest.approx((42.0, 3.0))
    assert p.host_ms(10) == pytest.approx(72.0)
