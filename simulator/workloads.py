"""Simulator workloads: seeded request lists with arrival times and chained block hashes.

`multi-tenant` draws tenants and Poisson arrivals from the same seeded streams as
`kvserve bench` (kvserve.arrivals), so a seeded live run and its simulation see the
same tenant sequence and arrival times. Token content is synthetic: only the
prefix structure (shared system prompt, unique question) matters to the cache.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvserve.arrivals import parse_skew, popularity_weights
from simulator.engine import SimRequest, blocks_for
from router.block_hash import chain_hashes, chain_ids

MOONCAKE_BLOCK_TOKENS = 512


@dataclass
class SimWorkload:
    name: str
    requests: list[SimRequest]  # sorted by arrival
    block_size: int  # tokens per cache block for this workload
    concurrency: int | None = None  # closed loop: this many in flight, arrivals ignored
    params: dict[str, Any] = field(default_factory=dict)

    def distinct_blocks(self) -> int:
        seen: set[int] = set()
        for r in self.requests:
            seen.update(r.block_hashes)
        return len(seen)

    def max_request_blocks(self) -> int:
        return max((r.total_blocks for r in self.requests), default=1)

    def fresh(self) -> list[SimRequest]:
        """Unsimulated copies (each run mutates its requests)."""
        return [
            SimRequest(r.idx, r.arrival, r.prompt_tokens, r.output_tokens, r.block_hashes, r.total_blocks, r.tenant, r.token_ids)
            for r in self.requests
        ]


def load_trace(path: str | Path, time_scale: float = 1.0, max_requests: int | None = None) -> SimWorkload:
    """Mooncake JSONL: timestamp (ms), input_length, output_length, hash_ids of 512-token blocks."""
    reqs: list[SimRequest] = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            n_in = max(1, int(row["input_length"]))
            n_out = max(1, int(row["output_length"]))
            # Full blocks only, as the live ingress hashes them (a partial last block is never cached).
            hashes = chain_ids(row["hash_ids"])[: n_in // MOONCAKE_BLOCK_TOKENS]
            total = max(len(hashes), blocks_for(n_in + n_out, MOONCAKE_BLOCK_TOKENS))
            reqs.append(SimRequest(len(reqs), row["timestamp"] / 1000.0 * time_scale, n_in, n_out, hashes, total))
            if max_requests is not None and len(reqs) >= max_requests:
                break
    reqs.sort(key=lambda r: (r.arrival, r.idx))
    t0 = reqs[0].arrival if reqs else 0.0
    for r in reqs:
        r.arrival -= t0
    params = {"workload": "trace", "trace_file": Path(path).name, "time_scale": time_scale, "requests": len(reqs)}
    return SimWorkload("trace", reqs, MOONCAKE_BLOCK_TOKENS, None, params)


# ---- generated workloads ------------------------------------------------------


def constant_rate(rate: float) -> Callable[[float], float]:
    return lambda t: rate


def step_rate(rate: float, phase_s: float, mults: tuple[float, ...] = (1.0, 4.0, 1.0)) -> Callable[[float], float]:
    return lambda t: rate * mults[min(int(t // phase_s), len(mults) - 1)]


def burst_rate(rate: float, at_s: float, burst_s: float, mult: float) -> Callable[[float], float]:
    return lambda t: rate * mult if at_s <= t < at_s + burst_s else rate


def diurnal_rate(rate: float, period_s: float, peak_mult: float) -> Callable[[float], float]:
    # Trough `rate` at t=0 and t=period, peak rate*peak_mult half way: one compressed day.
    return lambda t: rate * (1.0 + (peak_mult - 1.0) * (1.0 - math.cos(2 * math.pi * t / period_s)) / 2.0)


def poisson_times(rate_fn: Callable[[float], float], max_rate: float, duration_s: float, seed: int) -> list[float]:
    """Non-homogeneous Poisson arrivals by thinning (Lewis & Shedler)."""
    rng = random.Random(f"{seed}:arrivals")
    t, out = 0.0, []
    while True:
        t += rng.expovariate(max_rate)
        if t >= duration_s:
            return out
        if rng.random() * max_rate <= rate_fn(t):
            out.append(t)


def bench_poisson(rate: float, n: int, seed: int) -> list[float]:
    """The exact stream `kvserve bench --rate` draws (kvserve.arrivals.poisson_arrivals)."""
    rng = random.Random(f"{seed}:arrivals")
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


class PromptTokens(Sequence[int]):
    """A prompt's token ids (shared system prompt + unique question), built only when a policy reads them."""

    __slots__ = ("system", "q_base", "q_len")

    def __init__(self, system: list[int], q_base: int, q_len: int) -> None:
        self.system, self.q_base, self.q_len = system, q_base, q_len

    def __len__(self) -> int:
        return len(self.system) + self.q_len

    def __iter__(self) -> Iterator[int]:
        yield from self.system
        yield from range(self.q_base, self.q_base + self.q_len)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return list(self)[i]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        s = len(self.system)
        return self.system[i] if i < s else self.q_base + (i - s)


@dataclass
class TenantMix:
    tenants: int = 32
    tenant_skew: str = "zipf:1.1"
    system_tokens: int = 2048
    question_tokens: int = 256
    output_tokens: int = 128


def tenant_requests(mix: TenantMix, arrivals: list[float], block_size: int, seed: int) -> list[SimRequest]:
    """Tenant i's prompts share an S-token system prompt; each question is unique."""
    weights = popularity_weights(mix.tenants, parse_skew(mix.tenant_skew))
    pick = random.Random(f"{seed}:tenants")  # same stream as bench.workloads.multi_tenant
    systems = [[(t + 1) * 1_000_003 + i for i in range(mix.system_tokens)] for t in range(mix.tenants)]
    # The system prompt's full blocks are hashed once per tenant; the chain continues into the question.
    full = (mix.system_tokens // block_size) * block_size
    sys_hashes = [chain_hashes(s[:full], block_size) for s in systems]
    out: list[SimRequest] = []
    n_prompt = mix.system_tokens + mix.question_tokens
    total = blocks_for(n_prompt + mix.output_tokens, block_size)
    for i, t_arr in enumerate(arrivals):
        t = pick.choices(range(mix.tenants), weights)[0]
        q_base = -(i + 1) * (mix.question_tokens + 1)  # negative ids: never equal to a system token
        parent = sys_hashes[t][-1] if sys_hashes[t] else None
        tail = systems[t][full:] + list(range(q_base, q_base + mix.question_tokens))
        hashes = sys_hashes[t] + (chain_hashes(tail, block_size, parent) if parent is not None else chain_hashes(tail, block_size))
        out.append(
            SimRequest(
                i, t_arr, n_prompt, mix.output_tokens, hashes, total, f"tenant-{t}",
                PromptTokens(systems[t], q_base, mix.question_tokens),
            )
        )
    return out


def generated(
    kind: str,
    mix: TenantMix,
    block_size: int,
    *,
    rate: float,
    requests: int | None = None,
    concurrency: int | None = None,
    phase_s: float = 180.0,
    duration_s: float | None = None,
    seed: int = 0,
) -> SimWorkload:
    """`multi-tenant` (Poisson `rate` or closed-loop `concurrency`, `requests` total), `step`, `burst`, `diurnal`."""
    params: dict[str, Any] = {"workload": kind, **vars(mix), "rate": rate, "seed": seed}
    if kind == "multi-tenant":
        n = requests or 1000
        arrivals = [0.0] * n if concurrency else bench_poisson(rate, n, seed)
        params.update(requests=n, concurrency=concurrency)
        return SimWorkload(kind, tenant_requests(mix, arrivals, block_size, seed), block_size, concurrency, params)
    if kind == "step":
        fn, peak, dur = step_rate(rate, phase_s), 4.0 * rate, duration_s or 3 * phase_s
        params.update(phase_s=phase_s, shape="1x,4x,1x")
    elif kind == "burst":
        dur = duration_s or 3 * phase_s
        fn, peak = burst_rate(rate, dur / 2, 30.0, 8.0), 8.0 * rate
        params.update(burst_at_s=dur / 2, burst_s=30.0, burst_mult=8.0)
    elif kind == "diurnal":
        dur = duration_s or 3 * phase_s
        fn, peak = diurnal_rate(rate, dur, 5.0), 5.0 * rate
        params.update(period_s=dur, peak_mult=5.0)
    else:
        raise ValueError(f"unknown workload {kind!r}; known: multi-tenant, step, burst, diurnal")
    arrivals = poisson_times(fn, peak, dur, seed)
    if requests:
        arrivals = arrivals[:requests]
    params.update(duration_s=dur, requests=len(arrivals))
    return SimWorkload(kind, tenant_requests(mix, arrivals, block_size, seed), block_size, None, params)
