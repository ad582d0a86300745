"""Noisy neighbour: the simulated off / on / solo runs, and the live bench's pure summary."""

from __future__ import annotations

import json
from pathlib import Path

from bench.client import RequestResult
from bench.noisy_neighbour import AGGRESSOR, VICTIMS, schedule, summarize, targets
from kvserve.config import load_config
from kvserve.perf_model import EngineProfile
from simulator.engine import EngineSettings
from simulator.noisy_neighbour import NoisyMix, noisy_neighbour
from simulator.runner import PACKAGED_PROFILE, SimSetup, router_config_for


def test_simulated_flow_control_protects_the_victims_and_turns_the_aggressor_away() -> None:
    cfg = load_config(None, {}, environ={})
    prof = EngineProfile.from_dict(json.loads(Path(PACKAGED_PROFILE).read_text()), source="test")
    cfg = router_config_for(cfg, prof, set())
    eng = EngineSettings(block_size=prof.block_size, kv_blocks=prof.kv_cache_tokens // prof.block_size,
                         max_num_seqs=16, max_batched_tokens=2048)
    out = noisy_neighbour(SimSetup(None, prof, eng, cfg, 1, 0), NoisyMix(duration_s=20.0))  # type: ignore[arg-type]
    assert set(out["runs"]) == {"off", "on", "solo"}
    on, off = out["runs"]["on"]["tenants"], out["runs"]["off"]["tenants"]
    assert set(on) == {*VICTIMS, AGGRESSOR} and set(out["runs"]["solo"]["tenants"]) == set(VICTIMS)
    assert all(on[v]["status_503"] == 0 and on[v]["errors"] == 0 for v in VICTIMS)
    assert on[AGGRESSOR]["status_503"] > 0
    for v in VICTIMS:  # the damage with it off, undone with it on
        assert on[v]["ttft_p90_ms"] < off[v]["ttft_p90_ms"] / 5
    assert out["runs"]["on"]["jain_fairness"] >= 0.95
    t = out["targets"]
    assert t["victims_turned_away"]["met"] and t["jain_fairness"]["met"]
    assert all(x >= 1.0 for x in t["victim_p90_over_solo"]["lowest_possible_per_victim"].values())


def _res(tenant: str, ttft: float | None, status: int = 200) -> RequestResult:
    ok = status == 200
    return RequestResult(0, 0.0, ok=ok, status=status, ttft_s=ttft, output_tokens=16 if ok else 0,
                         prompt_tokens=1030 if ok else None, cached_tokens=1024 if ok else None, tenant=tenant)


def test_live_summary_counts_statuses_and_fairness() -> None:
    results = [_res("victim-0", 0.1), _res("victim-0", 0.3), _res(AGGRESSOR, 2.0), _res(AGGRESSOR, None, 503),
               _res(AGGRESSOR, None, 429)]
    s = summarize(results, 10.0, 500.0)
    v, a = s["tenants"]["victim-0"], s["tenants"][AGGRESSOR]
    assert (v["status_503"], a["status_503"], a["status_429"], a["errors"]) == (0, 1, 1, 0)
    assert v["output_tok_per_s"] == 3.2 and v["ttft_slo_attainment"] == 1.0 and a["ttft_slo_attainment"] == 0
    assert 0 < s["jain_fairness"] <= 1
    runs = {"solo": {"tenants": {"victim-0": {"ttft_p90_ms": 100.0}}}, "on": s, "off": {"output_tok_per_s": 10.0}}
    t = targets(runs)
    assert t["victim_p90_over_solo"]["value"] == 3.0 and not t["victim_p90_over_solo"]["met"]
    assert t["victims_turned_away"]["met"] and t["victims_turned_away"]["aggressor"] == 2


def test_each_tenant_has_its_own_seeded_poisson_stream() -> None:
    a = schedule({"victim-0": 1.0, AGGRESSOR: 10.0}, 60.0, 0)
    assert a == sorted(a) and all(0 <= t < 60 for t, _ in a)
    n_agg = sum(1 for _, t in a if t == AGGRESSOR)
    assert 8 < n_agg / max(1, len(a) - n_agg) < 12
    assert schedule({"victim-0": 1.0}, 60.0, 0) == [x for x in a if x[1] == "victim-0"]


def test_live_bench_runs_three_deployments_against_the_fake_server() -> None:
    from bench.fake_server import FakeBehaviour, FakeKVServe, ServerThread
    from bench.fake_tokenizer import FakeTokenizer
    from bench.noisy_neighbour import NoisyOptions, run_noisy
    from bench.tokens import SafeVocab
    from kvserve.config import KVServeConfig

    deployed: list[bool] = []
    fake = FakeKVServe(FakeBehaviour(first_token_s=0.01, itl_s=0.001))
    with ServerThread(fake.app) as srv:
        out = run_noisy(KVServeConfig(num_replicas=1, engine={"max_num_seqs": 2}), srv.url, SafeVocab(FakeTokenizer()),
                        NoisyOptions(system_tokens=20, question_tokens=5, output_tokens=3, duration_s=1.5),
                        lambda cfg: deployed.append(cfg.flow.enabled), lambda _msg: None)
    assert deployed == [False, False, True]  # solo, off, on
    assert set(out["runs"]) == {"solo", "off", "on"} and out["workload"]["capacity_req_per_s"] > 0
    assert set(out["runs"]["on"]["tenants"]) == {*VICTIMS, AGGRESSOR}
    assert out["runs"]["solo"]["tenants"]["victim-0"]["errors"] == 0
    assert len(fake.bodies) == sum(r["requests"] for run in out["runs"].values() for r in run["tenants"].values()) \
        + 4 + 5 + 5 + 32  # + the unmeasured warm-ups (solo, off, on) and the capacity probe
