"""The serving-path floor table: TTFT added over bare per target, and kvserve's beyond Serve's two hops."""

from __future__ import annotations

import pytest

from bench.serving_floor import floor_table


def _run(target: str, ttft: float) -> dict:
    return {"target": target, "step_ms": 20.0, "tokens": 64, "runs": {"c1": {"ttft_p50_ms": ttft}}}


def test_added_ttft_is_measured_from_bare_and_from_the_two_hop_floor():
    t = floor_table([_run("bare", 26.0), _run("serve-floor-1hop", 33.0), _run("serve-floor", 41.5),
                     _run("kvserve", 44.0)])
    assert t["added_over_bare_ms"] == {"serve-floor-1hop": 7.0, "serve-floor": 15.5, "kvserve": 18.0}
    assert t["kvserve_over_two_hop_floor_ms"] == 2.5


def test_a_missing_target_is_an_error_not_a_partial_table():
    with pytest.raises(ValueError, match="serve-floor"):
        floor_table([_run("bare", 26.0), _run("kvserve", 30.0)])
