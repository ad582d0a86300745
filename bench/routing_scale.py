"""Sampled vs exhaustive kvserve routing on the Mooncake trace, at 16 and 1,000 simulated replicas.

Each replica count gets the same `--requests` requests: copies of the trace enough
for them, at the rate that gives each replica the trace's own load on 16 replicas
(`bench.trace_tiling`); the kvserve policy then runs twice on it, scoring every replica
(`router.sample_replicas` null) and scoring candidates (the default sample,
`router.candidates`). Reported per run: hit rate, TTFT p90, the run's wall time,
and each routing decision's own time (rank + on_routed, inside the simulator, so
with its load and footprint state).

    python -m bench.routing_scale --trace ../shared/traces/mooncake_synthetic_trace.jsonl --json out.json
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Optional

import typer

from bench.trace_tiling import tile
from kvserve.config import load_config
from kvserve.perf_model import EngineProfile
from simulator.cluster import Cluster
from simulator.engine import EngineSettings
from simulator.runner import PACKAGED_PROFILE, SimSetup, default_kv_blocks, router_config_for, routing_summary
from simulator.workloads import load_trace
from router.base import ReplicaLoad, RouteRequest, RoutingPolicy
from router.registry import make_policy

REPLICAS_AT_TRACE_RATE = 16  # the trace's own load suits 16 replicas (docs/BENCHMARKS.md, routing at cluster scale)


class TimedPolicy(RoutingPolicy):
    """Delegates to `inner` and records each decision's time: rank + the on_routed that follows it."""

    def __init__(self, inner: RoutingPolicy) -> None:
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]
        self.takes_load_map = inner.takes_load_map  # type: ignore[misc]
        self.decision_ms: list[float] = []
        self.decision_cpu_ms: list[float] = []  # the same, minus the moments the OS ran something else
        self._rank_ns = self._rank_cpu_ns = 0

    def rank(self, request: RouteRequest, replicas: Sequence[ReplicaLoad], now: float) -> list[str]:
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        out = self.inner.rank(request, replicas, now)
        self._rank_ns, self._rank_cpu_ns = time.perf_counter_ns() - t0, time.thread_time_ns() - c0
        return out

    def on_routed(self, request: RouteRequest, replica_id: str, now: float) -> None:
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        self.inner.on_routed(request, replica_id, now)
        self.decision_ms.append((self._rank_ns + time.perf_counter_ns() - t0) / 1e6)
        self.decision_cpu_ms.append((self._rank_cpu_ns + time.thread_time_ns() - c0) / 1e6)
        self._rank_ns = self._rank_cpu_ns = 0

    def on_finished(self, request: RouteRequest, replica_id: str, now: float) -> None:
        self.inner.on_finished(request, replica_id, now)

    def on_cache_snapshot(self, replica_id: str, block_hashes: Iterable[int], now: float) -> None:
        self.inner.on_cache_snapshot(replica_id, block_hashes, now)

    def on_cache_events(self, replica_id: str, stored: Iterable[int], removed: Iterable[int], now: float) -> None:
        self.inner.on_cache_events(replica_id, stored, removed, now)

    def on_replica_gone(self, replica_id: str) -> None:
        self.inner.on_replica_gone(replica_id)


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(int(q * len(xs)), len(xs) - 1)], 4)


def run_one(setup: SimSetup, sample: int | None) -> dict[str, Any]:
    """One kvserve run on `setup` with `router.sample_replicas = sample`."""
    rcfg = setup.cfg.router.model_copy(update={"sample_replicas": sample})
    policy = TimedPolicy(make_policy("kvserve", rcfg.params(), setup.seed))
    cluster = Cluster(
        setup.workload, setup.profile, setup.engine, policy, replicas=setup.replicas, router_cfg=rcfg, name="kvserve",
        max_ongoing=setup.cfg.server.max_ongoing_requests, max_queued=setup.cfg.server.max_queued_requests,
    )
    res = cluster.run()
    row = routing_summary(res, setup, {})
    return {
        "sample_replicas": sample,
        "prefix_hit_rate": row["prefix_hit_rate"],
        "ttft_p50_ms": row["ttft_p50_ms"],
        "ttft_p90_ms": row["ttft_p90_ms"],
        "share_max_over_mean": row["share_max_over_mean"],
        "failed_requests": row["failed_requests"] + row["overloaded_503"],
        "wall_s": round(res.wall_s, 2),
        "decisions": len(policy.decision_ms),
        "decision_p50_ms": _pct(policy.decision_ms, 0.50),
        "decision_p99_ms": _pct(policy.decision_ms, 0.99),
        "decision_cpu_p50_ms": _pct(policy.decision_cpu_ms, 0.50),
        "decision_cpu_p99_ms": _pct(policy.decision_cpu_ms, 0.99),
    }


def setup_for(trace: Path, replicas: int, requests: int, seed: int = 0) -> SimSetup:
    """The `kvserve sim --trace` setup (packaged H200 profile, config defaults) on the tiled trace."""
    cfg = load_config(None, {}, environ={})
    raw = json.loads(PACKAGED_PROFILE.read_text())
    prof = EngineProfile.from_dict(raw, source=str(PACKAGED_PROFILE))
    cfg = router_config_for(cfg, prof, set())
    src = load_trace(trace)
    copies = math.ceil(requests / len(src.requests))
    wl = tile(src, copies, requests, time_scale=REPLICAS_AT_TRACE_RATE * copies / replicas)
    engine = EngineSettings(
        block_size=wl.block_size,
        kv_blocks=default_kv_blocks(wl, replicas, prof),
        max_num_seqs=cfg.engine.max_num_seqs,
        max_batched_tokens=cfg.engine.max_num_batched_tokens,
        long_prefill_tokens=cfg.engine.long_prefill_token_threshold,
    )
    return SimSetup(wl, prof, engine, cfg, replicas, seed)


def run(trace: Path, replicas: Sequence[int], requests: int, seed: int = 0) -> dict[str, Any]:
    default_sample = load_config(None, {}, environ={}).router.sample_replicas
    out: dict[str, Any] = {"trace_file": trace.name, "requests_cap": requests, "seed": seed, "runs": {}}
    for n in replicas:
        setup = setup_for(trace, n, requests, seed)
        for label, sample in (("exhaustive", None), ("sampled", default_sample)):
            row = run_one(setup, sample)
            row.update(replicas=n, requests=len(setup.workload.requests),
                       tiled_copies=setup.workload.params["tiled_copies"],
                       time_scale=setup.workload.params["tiled_time_scale"], kv_blocks_per_replica=setup.engine.kv_blocks)
            out["runs"][f"{n}_{label}"] = row
            print(json.dumps({f"{n}_{label}": row}), flush=True)
        ex, sa = out["runs"][f"{n}_exhaustive"], out["runs"][f"{n}_sampled"]
        out["runs"][f"{n}_sampled"]["vs_exhaustive"] = {
            "hit_rate": sa["prefix_hit_rate"] / ex["prefix_hit_rate"] if ex["prefix_hit_rate"] else None,
            "ttft_p90": sa["ttft_p90_ms"] / ex["ttft_p90_ms"] if ex["ttft_p90_ms"] else None,
        }
    return out


def main(
    trace: Path = typer.Option(Path("../shared/traces/mooncake_synthetic_trace.jsonl"), "--trace", help="Mooncake JSONL trace."),
    replicas: str = typer.Option("16,1000", "--replicas", help="Comma list of replica counts."),
    requests: int = typer.Option(12_000, "--requests", min=1, help="First N arrivals of the tiled trace."),
    seed: int = typer.Option(0, "--seed"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the table as JSON."),
) -> None:
    out = run(trace, [int(x) for x in replicas.split(",") if x.strip()], requests, seed)
    text = json.dumps(out, indent=1)
    if json_out is not None:
        json_out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    typer.run(main)
