"""Open-loop load for a fixed duration (the fault and soak benches): each request is sent at its
seeded arrival time, streamed and measured by bench.client; nothing is retried by the client, so
every failure the server lets through is counted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import httpx

from bench.client import RequestResult, completion_body, stream_request
from bench.workloads import BenchRequest


def parse_duration(text: str) -> float:
    """'30m', '180s', '1h', '90' (seconds) -> seconds."""
    text = text.strip().lower()
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    scale = units.get(text[-1:], None)
    value = float(text[:-1] if scale else text)
    if value <= 0:
        raise ValueError(f"duration must be positive, got {text!r}")
    return value * (scale or 1.0)


async def send_for(client: httpx.AsyncClient, base_url: str, model: str, requests: Sequence[BenchRequest],
                   duration_s: float, t0: float, *, headers: dict | None = None, timeout_s: float = 120.0,
                   max_inflight: int = 256, use_token_ids: bool = False,
                   on_result: Callable[[RequestResult], None] | None = None) -> list[RequestResult]:
    """Send every request whose arrival falls within `duration_s` of `t0` (time.perf_counter())."""
    url = base_url.rstrip("/") + "/v1/completions"
    room = asyncio.Semaphore(max_inflight)

    async def one(req: BenchRequest) -> RequestResult:
        async with room:
            res = await stream_request(client, url, completion_body(req, model, use_token_ids), idx=req.idx,
                                       tenant=req.tenant, timeout_s=timeout_s, headers=headers)
        if on_result:
            on_result(res)
        return res

    tasks = []
    for req in sorted(requests, key=lambda r: r.arrival_s or 0.0):
        at = req.arrival_s or 0.0
        if at >= duration_s:
            break
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(req)))
    return list(await asyncio.gather(*tasks))


def hit_rate(results: Sequence[RequestResult]) -> float | None:
    """Prompt tokens served from the prefix cache / prompt tokens, over the successful requests."""
    done = [r for r in results if r.ok and r.prompt_tokens]
    total = sum(r.prompt_tokens or 0 for r in done)
    return sum(r.cached_tokens or 0 for r in done) / total if total else None


def failure_key(r: RequestResult) -> str:
    """How a request failed: its HTTP status, else the client's error kind."""
    if r.status is not None and r.status != 200:
        return str(r.status)
    return r.error or "ok"
