"""Predicted time to first token per replica: the kvserve router's cost model.

In the spirit of NVIDIA Dynamo's KV router (cost = prefill blocks not covered
by the cache + decode load) and llm-d's precise-prefix + queue + KV-usage
scorers, but in one unit -- milliseconds -- so terms add without weights:

    ttft_ms = (queued prefill tokens + this request's uncached tokens) * prefill_ms_per_token
            + running sequences * decode_ms_per_seq
    cost_ms = ttft_ms
            + uncached tokens * prefill_ms_per_token * (cache_miss_weight + KV-pressure weight)
            + active context tokens * prefill_ms_per_token * active_token_weight

- Queued prefill: a new prompt waits behind prompt work already admitted.
- Running sequences: with continuous batching every engine step also decodes
  the running batch, so each running sequence slows the steps our prefill
  rides in.
- Eviction: under prefix caching the cache is full of reusable prefixes in
  steady state, so every uncached token stored evicts a cached one that some
  later request re-prefills. Charging uncached tokens `cache_miss_weight`
  extra makes the router value the cache beyond this one request's TTFT (it
  stops duplicating a prefix onto a second replica just because its home has a
  short queue). When active sequences alone nearly fill the KV cache
  (`kv_usage`, which counts blocks in use, not free cached ones) preemption
  looms too: a further charge rising from 0 at `kv_pressure_start` to
  `kv_pressure_weight` at 100%.
- Active context: Dynamo's "decode blocks" term -- the prompt + output
  tokens of requests this router has in flight on the replica. A running
  sequence barely slows one prefill step, so a pure TTFT minimiser would send
  every cached tenant to the same replica (its neighbours idle, its ITL
  suffering); pricing committed context in prefill units makes a fully cached
  prefix spread once its home carries about
  (1 + cache_miss_weight) / active_token_weight more requests than another
  replica (16 with the defaults).

Defaults were picked in `kvserve sim` (2 replicas, 16 Zipf-1.1 tenants,
1,000-token system prompts; CPU profile at concurrency 8 over 10 seeds, H200
profile at concurrency 16 and 64) together with the policy's home rules: miss
3.0 / active 0.25 / home affinity 1.0 / spill bound 2 s, with the footprint
charge, give median hit rates 0.878 / 0.910 / 0.868 against Ray's
PrefixCacheAffinityRouter's 0.882 / 0.910 / 0.884, at share max/mean
1.19 / 1.13 / 1.20 against its 1.31 (docs/BENCHMARKS.md, "Router defaults").

All functions are pure; parameters are a `CostParams` (kvserve.policy_params), built from
`RouterConfig`, whose two slopes can be filled from a measured `EngineProfile`
(`RouterConfig.fitted_to`).
"""

from __future__ import annotations

from kvserve.policy_params import CostParams
from router.base import ReplicaLoad

__all__ = ["CostParams", "cost_terms_ms", "predicted_ttft_ms", "eviction_cost_ms", "committed_load_ms",
           "routing_cost_ms", "uncached_tokens", "kv_pressure"]


def kv_pressure(kv_usage: float, start: float) -> float:
    """0 below `start`, rising linearly to 1 at full KV usage."""
    if kv_usage <= start or start >= 1.0:
        return 0.0
    return min((kv_usage - start) / (1.0 - start), 1.0)


def cost_terms_ms(
    queued_tokens: int, running: int, kv_usage: float, uncached: int, active_tokens: int, params: CostParams
) -> tuple[float, float]:
    """(routing cost, predicted TTFT) in ms from plain numbers: the core every function here shares.

    Scalar arguments keep the router's per-replica inner loop free of object churn.
    """
    uncached = max(uncached, 0)
    ptok = params.prefill_ms_per_token
    ttft = (max(queued_tokens, 0) + uncached) * ptok + max(running, 0) * params.decode_ms_per_seq
    evict_w = params.cache_miss_weight
    if kv_usage > params.kv_pressure_start:
        evict_w += params.kv_pressure_weight * kv_pressure(kv_usage, params.kv_pressure_start)
    extra = uncached * ptok * evict_w + max(active_tokens, 0) * ptok * params.active_token_weight
    return ttft + extra, ttft


def predicted_ttft_ms(load: ReplicaLoad, uncached_tokens: int, params: CostParams) -> float:
    """Predicted TTFT on `load`'s replica for a prompt with `uncached_tokens` not in its cache.

    `load` should already include work the router sent there that the
    replica's stats do not show yet (the kvserve policy merges it in).
    """
    prefill_ms = (max(load.queued_prefill_tokens, 0) + max(uncached_tokens, 0)) * params.prefill_ms_per_token
    return prefill_ms + max(load.running, 0) * params.decode_ms_per_seq


def eviction_cost_ms(load: ReplicaLoad, uncached_tokens: int, params: CostParams) -> float:
    """The future re-prefill a miss passes on: evicted cached tokens, more when KV is nearly full."""
    weight = params.cache_miss_weight + params.kv_pressure_weight * kv_pressure(load.kv_usage, params.kv_pressure_start)
    return max(uncached_tokens, 0) * params.prefill_ms_per_token * weight


def committed_load_ms(active_tokens: int, params: CostParams) -> float:
    """The load term: context tokens in flight on the replica, in prefill milliseconds."""
    return max(active_tokens, 0) * params.prefill_ms_per_token * params.active_token_weight


def routing_cost_ms(load: ReplicaLoad, uncached_tokens: int, params: CostParams, active_tokens: int = 0) -> float:
    """What the kvserve policy minimises: predicted TTFT + eviction cost + load committed to the replica."""
    total, _ = cost_terms_ms(
        load.queued_prefill_tokens, load.running, load.kv_usage, uncached_tokens, active_tokens, params
    )
    return total


def uncached_tokens(num_prompt_tokens: int, matched_blocks: int, block_size: int) -> int:
    """Prompt tokens the replica must prefill given `matched_blocks` leading blocks cached."""
    return max(num_prompt_tokens - matched_blocks * block_size, 0)
