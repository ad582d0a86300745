"""Cache-aware scale-down and pre-warm, measured: the same autoscaled runs with each way of picking the
replica to retire (`ScalingSetup.retire`), on tenant workloads that scale down.

    python -m simulator.retire_ab --seeds 0-4 --json docs/results/sim-retire.json

Per run: the fleet's prefix hit rate in the `window_s` after each scale-down, and the hit rate of each
new replica in its first `window_s` of serving against the fleet's over the same spans
(`newreplica_hit_rate`, the target being >= 0.8x).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvserve.arrivals import parse_skew, popularity_weights
from kvserve.config import load_config
from kvserve.perf_model import EngineProfile
from simulator.cluster import RunResult
from router.block_hash import chain_hashes
from simulator.engine import EngineSettings, SimRequest, blocks_for
from simulator.metrics import prefix_hit_rate, slo_attainment
from simulator.runner import PACKAGED_PROFILE, SimSetup, default_kv_blocks, router_config_for, run_autoscaler
from simulator.suite import seed_list
from simulator.workloads import (PromptTokens, SimWorkload, TenantMix, generated, load_trace, poisson_times,
                                 step_rate)

RETIRE = ("newest", "least_loaded", "cache")


def _hit_rate(reqs: Sequence[SimRequest]) -> float | None:
    blocks = sum(len(r.block_hashes) for r in reqs)
    return sum(r.hit_blocks for r in reqs) / blocks if blocks else None


def _served(res: RunResult) -> list[SimRequest]:
    return [r for r in res.requests if r.admitted is not None and r.routed is not None and not r.failed]


def after_scale_downs(res: RunResult, window_s: float) -> dict[str, Any]:
    """Fleet hit rate over the requests routed within `window_s` after each scale-down (pooled), and
    within `window_s` before it (what the fleet had to lose)."""
    served = _served(res)
    win = [r for r in served if any(t <= r.routed < t + window_s for t in res.scale_downs)]  # type: ignore[operator]
    pre = [r for r in served if any(t - window_s <= r.routed < t for t in res.scale_downs)]  # type: ignore[operator]
    return {"scale_downs": len(res.scale_downs), "requests": len(win), "hit_rate": _hit_rate(win),
            "hit_rate_before": _hit_rate(pre)}


def seen_before(requests: Sequence[SimRequest]) -> dict[int, int]:
    """Per request, the leading blocks some earlier request had (what an infinite shared cache would hit)."""
    seen: set[int] = set()
    out: dict[int, int] = {}
    for r in sorted(requests, key=lambda r: r.arrival):
        n = 0
        for h in r.block_hashes:
            if h not in seen:
                break
            n += 1
        out[r.idx] = n
        seen.update(r.block_hashes)
    return out


def new_replicas(res: RunResult, window_s: float) -> dict[str, Any]:
    """Hit rate of each scaled-up replica's first `window_s` of traffic against the whole fleet's over
    the same spans (`newreplica_hit_rate`), and against what those same requests could hit at best: the
    blocks any earlier request had (`of_attainable`). A router that keeps conversations on the replica
    holding their context sends a new replica mostly new conversations, which no cache could serve."""
    new = {rid: t for rid, t in res.serving_since.items() if t > 0.0}
    served = _served(res)
    own = [r for r in served if r.replica in new and r.routed - new[r.replica] < window_s]  # type: ignore[operator]
    fleet = [r for r in served if any(t <= r.routed < t + window_s for t in new.values())]  # type: ignore[operator]
    mine, all_ = _hit_rate(own), _hit_rate(fleet)
    best = seen_before(res.requests)
    blocks = sum(best[r.idx] for r in own)
    return {"new_replicas": len(new), "requests": len(own), "hit_rate": mine, "fleet_hit_rate": all_,
            "newreplica_hit_rate": mine / all_ if mine is not None and all_ else None,
            "of_attainable": sum(r.hit_blocks for r in own) / blocks if blocks else None}


def drifting(mix: TenantMix, block_size: int, rate: float, phase_s: float, drift_s: float, seed: int) -> SimWorkload:
    """`step` load (1x, 4x, 1x) whose tenant popularity drifts: every `drift_s` the Zipf ranking moves on by
    a sixth of the tenants (tenants in other time zones wake up), so replicas' caches age unevenly."""
    weights = popularity_weights(mix.tenants, parse_skew(mix.tenant_skew))
    pick = random.Random(f"{seed}:tenants")
    full = (mix.system_tokens // block_size) * block_size
    q = mix.question_tokens
    out: list[SimRequest] = []
    n_prompt = mix.system_tokens + q
    total = blocks_for(n_prompt + mix.output_tokens, block_size)
    sys_hashes: dict[int, list[int]] = {}
    for i, t_arr in enumerate(poisson_times(step_rate(rate, phase_s), 4 * rate, 3 * phase_s, seed)):
        shift = int(t_arr // drift_s) * max(mix.tenants // 6, 1)
        t = (pick.choices(range(mix.tenants), weights)[0] + shift) % mix.tenants
        system = [(t + 1) * 1_000_003 + k for k in range(mix.system_tokens)]
        if t not in sys_hashes:
            sys_hashes[t] = chain_hashes(system[:full], block_size)
        q_base = -(i + 1) * (q + 1)
        tail = system[full:] + list(range(q_base, q_base + q))
        parent = sys_hashes[t][-1] if sys_hashes[t] else None
        hashes = sys_hashes[t] + (chain_hashes(tail, block_size, parent) if parent is not None
                                  else chain_hashes(tail, block_size))
        out.append(SimRequest(i, t_arr, n_prompt, mix.output_tokens, hashes, total, f"tenant-{t}",
                              PromptTokens(system, q_base, q)))
    params = {"workload": "drift", **vars(mix), "rate": rate, "phase_s": phase_s, "drift_s": drift_s, "seed": seed}
    return SimWorkload("drift", out, block_size, None, params)


def setup_for(workload: str, seed: int, args: argparse.Namespace) -> SimSetup:
    a = {"enabled": True, "min_replicas": 1, "max_replicas": args.max_replicas}
    for knob in ("warm_prefixes", "warm_min_requests"):
        if getattr(args, knob, None) is not None:
            a[knob] = getattr(args, knob)
    cfg = load_config(overrides={"autoscaling": a}, environ={})
    prof = EngineProfile.from_dict(json.loads(Path(args.profile).read_text()), source=str(args.profile))
    cfg = router_config_for(cfg, prof, set())
    mix = TenantMix(args.tenants, args.tenant_skew, args.system_tokens, args.question_tokens, args.output_tokens)
    if workload == "drift":
        wl = drifting(mix, prof.block_size, args.rate, args.phase_s, args.drift_s, seed)
    elif workload == "trace":
        wl = load_trace(args.trace)
    else:
        wl = generated(workload, mix, prof.block_size, rate=args.rate, phase_s=args.phase_s, seed=seed)
    kv = default_kv_blocks(wl, args.max_replicas, prof) if workload == "trace" else args.kv_blocks
    engine = EngineSettings(block_size=wl.block_size, kv_blocks=max(kv, wl.max_request_blocks()),
                            max_num_seqs=cfg.engine.max_num_seqs, max_batched_tokens=cfg.engine.max_num_batched_tokens)
    return SimSetup(wl, prof, engine, cfg, args.max_replicas, seed, args.engine_start_s)


def run_one(setup: SimSetup, retire: str, window_s: float) -> dict[str, Any]:
    res = run_autoscaler(setup, "kvserve", "kvserve", retire=retire)
    return {
        "after_scale_down": after_scale_downs(res, window_s),
        "new_replicas": new_replicas(res, window_s),
        "prefix_hit_rate": prefix_hit_rate(res.requests),
        "slo_attainment": slo_attainment(res.requests, res.itl, setup.cfg.slo),
        "replica_seconds": res.replica_seconds,
        "failed_requests": res.failed_requests,
    }


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default="step,drift", help="step, burst, diurnal (simulator.workloads) or "
                   "drift (a step whose tenant popularity drifts).")
    p.add_argument("--drift-s", type=float, default=60.0)
    p.add_argument("--trace", type=Path, default=None, help="Mooncake JSONL trace for the `trace` workload "
                   "(KV sized as `kvserve sim --trace` does).")
    p.add_argument("--seeds", default="0-4", help="A-B (inclusive) or a comma list.")
    p.add_argument("--retire", default=",".join(RETIRE))
    p.add_argument("--profile", default=str(PACKAGED_PROFILE))
    p.add_argument("--rate", type=float, default=10.0)
    p.add_argument("--phase-s", type=float, default=180.0)
    p.add_argument("--tenants", type=int, default=200)
    p.add_argument("--tenant-skew", default="zipf:1.1")
    p.add_argument("--system-tokens", type=int, default=2048)
    p.add_argument("--question-tokens", type=int, default=256)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--kv-blocks", type=int, default=8000, help="Per replica, in profile blocks: tight enough "
                   "that the tenants' prefixes do not all fit on every replica (else no choice matters).")
    p.add_argument("--max-replicas", type=int, default=8)
    p.add_argument("--engine-start-s", type=float, default=30.0)
    p.add_argument("--window-s", type=float, default=60.0)
    p.add_argument("--warm-prefixes", type=int, default=None, help="Default: autoscaling.warm_prefixes.")
    p.add_argument("--warm-min-requests", type=float, default=None, help="Default: autoscaling.warm_min_requests.")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    seeds = seed_list(args.seeds)
    # File names only: a result file names no machine's paths.
    params = {k: (Path(v).name if k in ("profile", "trace", "json") and v else v) for k, v in vars(args).items()}
    out: dict[str, Any] = {"params": params, "workloads": {}}
    for wl in args.workloads.split(","):
        per: dict[str, list[dict[str, Any]]] = {r: [] for r in args.retire.split(",")}
        for seed in seeds:
            setup = setup_for(wl, seed, args)
            for retire in per:
                per[retire].append(run_one(setup, retire, args.window_s))
                row = per[retire][-1]
                print(f"{wl} seed {seed} {retire:>12}: after scale-down hit {row['after_scale_down']['hit_rate']}, "
                      f"new replicas x{row['new_replicas']['newreplica_hit_rate']} "
                      f"({row['new_replicas']['of_attainable']} of attainable), slo {row['slo_attainment']:.3f}",
                      flush=True)
        out["workloads"][wl] = {
            r: {"median": {
                "hit_rate_after_scale_down": _median([x["after_scale_down"]["hit_rate"] for x in rows]),
                "hit_rate_before_scale_down": _median([x["after_scale_down"]["hit_rate_before"] for x in rows]),
                "newreplica_hit_rate": _median([x["new_replicas"]["newreplica_hit_rate"] for x in rows]),
                "newreplica_of_attainable": _median([x["new_replicas"]["of_attainable"] for x in rows]),
                "prefix_hit_rate": _median([x["prefix_hit_rate"] for x in rows]),
                "slo_attainment": _median([x["slo_attainment"] for x in rows]),
                "replica_seconds": _median([x["replica_seconds"] for x in rows]),
                "failed_requests": _median([x["failed_requests"] for x in rows]),
            }, "per_seed": dict(zip(map(str, seeds), rows))}
            for r, rows in per.items()
        }
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
