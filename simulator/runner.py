"""Runs comparisons: several routing policies, or several autoscalers, on one workload.

Policies and autoscalers are built by the same registries the live cluster uses
(`router.registry.make_policy`, `autoscaling.registry.make_autoscaler`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kvserve.profiles
from autoscaling.registry import make_autoscaler
from kvserve.config import KVServeConfig
from kvserve.perf_model import EngineProfile
from router.registry import make_policy
from simulator.cluster import Cluster, RunResult, ScalingSetup
from simulator.engine import EngineSettings
from simulator.metrics import (
    MINUTE_S, latency_summary, percentile, prefix_hit_rate, scale_up_window, share_max_over_mean, slo_attainment,
)
from simulator.oracle import (
    infinite_hit_rate, oracle_hit_rate, oracle_replica_seconds, per_minute_ok, ttft_lower_bounds_ms,
)
from simulator.partition_oracle import best_static_partition
from simulator.slo_tiers import TieredTargets
from simulator.tenant_slo import tenants_json
from simulator.workloads import SimWorkload

ROUTING_KEYS = (
    "ttft_p50_ms", "ttft_p90_ms", "prefix_hit_rate", "oracle_hit_rate",
    "infinite_hit_rate", "share_max_over_mean", "slo_attainment", "replica_seconds", "tenants",
)
AUTOSCALING_KEYS = ("slo_attainment", "replica_seconds", "oracle_replica_seconds", "failed_requests", "tenants")

PACKAGED_PROFILE = Path(kvserve.profiles.__file__).resolve().parent / "h200-vllm0.24-llama8b-profile.json"
TRACE_CACHE_FILL = 0.7  # a trace's distinct blocks fill this fraction of the cluster's KV cache by default

Progress = Callable[[str, int, int], None]


def default_kv_blocks(workload: SimWorkload, replicas: int, profile: EngineProfile) -> int:
    """Per-replica KV capacity in the workload's blocks.

    Trace: sized so the trace's distinct blocks need TRACE_CACHE_FILL (70%) of the
    cluster's total cache -- ceil(distinct / (0.7 x replicas)) -- but never below the
    largest single request (it must fit on one replica). Generated workloads: the
    profile's measured capacity.
    """
    if workload.name == "trace":
        return max(math.ceil(workload.distinct_blocks() / (TRACE_CACHE_FILL * replicas)), workload.max_request_blocks())
    return max(profile.kv_cache_tokens // workload.block_size, workload.max_request_blocks())


def router_config_for(cfg: KVServeConfig, profile: EngineProfile, explicit: set[str]) -> KVServeConfig:
    """The router's cost slopes come from the profile the engines are simulated with, unless set explicitly.

    Both slopes (prefill ms/token, decode ms per running sequence) come from
    `RouterConfig.fitted_to`, so the router's cost model and the
    simulated engines agree on what a token and a running sequence cost.
    """
    fitted = cfg.router.fitted_to(profile)
    update = {k: getattr(fitted, k) for k in ("prefill_ms_per_token", "decode_ms_per_seq") if k not in explicit}
    if not update:
        return cfg
    return cfg.model_copy(update={"router": cfg.router.model_copy(update=update)})


@dataclass
class SimSetup:
    workload: SimWorkload
    profile: EngineProfile
    engine: EngineSettings
    cfg: KVServeConfig
    replicas: int
    seed: int = 0
    engine_start_s: float = 30.0
    decision_interval_s: float = 1.0


def run_routing(setup: SimSetup, policy_name: str, progress: Progress | None = None, replicas: int | None = None) -> RunResult:
    policy = make_policy(policy_name, setup.cfg.router.params(), setup.seed)
    cb = (lambda d, t: progress(policy_name, d, t)) if progress else None
    cluster = Cluster(
        setup.workload, setup.profile, setup.engine, policy,
        replicas=replicas or setup.replicas, router_cfg=setup.cfg.router, name=policy_name, on_progress=cb,
        max_ongoing=setup.cfg.server.max_ongoing_requests, max_queued=setup.cfg.server.max_queued_requests,
    )
    return cluster.run()


def ttft_p90_lower_bound_ms(res: RunResult, setup: SimSetup) -> float | None:
    """p90 over the run's served requests of the TTFT no router can beat (`oracle.ttft_lower_bounds_ms`)."""
    e = setup.engine
    lb = ttft_lower_bounds_ms(res.requests, setup.profile, e.block_size, e.max_batched_tokens)
    # Every request's blocks count as seen (failed ones may have cached some); only served ones are ranked.
    return percentile([b for b, r in zip(lb, res.requests) if r.first_token is not None and not r.failed], 90)


def routing_summary(res: RunResult, setup: SimSetup, bounds: dict[str, float]) -> dict[str, Any]:
    counts = [res.routed.get(rid, 0) for rid in res.routed]
    return {
        **latency_summary(res.requests, res.itl),
        "ttft_p90_lower_bound_ms": ttft_p90_lower_bound_ms(res, setup),
        "prefix_hit_rate": prefix_hit_rate(res.requests),
        **bounds,
        "share_max_over_mean": share_max_over_mean(counts),
        "slo_attainment": slo_attainment(res.requests, res.itl, setup.cfg.slo),
        "tenants": tenants_json(res.requests, setup.cfg),
        "replica_seconds": res.replica_seconds,
        "failed_requests": res.failed_requests,
        "rejected_requests": res.rejected_requests,
        "overloaded_503": res.overloaded_requests,
        "wall_s": res.wall_s,
    }


def hit_bounds(setup: SimSetup) -> dict[str, float]:
    reqs = setup.workload.requests
    return {
        "oracle_hit_rate": oracle_hit_rate(reqs, setup.engine.kv_blocks * setup.replicas),
        "infinite_hit_rate": infinite_hit_rate(reqs),
    }


def compare_policies(
    setup: SimSetup, policies: list[str], progress: Progress | None = None
) -> tuple[dict[str, Any], dict[str, RunResult]]:
    t0 = time.perf_counter()
    bounds = hit_bounds(setup)
    results: dict[str, RunResult] = {}
    summary: dict[str, Any] = {}
    for name in policies:
        res = run_routing(setup, name, progress)
        results[name] = res
        summary[name] = routing_summary(res, setup, bounds)
    return _split(summary, ROUTING_KEYS, "policies", time.perf_counter() - t0), results


def add_partition_oracle(
    setup: SimSetup, out: dict[str, Any], results: dict[str, RunResult], candidates: int, max_share: float
) -> None:
    """Adds the `partition_oracle` row (`sim.partition_oracle`: best static tenant split, in hindsight) to `out`."""
    t0 = time.perf_counter()
    split, res = best_static_partition(setup, candidates, max_share)
    row = routing_summary(res, setup, hit_bounds(setup))
    results["partition_oracle"] = res
    out["policies"]["partition_oracle"] = {k: row[k] for k in ROUTING_KEYS}
    out["details"]["partition_oracle"] = {
        **{k: v for k, v in row.items() if k not in ROUTING_KEYS},
        "hindsight": True,
        "candidates": candidates,
        "max_share": max_share,
        "replica_tenants": [sorted(t for t, side in split.side.items() if side == r) for r in range(setup.replicas)],
        "overflow_requests": split.overflow,
    }
    out["sim_wall_s"] += time.perf_counter() - t0


def _split(summary: dict[str, dict[str, Any]], keys: tuple[str, ...], section: str, wall_s: float) -> dict[str, Any]:
    """The agreed JSON keys per entry under `section`; everything else under `details`."""
    return {
        section: {n: {k: row[k] for k in keys} for n, row in summary.items()},
        "details": {n: {k: v for k, v in row.items() if k not in keys} for n, row in summary.items()},
        "sim_wall_s": wall_s,
    }


def run_autoscaler(setup: SimSetup, name: str, routing_policy: str, progress: Progress | None = None,
                   retire: str = "least_loaded") -> RunResult:
    def make(targets):  # type: ignore[no-untyped-def]
        return make_autoscaler(name, setup.cfg.autoscaling.params(), targets, setup.profile, setup.engine.max_num_seqs)

    # Per-tenant SLO tiers (simulator.slo_tiers): the policy's targets follow the tightest tier with traffic.
    sc = ScalingSetup(
        TieredTargets(make, setup.cfg, setup.workload.requests),  # type: ignore[arg-type]
        setup.cfg.autoscaling,
        setup.engine_start_s,
        setup.decision_interval_s,
        retire,
    )
    policy = make_policy(routing_policy, setup.cfg.router.params(), setup.seed)
    cb = (lambda d, t: progress(name, d, t)) if progress else None
    cluster = Cluster(
        setup.workload, setup.profile, setup.engine, policy,
        replicas=0, router_cfg=setup.cfg.router, scaling=sc, name=name, on_progress=cb,
        max_ongoing=setup.cfg.server.max_ongoing_requests, max_queued=setup.cfg.server.max_queued_requests,
    )
    return cluster.run()


def per_minute_rows(res: RunResult, need: list[int], met: dict[int, bool]) -> list[dict[str, Any]]:
    """Minute by minute: the run's mean replicas (replica-seconds / the minute's length), the oracle's
    replicas for that minute, and whether the SLO was met (None: no traffic). Where the cost over the
    oracle comes from, and which minutes were missed."""
    rows = []
    for m, rs in enumerate(res.replica_seconds_by_minute):
        length = min(MINUTE_S, res.end_time - m * MINUTE_S)
        rows.append({
            "minute": m,
            "replicas": rs / length if length > 0 else 0.0,
            "oracle_replicas": need[m] if m < len(need) else None,
            "slo_met": met.get(m),
        })
    return rows


def compare_autoscalers(
    setup: SimSetup, autoscalers: list[str], routing_policy: str, progress: Progress | None = None
) -> tuple[dict[str, Any], dict[str, RunResult]]:
    t0 = time.perf_counter()
    a = setup.cfg.autoscaling
    results = {name: run_autoscaler(setup, name, routing_policy, progress) for name in autoscalers}
    cache: dict[int, dict[int, bool]] = {}

    def fixed(n: int) -> dict[int, bool]:
        if n not in cache:
            res = run_routing(setup, routing_policy, progress and (lambda _p, d, t: progress(f"oracle n={n}", d, t)), replicas=n)
            cache[n] = per_minute_ok(res.requests, res.itl, setup.cfg.slo)
        return cache[n]

    summary: dict[str, Any] = {}
    for name, res in results.items():
        oracle_rs, need = oracle_replica_seconds(fixed, a.min_replicas, a.max_replicas, res.end_time)
        met = per_minute_ok(res.requests, res.itl, setup.cfg.slo)
        summary[name] = {
            "slo_attainment": slo_attainment(res.requests, res.itl, setup.cfg.slo),
            "replica_seconds": res.replica_seconds,
            "oracle_replica_seconds": oracle_rs,
            "failed_requests": res.failed_requests,
            "overloaded_503": res.overloaded_requests,
            "replica_seconds_over_oracle": res.replica_seconds / oracle_rs if oracle_rs else None,
            "max_replicas_seen": max((row["existing"] for row in res.timeline), default=0),
            **latency_summary(res.requests, res.itl),
            **scale_up_window(res.requests, res.serving_since),
            "per_minute": per_minute_rows(res, need, met),
            "tenants": tenants_json(res.requests, setup.cfg),
        }
    out = _split(summary, AUTOSCALING_KEYS, "autoscalers", time.perf_counter() - t0)
    out["routing_policy"] = routing_policy
    return out, results
