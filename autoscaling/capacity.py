"""Capacity model: how many replicas a load needs to meet the TTFT/ITL targets.

Built on `EngineProfile` (measured prefill and decode timings), the same
numbers the router and the simulator use. One replica is modelled as a single
server whose time goes to prefill (`prefill_ms_for(uncached prompt)` per
request) and to decode steps shared by a batch:

* ITL target -> largest decode batch B whose step time stays within it (also
  capped by the KV cache: B * context <= kv_cache_tokens, and by max_batch).
  Decode then costs step_ms(b) / b per output token at the best b <= B.
* Service time per request S = prefill + output_tokens * decode cost per token.
* TTFT target -> utilization cap. Prefill waits behind queued work; as in an
  M/D/1 queue the wait is rho / (2 (1 - rho)) * prefill, so TTFT <= target
  needs rho <= 2 slack / (prefill + 2 slack), slack = target - prefill. When
  even an idle replica misses the target (slack <= 0) more replicas cannot fix
  it; utilization is then held at `INFEASIBLE_RHO` to keep queues short.
* Each replica is planned to at most `headroom` of its modelled capacity;
  `max_rps` is the rate at the TTFT cap itself: more than that, and one
  replica misses the target however it is planned.

All inputs enter monotonically: more rate, longer prompts or longer outputs
never yield fewer replicas (tested). Pure Python.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from kvserve.perf_model import EngineProfile

INFEASIBLE_RHO = 0.25
DEFAULT_MAX_BATCH = 256


@dataclass(frozen=True)
class CapacityEstimate:
    replicas: int  # replicas needed for the rate (0 for no load)
    per_replica_rps: float  # planned requests/s one replica takes
    decode_batch: int  # batch the ITL target allows
    prefill_ms: float  # modelled prefill (≈ idle TTFT) of a mean request
    service_ms: float  # replica busy time per mean request
    utilization: float  # planned utilization cap (min of TTFT cap and headroom)
    feasible: bool  # False: an idle replica already misses the TTFT or ITL target
    max_rps: float = math.inf  # the most one replica serves within the TTFT target (its cap, no headroom)


def _step_ms(profile: EngineProfile, batch: int, context_tokens: float) -> float:
    """Decode step time made non-decreasing in context. Measured points are noisy (a larger
    context can read faster at small batches) and a capacity model must never promise more
    for longer sequences: take the running max over the profile's context points, and below
    the smallest one never extrapolate upwards."""
    ctxs = sorted(profile.decode)
    t = profile.decode_step_ms(batch, context_tokens)
    if context_tokens < ctxs[0]:
        return min(t, profile.decode_step_ms(batch, ctxs[0]))
    for ctx in ctxs:
        if ctx <= context_tokens:
            t = max(t, profile.decode_step_ms(batch, ctx))
    return t


def candidate_batches(profile: EngineProfile, max_batch: int) -> list[int]:
    """Batch sizes the model considers: 1..16, the profile's measured batches, a x1.25 grid
    and max_batch. A fixed set (independent of context and targets) keeps the demand monotone;
    between grid points the model is at most ~25% conservative on batch size."""
    sizes = set(range(1, min(16, max_batch) + 1)) | {max_batch}
    for xs, _ in profile.decode.values():
        sizes |= {int(x) for x in xs if 1 <= x <= max_batch}
    b = 16.0
    while b < max_batch:
        b *= 1.25
        sizes.add(min(int(b), max_batch))
    return sorted(sizes)


def decode_cost_per_token_ms(
    profile: EngineProfile, itl_target_ms: float, context_tokens: float, max_batch: int = DEFAULT_MAX_BATCH
) -> tuple[float, int, bool]:
    """(ms of replica time per output token, best batch, ITL feasible) at `context_tokens`."""
    kv_cap = max(1, int(profile.kv_cache_tokens // max(context_tokens, 1.0)))
    best: tuple[float, int] | None = None
    for b in candidate_batches(profile, max_batch):
        if b > kv_cap:
            break
        step = _step_ms(profile, b, context_tokens)
        if step <= itl_target_ms and (best is None or step / b < best[0]):
            best = (step / b, b)
    if best is None:  # even one sequence decodes slower than the target
        return _step_ms(profile, 1, context_tokens), 1, False
    return best[0], best[1], True


def per_replica_capacity(
    profile: EngineProfile,
    prompt_tokens: float,
    output_tokens: float,
    ttft_target_ms: float,
    itl_target_ms: float,
    headroom: float = 0.8,
    max_batch: int = DEFAULT_MAX_BATCH,
    cached_tokens: float = 0.0,
) -> CapacityEstimate:
    """Planned requests/s for one replica; `prompt_tokens` are the uncached ones, `cached_tokens`
    the prompt's cached prefix: a cache hit saves its prefill, not its KV or its decode reads,
    so the decode context (and the batch the KV cache holds) is the whole prompt."""
    prompt_tokens = max(prompt_tokens, 0.0)
    output_tokens = max(output_tokens, 0.0)
    cached_tokens = max(cached_tokens, 0.0)
    context = max(prompt_tokens + cached_tokens + output_tokens / 2.0, 1.0)  # mean context over a decode
    per_token_ms, batch, itl_ok = decode_cost_per_token_ms(profile, itl_target_ms, context, max_batch)
    prefill = max(profile.prefill_ms_for(prompt_tokens, cached_tokens), 1e-3)
    service = prefill + output_tokens * per_token_ms
    slack = ttft_target_ms - prefill
    rho_ttft = 2 * slack / (prefill + 2 * slack) if slack > 0 else 0.0
    rho = min(max(rho_ttft, INFEASIBLE_RHO), headroom)
    return CapacityEstimate(
        replicas=0,
        per_replica_rps=rho * 1000.0 / service,
        decode_batch=batch,
        prefill_ms=prefill,
        service_ms=service,
        utilization=rho,
        feasible=itl_ok and slack > 0,
        max_rps=min(max(rho_ttft, INFEASIBLE_RHO), 1.0) * 1000.0 / service,
    )


def replicas_for(cap: CapacityEstimate, rate_rps: float) -> CapacityEstimate:
    """`cap` (one replica's, from `per_replica_capacity`) with the replicas `rate_rps` needs."""
    # The relative epsilon keeps float noise (rate exactly k * capacity) from adding a replica.
    n = max(1, math.ceil(rate_rps / cap.per_replica_rps * (1 - 1e-12))) if rate_rps > 0 else 0
    return dataclasses.replace(cap, replicas=n)


def replicas_needed(
    profile: EngineProfile,
    rate_rps: float,
    prompt_tokens: float,
    output_tokens: float,
    ttft_target_ms: float,
    itl_target_ms: float,
    headroom: float = 0.8,
    max_batch: int = DEFAULT_MAX_BATCH,
) -> CapacityEstimate:
    """Replicas needed to serve `rate_rps` requests/s of the given mean shape within the targets."""
    cap = per_replica_capacity(
        profile, prompt_tokens, output_tokens, ttft_target_ms, itl_target_ms, headroom, max_batch
    )
    return replicas_for(cap, rate_rps)
