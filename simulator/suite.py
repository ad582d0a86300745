"""`kvserve sim --suite autoscaling`: every autoscaler on a workload suite, scored against two bounds.

Per workload and load level ("cell"), per seed:
- the oracle (`simulator.oracle.oracle_replica_seconds`): the fewest replicas per minute that meet
  the SLO, in hindsight, with no start-up time;
- the causal bound: a script that asks for the oracle's count of the current minute the moment
  that minute starts (zero decision lag, no look-ahead) and pays the real start-up time;
- scripts that also pay what a policy pays (`simulator.bounds`): the hindsight start-up bound (the
  oracle's counts, each replica started ahead: the least cost of serving them with real start-up)
  and the lagged causal bounds (the oracle's counts seen late, through the policies' delay gate);
- each autoscaler, closed loop.
Tuning happens on the tune seeds; the report seeds are the result. Both are written, as medians.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import kvserve.profiles
from autoscaling.base import Decision, ScalingInput, ScalingPolicy
from kvserve.config import AutoscalingConfig, KVServeConfig
from kvserve.perf_model import EngineProfile
from router.registry import make_policy
from simulator import suite_workloads as sw
from simulator.bounds import HindsightStartup, LaggedScript, hindsight_replica_seconds, newreplica_hit_bound
from simulator.cluster import NEW_REPLICA_WINDOW_S, Cluster, RunResult, ScalingSetup
from simulator.engine import EngineSettings
from simulator.metrics import MINUTE_S, prefix_hit_rate, scale_up_window, slo_attainment
from simulator.oracle import oracle_replica_seconds, per_minute_ok
from simulator.runner import SimSetup, run_autoscaler, run_routing
from simulator.workloads import SimWorkload, TenantMix, diurnal_rate, generated, load_trace, step_rate

PROFILES = Path(kvserve.profiles.__file__).resolve().parent
H200, CPU = "h200-vllm0.24-llama8b-profile.json", "cpu-smollm2-135m.json"
SUITE_KEYS = ("slo_attainment", "replica_seconds", "oracle_replica_seconds", "causal_bound_attainment",
              "failed_requests", "newreplica_hit_rate")
# Each autoscaler's row also carries the bounds' numbers it is judged against (medians, like the rest).
BOUND_KEYS = ("newreplica_hit_bound", "hindsight_startup_bound_replica_seconds",
              "lagged_causal_bound_attainment", "lagged_causal_bound_replica_seconds")
ROW_KEYS = SUITE_KEYS + BOUND_KEYS
BOUNDS = ("causal_bound", "hindsight_startup_bound", "lagged_causal_bound", "lagged_window_bound")
AUTOSCALERS = ("serve_default", "kvserve")
COST_X = 1.2  # issue 27: median replica-seconds <= 1.2x the oracle's
ATTAINMENT_SLACK = 0.02  # issue 27: attainment >= the causal bound's - 0.02
PREWARM_X = 0.8  # issue 27: new replicas' hit rate in their first minute >= 0.8x the fleet's
NEW_REPLICA_S = NEW_REPLICA_WINDOW_S  # `newreplica_hit_rate`: requests a replica took in its first minute of serving
DURATION_S = 360.0  # 6 minutes per run: six attainment points; the whole suite fits ~10 min on 2 cores
MAX_REPLICAS = 8
TRACE_NAME = "mooncake_synthetic_trace.jsonl"


def command_line(module: str, argv: Sequence[str] | None) -> str:
    """A bench module's command line, with file arguments by name only (a result file names no machine's paths)."""
    args = list(sys.argv[1:] if argv is None else argv)
    return " ".join([f"python -m {module}"] + [Path(a).name if "/" in a else a for a in args])


def seed_list(spec: str) -> list[int]:
    """'0-9', '3', '0,2,5-7' -> sorted seeds; ValueError when none."""
    out: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.update(range(int(lo), int(hi) + 1))
        elif part:
            out.add(int(part))
    if not out:
        raise ValueError(f"no seeds in {spec!r}")
    return sorted(out)


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


def cell_setup(cell: Cell, seed: int) -> SimSetup:
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


def oracle_need(setup: SimSetup) -> tuple[Callable[[int], dict[int, bool]], list[int]]:
    """The oracle's replicas per minute, and the memoized fixed-count runs (minute -> SLO met) behind them."""
    slo, a = setup.cfg.slo, setup.cfg.autoscaling
    fixed_ok: dict[int, dict[int, bool]] = {}

    def fixed(n: int) -> dict[int, bool]:
        if n not in fixed_ok:
            res = run_routing(setup, "kvserve", replicas=n)
            fixed_ok[n] = per_minute_ok(res.requests, res.itl, slo)
        return fixed_ok[n]

    horizon = max((r.arrival for r in setup.workload.requests), default=0.0)
    _, need = oracle_replica_seconds(fixed, a.min_replicas, a.max_replicas, horizon)
    return fixed, need


def run_script(setup: SimSetup, script: ScalingPolicy, cfg: AutoscalingConfig, name: str) -> RunResult:
    """A scripted bound, closed loop on the cell's cluster (kvserve routing, real start-up)."""
    return Cluster(setup.workload, setup.profile, setup.engine, make_policy("kvserve", setup.cfg.router.params(), setup.seed),
                   replicas=0, router_cfg=setup.cfg.router,
                   scaling=ScalingSetup(script, cfg, setup.engine_start_s, setup.decision_interval_s), name=name,
                   max_ongoing=setup.cfg.server.max_ongoing_requests,
                   max_queued=setup.cfg.server.max_queued_requests).run()


def run_cell(cell: Cell, seed: int, autoscalers: tuple[str, ...] = AUTOSCALERS) -> dict[str, Any]:
    """One cell, one seed: {autoscaler: row} plus the causal bound's row."""
    setup = cell_setup(cell, seed)
    slo, a = setup.cfg.slo, setup.cfg.autoscaling
    fixed, need = oracle_need(setup)
    start, dt = setup.engine_start_s, setup.decision_interval_s
    # A scaled-up replica serves after its engine starts and its pre-warm (at most warm_timeout_s): the
    # hindsight bound asks that much ahead, so its replicas are up when the minute that needs them begins.
    lead = start + (a.warm_timeout_s if a.warm_prefixes else 0.0)
    initial = a.initial_replicas if a.initial_replicas is not None else a.min_replicas
    # The hindsight bound's minute-0 replicas are up at t=0: started before it, their start-up paid.
    ahead = a.model_copy(update={"initial_replicas": max(need[0], initial)})
    scripts = {
        "causal_bound": (ZeroLagScript(need), a),
        "hindsight_startup_bound": (HindsightStartup(need, lead + dt), ahead),
        # Lag: one decision interval (the soonest a policy deciding every `decision_interval_s` acts on
        # a change), or the policy's observation window (`autoscaling.look_back_s`); then the config's
        # `autoscaling.upscale_delay_s` / `downscale_delay_s` gate.
        "lagged_causal_bound": (LaggedScript(need, dt, a.upscale_delay_s, a.downscale_delay_s), a),
        "lagged_window_bound": (LaggedScript(need, a.look_back_s, a.upscale_delay_s, a.downscale_delay_s), a),
    }
    rows: dict[str, Any] = {}
    for name, (script, cfg) in scripts.items():
        rows[name] = _row(run_script(setup, script, cfg, name), slo, fixed, a)
    h = rows["hindsight_startup_bound"]
    h["replica_seconds"] += (ahead.initial_replicas - initial) * lead  # started (and warm budget paid) before t=0
    h["planned_replica_seconds"] = hindsight_replica_seconds(need, lead, h["end_s"], initial)
    for name in autoscalers:
        rows[name] = _row(run_autoscaler(setup, name, "kvserve"), slo, fixed, a)
    for row in rows.values():
        row["causal_bound_attainment"] = rows["causal_bound"]["slo_attainment"]
    rows["_params"] = {**setup.workload.params, "profile": cell.profile, "kv_blocks_per_replica": setup.engine.kv_blocks,
                       "block_tokens": setup.engine.block_size, "engine_start_s": start, "hindsight_lead_s": lead + dt,
                       "oracle_replicas_per_minute": need, "lagged_causal_bound_lag_s": dt,
                       "lagged_window_bound_lag_s": a.look_back_s, "upscale_delay_s": a.upscale_delay_s,
                       "downscale_delay_s": a.downscale_delay_s}
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
        **newreplica_hit_bound(res.requests, res.serving_since, NEW_REPLICA_S),
        "max_replicas_seen": max((row["existing"] for row in res.timeline), default=0),
        "end_s": res.end_time,
    }


def _median(values: list[Any]) -> float | None:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(vals) if vals else None


def summarize(per_seed: dict[int, dict[str, Any]], seeds: list[int]) -> dict[str, Any]:
    """Medians over `seeds` of each row's fields (the agreed keys under `autoscalers`, the bounds beside)."""
    names = [n for n in per_seed[seeds[0]] if not n.startswith("_")]
    med = {n: {k: _median([per_seed[s][n].get(k) for s in seeds]) for k in per_seed[seeds[0]][n]} for n in names}
    # The other bounds' numbers beside each autoscaler's (like causal_bound_attainment, but taken here: the
    # median of a bound's own rows is the median of their copies).
    beside = {f"{b}_{label}": med[b][k] for b in BOUNDS if b in med
              for k, label in (("slo_attainment", "attainment"), ("replica_seconds", "replica_seconds"))}
    out: dict[str, Any] = {"autoscalers": {n: {k: {**beside, **med[n]}.get(k) for k in ROW_KEYS}
                                           for n in names if n not in BOUNDS}}
    for b in BOUNDS:
        if b in med:
            keys = ("slo_attainment", "replica_seconds") if b == "causal_bound" else (
                "slo_attainment", "replica_seconds", "oracle_replica_seconds")
            out[b] = {k: med[b][k] for k in keys}
    out["details"] = {n: {k: v for k, v in med[n].items() if k not in ROW_KEYS} for n in names}
    out["targets"] = targets(out["autoscalers"], out)
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def targets(rows: dict[str, dict[str, Any]], bounds: dict[str, Any] | None = None) -> dict[str, Any]:
    """issue 27's bars for kvserve: attainment >= causal bound - 0.02; replica-seconds <= 1.2x the
    oracle's; never worse than serve_default on both at once; new replicas' hit >= 0.8x the fleet's.

    Each against its bound (`bounds`: summarize's rows). Cost: `beyond_bound` when a bound that pays
    real start-up (hindsight, or the lagged causal one) costs more than 1.2x the oracle at an attainment
    no higher than kvserve's + 0.02; `reachable` when the lagged causal bound costs <= 1.2x at an
    attainment >= kvserve's - 0.02; else `unclear`. Pre-warm: `beyond_bound` when even a replica holding
    every block the fleet had cached (`newreplica_hit_bound`) would hit < 0.8x the fleet's."""
    k, sd = rows.get("kvserve"), rows.get("serve_default")
    if k is None:
        return {}
    oracle, rs, att = k["oracle_replica_seconds"], k["replica_seconds"], k["slo_attainment"]
    out: dict[str, Any] = {
        "attainment_vs_causal": att >= k["causal_bound_attainment"] - ATTAINMENT_SLACK,
        "cost_vs_oracle": rs <= COST_X * oracle,
        "cost_over_oracle": _ratio(rs, oracle),
    }
    if sd is not None:
        out["not_worse_than_serve_default"] = not (
            att < sd["slo_attainment"] and rs > sd["replica_seconds"])
    if bounds is None or "lagged_causal_bound" not in bounds:
        return out
    hs, lag = bounds["hindsight_startup_bound"], bounds["lagged_causal_bound"]
    out.update({
        "cost_over_hindsight_startup_bound": _ratio(rs, hs["replica_seconds"]),
        "cost_over_lagged_causal_bound": _ratio(rs, lag["replica_seconds"]),
        "hindsight_startup_bound_over_oracle": _ratio(hs["replica_seconds"], oracle),
        "lagged_causal_bound_over_oracle": _ratio(lag["replica_seconds"], oracle),
        "attainment_minus_lagged_causal_bound": att - lag["slo_attainment"],
    })
    if out["cost_vs_oracle"]:
        out["cost_verdict"] = "met"
    elif any(b["replica_seconds"] > COST_X * oracle and b["slo_attainment"] <= att + ATTAINMENT_SLACK
             for b in (hs, lag)):
        out["cost_verdict"] = "beyond_bound"
    elif lag["replica_seconds"] <= COST_X * oracle and lag["slo_attainment"] >= att - ATTAINMENT_SLACK:
        out["cost_verdict"] = "reachable"
    else:
        out["cost_verdict"] = "unclear"
    hit, bound = bounds["details"]["kvserve"].get("newreplica_hit_ratio"), k.get("newreplica_hit_bound")
    if hit is not None and bound is not None:
        out["prewarm_vs_fleet"] = hit >= PREWARM_X
        out["prewarm_verdict"] = "met" if hit >= PREWARM_X else ("beyond_bound" if bound < PREWARM_X else "missed")
    return out


def map_cells(job: Callable[[tuple[Any, ...]], tuple[str, int, Any]], todo: list[Cell], seeds: list[int],
              extra: tuple[Any, ...], jobs: int = 2,
              progress: Callable[[str, int], None] | None = None) -> dict[str, dict[int, Any]]:
    """{cell: {seed: job's result}} for every cell in `todo` and seed, on a process pool. `job` gets
    (cell name, seed, *extra) and returns (cell name, seed, result): by name, since a worker process
    rebuilds the cell (its workload builder does not pickle). A seed-free workload (the shared trace)
    runs once and stands for every seed."""
    # Slowest first (the trace), so that the pool's last minutes are not one long job.
    tasks = [(c.name, s, *extra) for c in sorted(todo, key=lambda c: c.seeded)
             for s in (seeds if c.seeded else seeds[:1])]
    results: dict[str, dict[int, Any]] = {}
    with ProcessPoolExecutor(max_workers=max(jobs, 1)) as pool:
        for name, seed, res in pool.map(job, tasks):
            results.setdefault(name, {})[seed] = res
            if progress:
                progress(name, seed)
    for c in todo:
        if not c.seeded:
            results[c.name] = {s: results[c.name][seeds[0]] for s in seeds}
    return results


def _job(args: tuple[str, int, Path | None, tuple[str, ...]]) -> tuple[str, int, dict[str, Any]]:
    name, seed, trace, autoscalers = args
    return name, seed, run_cell(next(c for c in cells(trace) if c.name == name), seed, autoscalers)


def run_suite(seeds: list[int], tune_seeds: list[int], trace: Path | None, jobs: int = 2,
              autoscalers: tuple[str, ...] = AUTOSCALERS, only: str | None = None,
              progress: Callable[[str, int], None] | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    todo = [c for c in cells(trace) if only is None or c.name.startswith(only)]
    results = map_cells(_job, todo, seeds, (trace, autoscalers), jobs, progress)
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
