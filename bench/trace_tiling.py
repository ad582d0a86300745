"""A trace tiled for a bigger cluster: several copies of it at once, each with its own content.

The Mooncake trace (3,993 requests over 17 minutes) suits 16 simulated replicas;
on 1,000 each would see four requests. Tiling overlays `copies` copies and scales
their arrival times by `time_scale`, so the load per replica stays the original's
on 16 replicas when copies / time_scale = replicas / 16. Copy k re-hashes every block hash with k, so it keeps the original's prefix
sharing within itself and shares nothing with the other copies (other users,
other documents); its arrivals are shifted by k / copies of the mean gap between
arrivals, so the copies interleave instead of arriving in lock-step.
"""

from __future__ import annotations

from simulator.engine import SimRequest
from simulator.workloads import SimWorkload


def tile(workload: SimWorkload, copies: int, requests: int | None = None, time_scale: float = 1.0) -> SimWorkload:
    """`copies` overlaid copies of `workload`, arrivals x `time_scale`, cut to the first `requests` (all when None)."""
    if copies < 1:
        raise ValueError("copies must be >= 1")
    src = workload.requests
    span = (src[-1].arrival - src[0].arrival) if src else 0.0
    gap = span / max(len(src) - 1, 1)
    slots = sorted(((r.arrival + gap * k / copies) * time_scale, k, i) for k in range(copies) for i, r in enumerate(src))
    if requests is not None:
        slots = slots[:requests]
    out: list[SimRequest] = []
    for n, (arrival, k, i) in enumerate(slots):
        r = src[i]
        hashes = r.block_hashes if k == 0 else [hash((k, h)) for h in r.block_hashes]
        out.append(SimRequest(n, arrival, r.prompt_tokens, r.output_tokens, hashes, r.total_blocks, f"{r.tenant}#{k}"))
    params = {**workload.params, "tiled_copies": copies, "tiled_time_scale": time_scale, "requests": len(out)}
    return SimWorkload(workload.name, out, workload.block_size, workload.concurrency, params)
