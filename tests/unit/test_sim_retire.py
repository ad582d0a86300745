"""The simulator's scale-down picks its victim as asked (`ScalingSetup.retire`): Serve's newest-first, or
the replica of least cache loss (router/retire.py) from the router's own feeds."""

from __future__ import annotations

import pytest

from kvserve.config import AutoscalingConfig
from router.retire import retire_order
from simulator.cluster import Cluster, ScalingSetup
from simulator.engine import DRAINING, GONE, EngineSettings
from simulator.retire_ab import after_scale_downs, new_replicas
from simulator.workloads import TenantMix, generated
from router.registry import make_policy
from tests.unit.test_sim_autoscaling import Scripted
from tests.unit.test_sim_cluster import LINEAR


def _cluster(retire: str) -> Cluster:
    mix = TenantMix(tenants=6, system_tokens=32, question_tokens=8, output_tokens=20)
    wl = generated("step", mix, 4, rate=20.0, phase_s=10.0, seed=1)
    eng = EngineSettings(block_size=4, kv_blocks=64, max_num_seqs=4, max_batched_tokens=64)
    sc = ScalingSetup(Scripted(high=3, t_up=2.0, t_down=15.0), AutoscalingConfig(min_replicas=1, max_replicas=3,
                      drain_grace_s=1000.0), start_s=1.0, decision_interval_s=0.5, retire=retire)
    return Cluster(wl, LINEAR, eng, make_policy("kvserve"), replicas=0, scaling=sc)


def test_newest_retires_the_newest_serving_replicas():
    c = _cluster("newest")
    res = c.run()
    assert res.scale_downs
    drained = {rid for rid, rep in c.replicas.items() if rep.drain_started is not None}
    assert drained == {"r0001", "r0002"}  # the survivor is the oldest, r0000


def test_cache_retires_the_replicas_retire_order_names(monkeypatch):
    picked: list[tuple[list[str], list[str]]] = []
    c = _cluster("cache")
    real = c._victims

    def spy(serving, n, now):  # type: ignore[no-untyped-def]
        out = real(serving, n, now)
        if n:
            held = c.recency.holdings([r.rid for r in serving])
            assert any(held.values()), "the recency feed saw the routed blocks"
            picked.append(([r.rid for r in out], retire_order(held, now, n=n)))
        return out

    monkeypatch.setattr(c, "_victims", spy)
    res = c.run()
    assert picked and all(got == want for got, want in picked)
    assert res.failed_requests == 0
    assert all(rep.state in (GONE, DRAINING) or rep.drain_started is None for rep in c.replicas.values())
    summary = after_scale_downs(res, 60.0)
    assert summary["scale_downs"] == len(res.scale_downs) and summary["requests"] > 0
    assert 0.0 <= summary["hit_rate"] <= 1.0
    fresh = new_replicas(res, 60.0)
    assert fresh["new_replicas"] == 2 and fresh["newreplica_hit_rate"] is not None


@pytest.mark.parametrize("retire", ["least_loaded", "newest", "cache"])
def test_every_choice_loses_no_request(retire):
    res = _cluster(retire).run()
    assert res.failed_requests == 0 and all(r.finished is not None for r in res.requests)


def test_seen_before_counts_the_leading_blocks_any_earlier_request_had():
    from simulator.engine import SimRequest
    from simulator.retire_ab import seen_before

    reqs = [SimRequest(0, 0.0, 8, 1, [1, 2], 3), SimRequest(1, 1.0, 12, 1, [1, 2, 3], 4),
            SimRequest(2, 2.0, 12, 1, [1, 9, 3], 4), SimRequest(3, 0.5, 4, 1, [7], 2)]
    assert seen_before(reqs) == {0: 0, 3: 0, 1: 2, 2: 1}  # in arrival order; a chain stops at its first miss


def test_the_ab_reports_medians_per_workload_and_choice_and_names_no_paths(tmp_path):
    import json

    from simulator.retire_ab import main

    out_file = tmp_path / "retire.json"
    main(["--workloads", "drift", "--seeds", "0", "--retire", "newest,cache", "--rate", "2", "--phase-s", "30",
          "--tenants", "6", "--kv-blocks", "2000", "--json", str(out_file)])
    out = json.loads(out_file.read_text())
    assert set(out["workloads"]["drift"]) == {"newest", "cache"}
    med = out["workloads"]["drift"]["cache"]["median"]
    assert {"hit_rate_after_scale_down", "newreplica_hit_rate", "slo_attainment"} <= set(med)
    assert all("/" not in str(out["params"][k]) for k in ("profile", "json"))
