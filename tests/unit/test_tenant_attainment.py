"""Per-tenant SLO attainment (flow.attainment) and its use by `kvserve bench` and `kvserve sim`."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.client import RequestResult
from bench.tenant_slo import key_tenant, targets_of, tenants_json
from flow.attainment import Outcome, per_tenant, slo_attainment, tenant_targets, ttft_attainment
from flow.tiers import Tier
from kvserve.config import KVServeConfig
from kvserve.policy_params import SLOTargets
from simulator.engine import EngineSettings
from simulator.runner import SimSetup, routing_summary, run_routing
from simulator.workloads import SimWorkload
from tests.unit.test_sim_cluster import mk
from tests.unit.test_sim_runner import OFFSET

GOLD_KEY = "sk-gold"


def _cfg() -> KVServeConfig:
    return KVServeConfig.model_validate({
        "slo": {"ttft_p90_ms": 2000, "itl_p90_ms": 100},
        "tenants": {
            "classes": {"gold": {"ttft_p90_ms": 20}, "fast_decode": {"itl_p90_ms": 5}},
            "keys": [{"tenant": "gold", "class": "gold", "key_sha256": hashlib.sha256(GOLD_KEY.encode()).hexdigest()},
                     {"tenant": "chat", "class": "fast_decode", "key_sha256": "0" * 64}],
        },
    })


def test_attainment_hand_examples() -> None:
    t = SLOTargets(100.0, 10.0)
    assert slo_attainment([], t) is None
    outs = [
        Outcome("a", 50.0, 5.0),  # within both
        Outcome("a", 100.0),  # at the target counts; ITL not measured
        Outcome("a", 150.0, 5.0),  # TTFT late
        Outcome("a", 50.0, 11.0),  # ITL late
        Outcome("a", None, error=True),  # failed
        Outcome("a", 10.0, 1.0, error=True),  # an error misses whatever it measured
    ]
    assert slo_attainment(outs, t) == pytest.approx(2 / 6)
    assert ttft_attainment([10.0, None, 300.0, 200.0], 200.0) == 0.5


def test_class_targets_fall_back_to_the_cluster_per_target() -> None:
    of = tenant_targets(SLOTargets(2000.0, 100.0), {"gold": Tier(20.0, None), "fast": Tier(None, 5.0)},
                        {"g": "gold", "f": "fast", "x": "missing"})
    assert of("g") == SLOTargets(20.0, 100.0)
    assert of("f") == SLOTargets(2000.0, 5.0)
    assert of("x") == of("nobody") == SLOTargets(2000.0, 100.0)


def test_per_tenant_block() -> None:
    outs = [Outcome("b", 10.0), Outcome("a", 30.0), Outcome("a", 10.0), Outcome("a", None, error=True)]
    got = per_tenant(outs, lambda t: SLOTargets(20.0 if t == "a" else 5.0, 1.0))
    assert list(got) == ["a", "b"]
    assert got["a"] == {"requests": 3, "ttft_p50_ms": 20.0, "ttft_p90_ms": 28.0, "slo_attainment": pytest.approx(1 / 3),
                        "errors": 1}
    assert got["b"] == {"requests": 1, "ttft_p50_ms": 10.0, "ttft_p90_ms": 10.0, "slo_attainment": 0.0, "errors": 0}


_outcome = st.builds(Outcome, st.just("t"), st.none() | st.floats(0, 1e5), st.none() | st.floats(0, 1e3), st.booleans())


@given(st.lists(_outcome, min_size=1, max_size=40), st.floats(1e-3, 1e5), st.floats(1e-3, 1e5),
       st.floats(0, 1e5), st.floats(0, 1e3))
def test_attainment_in_unit_interval_and_monotone_in_the_targets(outs, ttft, itl, more_ttft, more_itl) -> None:  # type: ignore[no-untyped-def]
    a = slo_attainment(outs, SLOTargets(ttft, itl))
    looser = slo_attainment(outs, SLOTargets(ttft + more_ttft, itl + more_itl))
    assert a is not None and looser is not None
    assert 0.0 <= a <= looser <= 1.0
    assert a * len(outs) == pytest.approx(round(a * len(outs)))  # a count of requests over the count


def _res(idx: int, tenant: str, ttft_s: float | None, itl: list[float], ok: bool = True) -> RequestResult:
    return RequestResult(idx=idx, start=0.0, ok=ok, status=200 if ok else 503, ttft_s=ttft_s, itl_s=itl, tenant=tenant)


def test_bench_tenants_use_each_class_target() -> None:
    cfg = _cfg()
    targets = targets_of(cfg.tenants, cfg.slo.params())
    results = [
        _res(0, "gold", 0.015, [0.01]), _res(1, "gold", 0.030, [0.01]),  # gold: 20 ms TTFT tier
        _res(2, "chat", 0.015, [0.004]), _res(3, "chat", 0.015, [0.006]),  # chat: 5 ms ITL tier
        _res(4, "t7", 0.030, [0.05]), _res(5, "t7", None, [], ok=False),  # unnamed tenant: the cluster's targets
    ]
    got = tenants_json(results, targets)
    assert {t: v["slo_attainment"] for t, v in got.items()} == {"chat": 0.5, "gold": 0.5, "t7": 0.5}
    assert got["t7"]["errors"] == 1 and got["t7"]["requests"] == 2 and got["t7"]["ttft_p90_ms"] == pytest.approx(30.0)
    # Without the tenants section, every tenant is held to the cluster's targets.
    assert tenants_json(results, targets_of(None, cfg.slo.params()))["gold"]["slo_attainment"] == 1.0


def test_bench_key_tenant_takes_every_request() -> None:
    cfg = _cfg()
    assert key_tenant(cfg, GOLD_KEY) == "gold"
    assert key_tenant(cfg, "sk-unknown") is None and key_tenant(None, GOLD_KEY) is None
    results = [_res(0, "t1", 0.015, []), _res(1, "t2", 0.030, [])]
    got = tenants_json(results, targets_of(cfg.tenants, cfg.slo.params()), key_tenant(cfg, GOLD_KEY))
    assert list(got) == ["gold"] and got["gold"]["slo_attainment"] == 0.5


def test_sim_routing_row_reports_each_tenant_against_its_class() -> None:
    # One idle replica, 5-token steps, prefill_ms(x) = x + 10: TTFTs 28, 14 and 14 ms (the third hits
    # its first block only: vLLM recomputes the whole last block of a fully cached prompt).
    reqs = [mk(0, 0.0, [1, 2], 1), mk(1, 1.0, [1, 2, 3], 1), mk(2, 2.0, [1, 2], 1)]
    reqs[0].tenant = reqs[1].tenant = "gold"
    reqs[2].tenant = "t9"
    eng = EngineSettings(block_size=4, kv_blocks=64, max_num_seqs=4, max_batched_tokens=5)
    setup = SimSetup(SimWorkload("t", reqs, 4), OFFSET, eng, _cfg(), replicas=1)
    row = routing_summary(run_routing(setup, "round_robin"), setup, {})
    assert row["tenants"]["gold"]["slo_attainment"] == 0.5  # 28 ms misses gold's 20 ms, 14 ms meets it
    assert row["tenants"]["gold"]["ttft_p50_ms"] == pytest.approx(21.0)
    assert row["tenants"]["t9"] == {"requests": 1, "ttft_p50_ms": pytest.approx(14.0), "ttft_p90_ms": pytest.approx(14.0),
                                    "slo_attainment": 1.0, "errors": 0}
