"""`kvserve sim --suite autoscaling`: every autoscaler on a workload suite, scored against two bounds.

Per workload and load level ("cell"), per seed:
- the oracle (`simulator.oracle.oracle_replica_seconds`): the fewest replicas per minute that meet
  the SLO, in hindsight, with no start-up time;
- the causal bound: a script that asks for the oracle's count of the current minute the moment
  that minute starts (zero decision lag, no look-ahead) and pays the real start-up time;
- each autoscaler, closed loop.
Tuning happens on the tune seeds; the report seeds are the result. Both are written, as medians.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import kvserve.profiles
from autoscaling.base import Decision, ScalingInput, ScalingPolicy
from kvserve.config import KVServeConfig
from kvserve.perf_model import EngineProfile
from router.registry import make_policy
from simulator import suite_workloads as sw
from simulator.cluster import Cluster, ScalingSetup
from simulator.engine import EngineSettings
from simulator.metrics import MINUTE_S, prefix_hit_rate, scale_up_window, slo_attainment
from simulator.oracle import oracle_replica_seconds, per_minute_ok
from simulator.runner import SimSetup, run_autoscaler, run_routing
from simulator.workloads import SimWorkload, TenantMix, diurnal_rate, generated, load_trace, step_rate

PROFILES = Path(kvserve.profiles.__file__).resolve().parent
H200, CPU = "h200-vllm0.24-llama8b-profile.json", "cpu-smollm2-135m.json"
SUITE_KEYS = ("slo_attainment", "replica_seconds", "oracle_replica_seconds", "causal_bound_attainment",
              "failed_requests", "newreplica_hit_rate")
AUTOSCALERS = ("serve_default", "kvserve")
NEW_REPLICA_S = 60.0  # `newreplica_hit_rate`: requests a replica took in its first minute of serving
DURATION_S = 360.0  # 6 minutes per run: six attainment points; the whole suite fits ~10 min on 2 cores
MAX_REPLICAS = 8
TRACE_NAME = "mooncake_synthetic_trace.jsonl"


@dataclass(frozen=True)
class Cell:
    workload: str
    level: str
    profile: str
    build: Callable[[int], SimWorkload]
    seeded: bool = True  # False: the workload ignores the seed (the shared trace): simulated once

    @property
    def name(self) -> str:
        return f"{self.workload}/{self.level}" + ("/cpu" if self.profile == CPU else "")


def _tenant_load(kind: str, rate: float, mix: TenantMix) -> Callable[[int], SimWorkload]:
    # step/burst/diurnal over DURATION_S: phases of a third of it.
    return lambda seed: generated(kind, mix, sw.BLOCK, rate=rate, phase_s=DURATION_S / 3, seed=seed)


def _sessions(kind: str, shape: sw.SessionShape, rate: float) -> Callable[[int], SimWorkload]:
    # Sessions start along one compressed day (1x -> 3x -> 1x): the request rate follows, lagged
    # by how long sessions last.
    return lambda seed: sw.sessions(kind, shape, diurnal_rate(rate, DURATION_S, 3.0), 3.0 * rate, DURATION_S, seed)


def _heavy(rate: float) -> Callable[[int], SimWorkload]:
    return lambda seed: sw.heavy_tail(step_rate(rate, DURATION_S / 3, (1.0, 3.0, 1.0)), 3.0 * rate, DURATION_S, seed)


def cells(trace: Path | None) -> list[Cell]:
    """The suite. Rates put the oracle's peak at about 2 replicas (low) and 3-4 (high) of 8: a few
    hundred to ~1,500 requests a run, so the whole suite over 10 seeds simulates in ~10 minutes."""
    # Long unique questions (RAG-like) so that a few hundred requests load several H200 replicas.
    h200_mix = TenantMix(tenants=32, system_tokens=2048, question_tokens=12_288, output_tokens=200)
    cpu_mix = TenantMix(tenants=4, system_tokens=512, question_tokens=32, output_tokens=16)
    out = []
    for level, r in (("low", 0.5), ("high", 1.2)):
        out += [Cell("step", level, H200, _tenant_load("step", r, h200_mix)),
                Cell("diurnal", level, H200, _tenant_load("diurnal", r, h200_mix))]
    for level, r in (("low", 0.4), ("high", 0.9)):
        out.append(Cell("burst", level, H200, _tenant_load("burst", r, h200_mix)))
    for level, r in (("low", 0.25), ("high", 0.4)):
        out.append(Cell("conversations", level, H200, _sessions("conversations", sw.CONVERSATION, r)))
    for level, r in (("low", 0.08), ("high", 0.2)):
        out.append(Cell("agentic", level, H200, _sessions("agentic", sw.AGENTIC, r)))
    for level, r in (("low", 1.0), ("high", 2.5)):
        out.append(Cell("heavy_tail", level, H200, _heavy(r)))
    if trace is not None:
        for level, scale in (("x1", 1.0), ("x2", 0.5)):
            out.append(Cell("trace", level, H200, lambda seed, s=scale: load_trace(trace, time_scale=s), seeded=False))
    out.append(Cell("step", "low", CPU, _tenant_load("step", 2.0, cpu_mix)))
    out.append(Cell("conversations", "low", CPU, lambda seed: sw.sessions(
        "conversations", sw.SessionShape(512, (60, 0.5), (60, 0.5), (40, 0.5), (2, 8), 10.0, 3000),
        diurnal_rate(0.1, DURATION_S, 3.0), 0.3, DURATION_S, seed)))
    return out


class ZeroLagScript(ScalingPolicy):
    """The causal bound: the oracle's replicas for the current minute, asked for the moment it
    starts. Sees each minute's load with zero lag but no sooner; new replicas take their start-up."""

    name: ClassVar[str] = "causal_bound"

    def __init__(self, per_minute: list[int]) -> None:
        self.per_minute = per_minute

    def decide(self, inp: ScalingInput) -> Decision:
        m = min(int(inp.now // MINUTE_S), len(self.per_minute) - 1)
        return Decision(self.per_minute[m], f"oracle minute {m}")


def _setup(cell: Cell, seed: int) -> SimSetup:
    raw = json.loads((PROFILES / cell.profile).read_text())
    prof = EngineProfile.from_dict(raw, source=cell.profile)
    wl = cell.build(seed)
    cpu = cell.profile == CPU
    engine = EngineSettings(
        block_size=wl.block_size,
        kv_blocks=max(prof.kv_cache_tokens // wl.block_size, wl.max_request_blocks()),
        max_num_seqs=32,
        max_batched_tokens=2048 if cpu else 8192,  # the config's device defaults
    )
    cfg = KVServeConfig.model_validate({"autoscaling": {"enabled": True, "min_replicas": 1, "max_replicas": MAX_REPLICAS}})
    cfg = cfg.model_copy(update={"router": cfg.router.fitted_to(prof)})
    return SimSetup(wl, prof, engine, cfg, MAX_REPLICAS, seed, float(raw.get("engine_start_s", 30.0)), 1.0)


def run_cell(cell: Cell, seed: int, autoscalers: tuple[str, ...] = AUTOSCALERS) -> dict[str, Any]:
    """One cell, one seed: {autoscaler: row} plus the causal bound's row."""
    setup = _setup(cell, seed)
    slo, a = setup.cfg.slo, setup.cfg.autoscaling
    fixed_ok: dict[int, dict[int, bool]] = {}

    def fixed(n: int) -> dict[int, bool]:
        if n not in fixed_ok:
            res = run_routing(setup, "kvserve", replicas=n)
            fixed_ok[n] = per_minute_ok(res.requests, res.itl, slo)
        return fixed_ok[n]

    horizon = max((r.arrival for r in setup.workload.requests), default=0.0)
    _, need = oracle_replica_seconds(fixed, a.min_replicas, a.max_replicas, horizon)
    script = ScalingSetup(ZeroLagScript(need), a, setup.engine_start_s, setup.decision_interval_s)
    causal = Cluster(setup.workload, setup.profile, setup.engine, make_policy("kvserve", setup.cfg.router.params(), seed),
                     replicas=0, router_cfg=setup.cfg.router, scaling=script, name="causal_bound",
                     max_ongoing=setup.cfg.server.max_ongoing_requests, max_queued=setup.cfg.server.max_queued_requests).run()
    rows: dict[str, Any] = {"causal_bound": _row(causal, slo, fixed, a)}
    for name in autoscalers:
        rows[name] = _row(run_autoscaler(setup, name, "kvserve"), slo, fixed, a)
    for row in rows.values():
        row["causal_bound_attainment"] = rows["causal_bound"]["slo_attainment"]
    rows["_params"] = {**setup.workload.params, "profile": cell.profile, "kv_blocks_per_replica": setup.engine.kv_blocks,
                       "block_tokens": setup.engine.block_size, "engine_start_s": setup.engine_start_s,
                       "oracle_replicas_per_minute": need}
    return rows


def _row(res, slo, fixed, a) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    oracle_rs, _ = oracle_replica_seconds(fixed, a.min_replicas, a.max_replicas, res.end_time)
    new = scale_up_window(res.requests, res.serving_since, NEW_REPLICA_S)
    return {
        "slo_attainment": slo_attainment(res.requests, res.itl, slo),
        "replica_seconds": res.replica_seconds,
        "oracle_replica_seconds": oracle_rs,
        "failed_requests": res.failed_requests + res.overloaded_requests,
        "newreplica_hit_rate": new["scaleup_hit_rate"],
        "fleet_hit_rate": prefix_hit_rate(res.requests),
        "max_replicas_seen": max((row["existing"] for row in res.timeline), default=0),
    }


def _median(values: list[Any]) -> float | None:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(vals) if vals else None


def summarize(per_seed: dict[int, dict[str, Any]], seeds: list[int]) -> dict[str, Any]:
    """Medians over `seeds` of each row's fields (the agreed keys under `autoscalers`)."""
    names = [n for n in per_seed[seeds[0]] if not n.startswith("_")]
    med = {n: {k: _median([per_seed[s][n].get(k) for s in seeds]) for k in per_seed[seeds[0]][n]} for n in names}
    out = {"autoscalers": {n: {k: med[n][k] for k in SUITE_KEYS} for n in names if n != "causal_bound"},
           "causal_bound": {k: med["causal_bound"][k] for k in ("slo_attainment", "replica_seconds")},
           "details": {n: {k: v for k, v in med[n].items() if k not in SUITE_KEYS} for n in names}}
    out["targets"] = targets(out["autoscalers"])
    return out


def targets(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """issue 27's bars for kvserve: attainment >= causal bound - 0.02; replica-seconds <= 1.2x the
    oracle's; never worse than serve_default on both at once."""
    k, sd = rows.get("kvserve"), rows.get("serve_default")
    if k is None:
        return {}
    out = {
        "attainment_vs_causal": k["slo_attainment"] >= k["causal_bound_attainment"] - 0.02,
        "cost_vs_oracle": k["replica_seconds"] <= 1.2 * k["oracle_replica_seconds"],
        "cost_over_oracle": k["replica_seconds"] / k["oracle_replica_seconds"] if k["oracle_replica_seconds"] else None,
    }
    if sd is not None:
        out["not_worse_than_serve_default"] = not (
            k["slo_attainment"] < sd["slo_attainment"] and k["replica_seconds"] > sd["replica_seconds"])
    return out


def _job(args: tuple[str, Path | None, int, tuple[str, ...]]) -> tuple[str, int, dict[str, Any]]:
    # By name: a worker process rebuilds the cell (its workload builder does not pickle).
    name, trace, seed, autoscalers = args
    return name, seed, run_cell(next(c for c in cells(trace) if c.name == name), seed, autoscalers)


def run_suite(seeds: list[int], tune_seeds: list[int], trace: Path | None, jobs: int = 2,
              autoscalers: tuple[str, ...] = AUTOSCALERS, only: str | None = None,
              progress: Callable[[str, int], None] | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    todo = [c for c in cells(trace) if only is None or c.name.startswith(only)]
    # Slowest first (the trace), so that the pool's last minutes are not one long job.
    tasks = [(c.name, trace, s, autoscalers) for c in sorted(todo, key=lambda c: c.seeded)
             for s in (seeds if c.seeded else seeds[:1])]
    results: dict[str, dict[int, dict[str, Any]]] = {}
    with ProcessPoolExecutor(max_workers=max(jobs, 1)) as pool:
        for name, seed, rows in pool.map(_job, tasks):
            results.setdefault(name, {})[seed] = rows
            if progress:
                progress(name, seed)
    for c in todo:  # a seed-free workload: one run stands for every seed
        if not c.seeded:
            results[c.name] = {s: results[c.name][seeds[0]] for s in seeds}
    report = [s for s in seeds if s not in tune_seeds] or seeds
    tune = [s for s in seeds if s in tune_seeds]
    out: dict[str, Any] = {
        "suite": "autoscaling",
        "seeds": {"tune": tune, "report": report},
        "workloads": {n: summarize(r, report) for n, r in results.items()},
        "tuning": {"workloads": {n: summarize(r, tune) for n, r in results.items()}} if tune else {},
        "params": {n: r[seeds[0]]["_params"] for n, r in results.items()},
        "setup": {"duration_s": DURATION_S, "min_replicas": 1, "max_replicas": MAX_REPLICAS, "routing": "kvserve",
                  "decision_interval_s": 1.0, "slo": KVServeConfig().slo.model_dump(),
                  "new_replica_window_s": NEW_REPLICA_S},
        "per_seed": {n: {str(s): {a: row for a, row in rows.items() if not a.startswith("_")} for s, rows in r.items()}
                     for n, r in results.items()},
        "sim_wall_s": time.perf_counter() - t0,
    }
    return out
