"""Generated workloads with what real traces have and the step/burst/diurnal mixes lack.

- `conversations`: multi-turn chats. Every request starts with one system block shared by all
  sessions; each turn re-sends the whole conversation so far (previous questions and answers)
  plus a new question, so a session's context grows turn by turn.
- `agentic`: tool loops. A shared tools/system preamble, a task, then steps that each append the
  model's tool call and the tool's (long) result and re-send everything, seconds apart.
- `heavy_tail`: tenants' system prompts plus questions whose length is log-normal with a long
  tail (a few prompts are 10-50x the median), outputs likewise.

Sessions arrive as a Poisson process whose rate follows `rate_fn`; within a session the next
turn arrives after the answer (estimated at `DECODE_S_PER_TOKEN` per output token) and a think
or tool time. Blocks are 512 tokens, like the Mooncake traces: block k of a session's context
has one content once full, so its id is (session, k), and the shared preamble's ids are global.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from router.block_hash import chain_ids
from simulator.engine import SimRequest, blocks_for
from simulator.workloads import MOONCAKE_BLOCK_TOKENS, SimWorkload, poisson_times

BLOCK = MOONCAKE_BLOCK_TOKENS
DECODE_S_PER_TOKEN = 0.02  # a loaded replica's inter-token time: when an answer is done, roughly


@dataclass(frozen=True)
class SessionShape:
    shared_tokens: int  # the preamble every session starts with
    first_tokens: tuple[float, float]  # log-normal (median, sigma): the session's first unique message
    turn_tokens: tuple[float, float]  # each later turn's new user / tool tokens
    output_tokens: tuple[float, float]
    turns: tuple[int, int]  # uniform range of turns per session
    gap_s: float  # mean think / tool time between an answer and the next turn
    max_context: int  # a session ends before its context would pass this


CONVERSATION = SessionShape(2048, (1500, 0.8), (2000, 0.8), (500, 0.6), (2, 10), 20.0, 32_768)
AGENTIC = SessionShape(6144, (1500, 0.5), (3000, 1.0), (200, 0.5), (4, 16), 3.0, 48_000)


def _lognormal(rng: random.Random, median_sigma: tuple[float, float], cap: int) -> int:
    median, sigma = median_sigma
    return max(1, min(cap, int(median * math.exp(sigma * rng.gauss(0.0, 1.0)))))


def _request(idx: int, t: float, prompt: int, output: int, ids: list[int], tenant: str) -> SimRequest:
    """Only the prompt's full blocks are cacheable; KV is reserved for prompt + output."""
    hashes = chain_ids(ids[: prompt // BLOCK])
    return SimRequest(idx, t, prompt, output, hashes, blocks_for(prompt + output, BLOCK), tenant)


def sessions(kind: str, shape: SessionShape, rate_fn: Callable[[float], float], peak: float,
             duration_s: float, seed: int) -> SimWorkload:
    """Sessions start at `rate_fn(t)` per second (thinned Poisson, `peak` its maximum)."""
    rng = random.Random(f"{seed}:{kind}")
    shared = shape.shared_tokens // BLOCK
    turns: list[tuple[float, int, int, list[int], str]] = []
    for s, start in enumerate(poisson_times(rate_fn, peak, duration_s, seed)):
        ids = list(range(shared)) + [(s + 1) * 1_000_000 + k for k in range(shape.max_context // BLOCK + 1)]
        context = shape.shared_tokens + _lognormal(rng, shape.first_tokens, shape.max_context // 4)
        t = start
        for _ in range(rng.randint(*shape.turns)):
            out = _lognormal(rng, shape.output_tokens, 2000)
            if context + out > shape.max_context or t >= duration_s:
                break
            turns.append((t, context, out, ids, f"session-{s}"))
            t += out * DECODE_S_PER_TOKEN + rng.expovariate(1.0 / shape.gap_s)
            context += out + _lognormal(rng, shape.turn_tokens, shape.max_context // 4)
    turns.sort(key=lambda x: x[0])
    reqs = [_request(i, t, p, o, ids, tenant) for i, (t, p, o, ids, tenant) in enumerate(turns)]
    params = {"workload": kind, "duration_s": duration_s, "requests": len(reqs), "seed": seed, **vars(shape)}
    return SimWorkload(kind, reqs, BLOCK, None, params)


def heavy_tail(rate_fn: Callable[[float], float], peak: float, duration_s: float, seed: int,
               tenants: int = 16, system_tokens: int = 1024) -> SimWorkload:
    """Tenants' shared system prompts (uniform pick) + log-normal questions (median 2,000 tokens,
    sigma 1.4: p99 ~26x the median, capped at 64k) and outputs (median 150, sigma 1.0)."""
    rng = random.Random(f"{seed}:heavy_tail")
    reqs = []
    for i, t in enumerate(poisson_times(rate_fn, peak, duration_s, seed)):
        tenant = rng.randrange(tenants)
        prompt = system_tokens + _lognormal(rng, (2000, 1.4), 64_000)
        ids = [tenant * 1_000 + k for k in range(system_tokens // BLOCK)]
        ids += [(i + 1) * 1_000_000 + k for k in range(prompt // BLOCK)]
        reqs.append(_request(i, t, prompt, _lognormal(rng, (150, 1.0), 4000), ids, f"tenant-{tenant}"))
    params = {"workload": "heavy_tail", "duration_s": duration_s, "requests": len(reqs), "seed": seed,
              "tenants": tenants, "system_tokens": system_tokens}
    return SimWorkload("heavy_tail", reqs, BLOCK, None, params)
