"""The overhead bench's load: seeded random-token prompts, closed loop per concurrency level.

The same requests go to each target, through the same client code
(`bench.client.stream_request`), so both are measured alike.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence

import httpx

from bench.client import RequestResult
from bench.loop_lag import LoopLag
from bench.metrics import RunMetrics, summarize
from bench.runner import ReplayOptions, _closed_loop, _send
from bench.tokens import SafeVocab
from bench.workloads import BenchRequest


def random_requests(vocab: SafeVocab, n: int, input_len: int, output_len: int, seed: str) -> list[BenchRequest]:
    """n prompts of exactly `input_len` random round-trip-safe tokens (no shared prefixes: no cache hits)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ids = vocab.sample(rng, input_len)
        out.append(BenchRequest(i, tuple(ids), vocab.text(ids), output_len))
    return out


def level_requests(vocab: SafeVocab, levels: Sequence[int], counts: Sequence[int], input_len: int,
                   output_len: int, seed: int) -> dict[int, list[BenchRequest]]:
    """Each level's own requests (own seed): no level is served from another level's cache."""
    return {c: random_requests(vocab, n, input_len, output_len, f"{seed}:overhead:c{c}")
            for c, n in zip(levels, counts)}


async def measure_levels(
    opts: ReplayOptions,
    levels: dict[int, list[BenchRequest]],
    warmup: Sequence[BenchRequest] = (),
    on_level: Callable[[int, RunMetrics], None] | None = None,
    keep: dict[int, list[RequestResult]] | None = None,
    before_level: Callable[[int], None] | None = None,
) -> dict[int, RunMetrics]:
    """Warm up one request at a time (excluded), then each level's closed loop in turn.
    `keep`: filled with each level's request results; `before_level(c)` runs as level c starts."""
    top = max(levels) if levels else 1
    limits = httpx.Limits(max_connections=top + 4, max_keepalive_connections=top + 4)
    timeout = httpx.Timeout(opts.timeout_s, connect=opts.connect_timeout_s)
    out: dict[int, RunMetrics] = {}
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        for req in warmup:
            res = await _send(client, opts, req)
            if not res.ok:
                raise RuntimeError(f"warm-up request failed: {res.error} {res.error_detail or ''}".strip())
        for c, reqs in levels.items():
            if before_level:
                before_level(c)
            lag = LoopLag()
            lag_task = asyncio.create_task(lag.run())
            try:
                level_opts = ReplayOptions(**{**vars(opts), "concurrency": c})
                results: list[RequestResult] = await _closed_loop(client, level_opts, reqs, None)
            finally:
                lag.stop()
                await lag_task
            m = summarize(sorted(results, key=lambda r: r.idx), slo_ttft_ms=opts.slo_ttft_ms,
                          slo_itl_ms=opts.slo_itl_ms)
            m.client_loop_lag_p99_ms, m.client_loop_lag_max_ms = lag.summary()
            out[c] = m
            if keep is not None:
                keep[c] = results
            if on_level:
                on_level(c, m)
    return out


def chunks_per_token(results: Sequence[RequestResult]) -> float | None:
    """Streamed chunks with text per output token (1.0: one token a chunk; less: tokens were merged)."""
    ok = [r for r in results if r.ok and r.output_tokens]
    tokens = sum(r.output_tokens for r in ok)
    return sum(len(r.itl_s) + 1 for r in ok) / tokens if tokens else None
