"""Replays a workload against the live endpoint, per policy, and measures it.

Closed loop (`concurrency`): C workers each send the next request as soon as
their previous one finishes. Open loop (requests carry `arrival_s`): each request
is sent at its arrival offset, with at most `max_inflight` outstanding (an
arrival that finds the cap full waits; that is counted as `late_arrivals`).
Every loop is bounded by the request count and every request by `timeout_s`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import httpx

from bench.client import RequestResult, auth_headers, completion_body, stream_request
from bench.cluster_check import verify
from bench.loop_lag import LoopLag
from bench.metrics import RunMetrics, summarize
from bench.server_stats import (COLD_START_TTFT, INGRESS_TTFT, Snapshot, cold_start_delta, engine_step_ms,
                                fetch_histograms, fetch_settled_stats, fetch_stats,
                                prefix_hit_rate, ttft_breakdown_ms)
from bench.timeline import StatsSampler, TimelineRow, build_timeline
from bench.workloads import BenchRequest
from cluster.local import deploy as _deploy

OnResult = Callable[[RequestResult], None]


@dataclass
class ReplayOptions:
    base_url: str
    model: str
    api_key: str | None = None
    concurrency: int | None = None  # closed loop when set; else arrivals drive an open loop
    timeout_s: float = 120.0
    # Loopback handshakes complete in the kernel at once; the timer only catches a dead server,
    # and on a saturated machine a starved client's loop can run seconds late (`bench.loop_lag`).
    connect_timeout_s: float = 30.0
    max_inflight: int = 256
    use_token_ids: bool = False
    slo_ttft_ms: float = 2000.0
    slo_itl_ms: float = 200.0
    sample_stats: bool = False  # poll /kvserve/stats each second for the timeline
    ready_timeout_s: float = 900.0  # how long to wait for every replica to serve before each run
    replica_settle_s: float = 30.0  # then how long the replicas answering stats may lag /ready

    @property
    def headers(self) -> dict[str, str]:
        return auth_headers(self.api_key)


@dataclass
class PolicyRun:
    policy: str
    metrics: RunMetrics
    results: list[RequestResult]
    timeline: list[TimelineRow] = field(default_factory=list)
    late_arrivals: int = 0


async def _send(client: httpx.AsyncClient, opts: ReplayOptions, req: BenchRequest) -> RequestResult:
    return await stream_request(
        client,
        f"{opts.base_url}/v1/completions",
        completion_body(req, opts.model, opts.use_token_ids),
        idx=req.idx,
        tenant=req.tenant,
        timeout_s=opts.timeout_s,
        headers=opts.headers,
    )


async def _closed_loop(
    client: httpx.AsyncClient, opts: ReplayOptions, reqs: Sequence[BenchRequest], on_result: OnResult | None
) -> list[RequestResult]:
    it = iter(reqs)
    out: list[RequestResult] = []

    async def worker() -> None:
        for req in it:  # shared iterator: each request is taken exactly once
            res = await _send(client, opts, req)
            out.append(res)
            if on_result:
                on_result(res)

    await asyncio.gather(*(worker() for _ in range(max(1, opts.concurrency or 1))))
    return out


async def _open_loop(
    client: httpx.AsyncClient, opts: ReplayOptions, reqs: Sequence[BenchRequest], on_result: OnResult | None
) -> tuple[list[RequestResult], int]:
    gate = asyncio.Semaphore(opts.max_inflight)
    out: list[RequestResult] = []
    late = 0
    t0 = time.perf_counter()

    async def one(req: BenchRequest) -> None:
        try:
            res = await _send(client, opts, req)
        finally:
            gate.release()
        out.append(res)
        if on_result:
            on_result(res)

    tasks = []
    for req in sorted(reqs, key=lambda r: r.arrival_s or 0.0):
        delay = t0 + (req.arrival_s or 0.0) - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if gate.locked():
            late += 1
        await gate.acquire()
        tasks.append(asyncio.create_task(one(req)))
    await asyncio.gather(*tasks)
    return out, late


async def replay(
    opts: ReplayOptions,
    reqs: Sequence[BenchRequest],
    *,
    policy: str = "current",
    on_result: OnResult | None = None,
    warmup: Sequence[BenchRequest] = (),
) -> PolicyRun:
    """Warm up (excluded), snapshot the engines' counters, replay, snapshot again, summarize."""
    limits = httpx.Limits(max_connections=max(opts.max_inflight, opts.concurrency or 1) + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(opts.timeout_s, connect=opts.connect_timeout_s),
                                 limits=limits) as client:
        for req in warmup:  # one at a time: wakes engines without shaping their caches much
            await _send(client, opts, req)
        before: Snapshot = await fetch_settled_stats(client, opts.base_url, opts.headers)
        hist_before = await fetch_histograms(client, opts.base_url, opts.headers)
        sampler = StatsSampler(lambda: fetch_stats(client, opts.base_url, opts.headers)) if opts.sample_stats else None
        sampler_task = asyncio.create_task(sampler.run()) if sampler else None
        lag = LoopLag()
        lag_task = asyncio.create_task(lag.run())
        t0 = time.perf_counter()
        late = 0
        try:
            if opts.concurrency:
                results = await _closed_loop(client, opts, reqs, on_result)
            else:
                results, late = await _open_loop(client, opts, reqs, on_result)
        finally:
            lag.stop()
            await lag_task
            if sampler and sampler_task:
                sampler.stop()
                await sampler_task
        after: Snapshot = await fetch_settled_stats(client, opts.base_url, opts.headers)
        hist_after = await fetch_histograms(client, opts.base_url, opts.headers)
    results.sort(key=lambda r: r.idx)
    metrics = summarize(results, slo_ttft_ms=opts.slo_ttft_ms, slo_itl_ms=opts.slo_itl_ms, replicas=after.keys())
    metrics.prefix_hit_rate = prefix_hit_rate(before, after)
    hb, ha = hist_before or {}, hist_after or {}
    metrics.cold_start_requests, metrics.cold_start_ttft_s = cold_start_delta(hb.get(COLD_START_TTFT),
                                                                              ha.get(COLD_START_TTFT))
    ttfts = [1000.0 * r.ttft_s for r in results if r.ok and r.ttft_s is not None]
    metrics.ttft_breakdown_ms = ttft_breakdown_ms(ttfts, before, after, hb.get(INGRESS_TTFT), ha.get(INGRESS_TTFT))
    metrics.engine_step_ms = engine_step_ms(before, after, metrics.duration_s)
    metrics.client_loop_lag_p99_ms, metrics.client_loop_lag_max_ms = lag.summary()
    timeline = build_timeline(results, sampler.samples, t0) if sampler else []
    return PolicyRun(policy, metrics, results, timeline, late)


Deploy = Callable[[Any], "str | None"]  # deploys a config; returns the cache epoch the replicas must report
OnDone = Callable[[list[PolicyRun]], None]


def default_deploy(address: str, cold_engines: bool = False) -> Deploy:
    """Every policy starts on empty prefix caches. By default the engines are kept (a new cache epoch
    empties their caches; the policy's router starts with the ingress, which restarts): a GPU engine
    takes minutes to start, and what the policies are compared on, the caches, starts empty either way.
    `cold_engines`: restart every replica instead."""

    def deploy(cfg: Any) -> str | None:
        if cold_engines:
            _deploy(cfg, address=address, restart=True)
            return None
        epoch = uuid.uuid4().hex
        _deploy(cfg, address=address, cache_epoch=epoch)
        return epoch

    return deploy


def policy_config(base_cfg: Any, policy: str | None, kv_cache_tokens: int | None) -> Any:
    """A copy of the cluster's config with the policy / KV capacity under test."""
    cfg = base_cfg.model_copy(deep=True)
    if policy is not None:
        cfg.router.policy = policy
    if kv_cache_tokens is not None:
        cfg.engine.kv_cache_tokens = kv_cache_tokens
    return cfg


def run_policies(
    opts: ReplayOptions,
    reqs: Sequence[BenchRequest],
    policies: Sequence[str | None],
    *,
    base_cfg: Any | None = None,
    kv_cache_tokens: int | None = None,
    deploy: Deploy | None = None,
    warmup: Sequence[BenchRequest] = (),
    on_start: Callable[[str], None] | None = None,
    on_result: OnResult | None = None,
    on_done: OnDone | None = None,
    expected_replicas: int | None = None,
    on_wait: Callable[[str], None] | None = None,
) -> list[PolicyRun]:
    """For each policy: redeploy (if a policy or KV size is given), check that the cluster serving is
    the one asked for (`bench.cluster_check`: ClusterMismatch otherwise), then replay the identical
    requests. `on_done` gets the runs so far after each policy, so a later failure loses nothing.

    A policy of None means "whatever is deployed now" (no redeploy unless kv_cache_tokens is set);
    `expected_replicas` is then its size (None: not checked). A redeploy expects its config's size.
    """
    runs: list[PolicyRun] = []
    for policy in policies:
        name = policy or "current"
        expected, epoch = expected_replicas, None
        if policy is not None or kv_cache_tokens is not None:
            if base_cfg is None or deploy is None:
                raise ValueError("redeploying needs the cluster's config and a deploy function")
            cfg = policy_config(base_cfg, policy, kv_cache_tokens)
            epoch = deploy(cfg)
            expected = None if cfg.autoscaling.enabled else cfg.num_replicas
        serving = asyncio.run(verify(opts.base_url, opts.headers, expected, opts.ready_timeout_s,
                                     opts.replica_settle_s, on_wait, cache_epoch=epoch))
        if on_start:
            on_start(name)
        run = asyncio.run(replay(opts, reqs, policy=name, on_result=on_result, warmup=warmup))
        run.metrics.replicas = len(serving)
        runs.append(run)
        if on_done:
            on_done(runs)
    return runs
