"""Bounds a router or autoscaler is judged against.

- `infinite_hit_rate`: every block ever seen stays cached, cluster-wide.
- `oracle_hit_rate`: one global LRU cache with the cluster's total KV capacity, fed
  the requests in arrival order -- what a perfect router could emulate by keeping
  each prefix on one replica and never duplicating it. Blocks of a request are
  touched tail-first, matching the engines' tail-first eviction order.
- `ttft_lower_bounds_ms`: each request's TTFT on an idle replica that holds every
  block any earlier request brought (the infinite cache's hit): its own prefill in
  `max_batched_tokens` chunks, nothing queued, nothing decoding. No router can beat
  it in this engine model, so its p90 bounds any policy's TTFT p90 from below.
- `oracle_replica_seconds`: the fewest replicas per interval that meet the SLO.
  Method: simulate the workload at every fixed size n = min..max; for each minute,
  take the smallest n whose run met the SLO in that minute (TTFT p90 and ITL p90
  within target), or max if none did; sum n x minute length. It is clairvoyant
  (no start-up delay, no reaction lag), so it is the bar, not a reachable policy.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Sequence

from kvserve.config import SLOConfig
from kvserve.perf_model import EngineProfile
from simulator.engine import SimRequest
from simulator.metrics import MINUTE_S, minute_buckets, minute_ok


def infinite_hit_rate(requests: Sequence[SimRequest]) -> float:
    total = sum(len(r.block_hashes) for r in requests)
    return sum(infinite_hits(requests)) / total if total else 0.0


def oracle_hit_rate(requests: Sequence[SimRequest], capacity_blocks: int) -> float:
    lru: OrderedDict[int, None] = OrderedDict()
    hit = total = 0
    for r in sorted(requests, key=lambda r: (r.arrival, r.idx)):
        hashes = r.block_hashes
        n = 0
        for h in hashes:
            if h in lru:
                n += 1
            else:
                break
        hit += n
        total += len(hashes)
        for h in reversed(hashes):  # head blocks end up most recent
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
        while len(lru) > capacity_blocks:
            lru.popitem(last=False)
    return hit / total if total else 0.0


def infinite_hits(requests: Sequence[SimRequest]) -> list[int]:
    """Leading blocks of each request (in `requests` order) seen in any earlier-arriving request."""
    seen: set[int] = set()
    hits = [0] * len(requests)
    for i in sorted(range(len(requests)), key=lambda i: (requests[i].arrival, requests[i].idx)):
        n = 0
        for h in requests[i].block_hashes:
            if h in seen:
                n += 1
            else:
                break
        hits[i] = n
        seen.update(requests[i].block_hashes)
    return hits


def chunked_prefill_ms(tokens: int, profile: EngineProfile, max_batched_tokens: int) -> float:
    """Prefill time of `tokens` alone on an idle engine: full chunks of the step budget, then the rest."""
    full, rest = divmod(max(tokens, 0), max_batched_tokens)
    return full * profile.prefill_ms_for(max_batched_tokens) + (profile.prefill_ms_for(rest) if rest else 0.0)


def ttft_lower_bounds_ms(
    requests: Sequence[SimRequest], profile: EngineProfile, block_size: int, max_batched_tokens: int
) -> list[float]:
    """Per request (in `requests` order): the TTFT no routing can beat (see the module docstring).

    A real run only adds to it: a smaller hit, prompt work queued ahead, decoders
    sharing each step (they add step time and take step budget). It is a bound
    when the profile's prefill time is monotone (`EngineProfile` enforces it) and
    subadditive up to one step budget (true of the packaged H200 profile; a test
    checks it), so splitting a prompt into more, smaller chunks is never faster.
    """
    out = []
    for r, hit in zip(requests, infinite_hits(requests)):
        cached = min(hit * block_size, r.prompt_tokens - 1)  # the engine always computes the last token
        out.append(chunked_prefill_ms(r.prompt_tokens - cached, profile, max_batched_tokens))
    return out


def per_minute_ok(requests: Sequence[SimRequest], itl, slo: SLOConfig) -> dict[int, bool]:  # type: ignore[no-untyped-def]
    return {m: minute_ok(b, slo) for m, b in minute_buckets(requests, itl).items()}


def oracle_replica_seconds(
    run_fixed: Callable[[int], dict[int, bool]],
    min_replicas: int,
    max_replicas: int,
    horizon_s: float,
) -> tuple[float, list[int]]:
    """(replica-seconds, replicas per minute) of the per-minute minimum that meets the SLO.

    `run_fixed(n)` simulates n fixed replicas and returns {minute with traffic: SLO met}.
    Minutes without traffic need only `min_replicas`.
    """
    minutes = max(1, math.ceil(horizon_s / MINUTE_S))
    need = [max_replicas] * minutes
    unresolved: set[int] | None = None
    for n in range(max(min_replicas, 1), max_replicas + 1):
        ok = run_fixed(n)
        if unresolved is None:
            unresolved = {m for m in ok if m < minutes}
            for m in range(minutes):
                if m not in ok:
                    need[m] = min_replicas
        for m in sorted(unresolved):
            if ok.get(m, True):
                need[m] = n
                unresolved.discard(m)
        if not unresolved:
            break
    secs = sum(n * min(MINUTE_S, horizon_s - m * MINUTE_S) for m, n in enumerate(need))
    return secs, need
