"""Microbenchmark: what tenant limits add to a request at the ingress (admission + settling).

The ingress's own adapter (deployments.ingress_limits.IngressLimits) against a real LimitBoard
actor on a local Ray, one request at a time on one event loop, as the ingress runs them:

- `off`: the tenant's class has no limits (the default): a dict lookup.
- `lease`: far from its limits (600,000 requests/min, 10^9 tokens/min, 10,000 in flight):
  requests spend the ingress's local lease (the board is asked for a new one now and then).
- `board`: leases disabled (they expire at once), as for a tenant near a limit: every request
  is one actor round trip (and its settling another, not awaited).
- `refused`: a tenant flooding past its limit (1 request/min): the ingress refuses it itself
  until the board's Retry-After has passed.

Wall time of `admit` per request (the latency a request sees) and CPU time of `admit` + `finish`.

    python -m bench.limits_overhead --requests 3000 --json build/bench/limits-overhead.json
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Optional

import typer

from deployments.ingress_limits import IngressLimits, RateLimited
from kvserve.config import TenantClass

USAGE = {"prompt_tokens": 500, "completion_tokens": 100}


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def _run(limits: IngressLimits, tenant: str, n: int) -> dict[str, float]:
    wall, cpu = [], []
    for i in range(n):
        rid = f"r{i}"
        c0, t0 = time.process_time(), time.perf_counter()
        try:
            await limits.admit(rid, tenant, 500, 200)
        except RateLimited:
            pass
        t1 = time.perf_counter()
        limits.finish(rid, 200, USAGE)
        c1 = time.process_time()
        wall.append((t1 - t0) * 1000)
        cpu.append((c1 - c0) * 1000)
        await asyncio.sleep(0)  # let fire-and-forget calls go out, as between requests
    return {"requests": n, "p50_ms": round(_pct(wall, 0.5), 4), "p90_ms": round(_pct(wall, 0.9), 4),
            "p99_ms": round(_pct(wall, 0.99), 4), "mean_ms": round(statistics.fmean(wall), 4),
            "cpu_p50_ms": round(_pct(cpu, 0.5), 4), "cpu_p99_ms": round(_pct(cpu, 0.99), 4)}


def main(requests: int = typer.Option(3000, help="Requests per case."),
         json_out: Optional[Path] = typer.Option(None, "--json", help="Write the result here.")) -> None:
    import ray

    from deployments.limit_board import LimitBoard

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        board = LimitBoard.options(name="limits-bench").remote()
        classes = {"default": TenantClass(),
                   "big": TenantClass(requests_per_min=600_000, tokens_per_min=1_000_000_000, max_concurrent=10_000),
                   "tiny": TenantClass(requests_per_min=1)}
        tenants = {"off": "default", "lease": "big", "board": "big", "refused": "tiny"}

        async def all_cases() -> dict[str, dict[str, float]]:
            out = {}
            for case, cls in tenants.items():
                limits = IngressLimits(classes, {case: cls}, lambda: board, 4096,
                                       ttl_s=0.0 if case == "board" else 1.0)
                await _run(limits, case, 200)  # warm up: the actor's first calls, imports
                out[case] = await _run(limits, case, requests)
            return out

        result = {"cases": asyncio.run(all_cases()), "requests_per_case": requests}
    finally:
        ray.shutdown()
    text = json.dumps(result, indent=1)
    print(text)
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(text + "\n")


if __name__ == "__main__":
    typer.run(main)
