"""Noisy neighbour, live: 4 victim tenants at ~60% of the cluster's measured capacity together (each
with its own long system prompt) + 1 aggressor at 10x a victim's rate (its own system prompt).

One command, three deployments of the same cluster (each on cold engines, warmed by one request
per tenant that is not measured): `solo` (victims alone), `off` (flow control off: Serve's FIFO
queue, 503 past server.max_queued_requests), `on` (flow.enabled: the ingress's fair queue, 503
past its bounds). Every tenant has its own API key, so the ingress sees five tenants. Capacity:
victims' requests in a closed loop at every slot's worth of concurrency, on the `solo` deployment.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from bench.client import RequestResult, completion_body, stream_request
from bench.tokens import SafeVocab
from bench.workloads import BenchRequest
from flow.attainment import ttft_attainment
from flow.fairness import jain_fairness
from kvserve.config import KVServeConfig, TenantKey

VICTIMS = tuple(f"victim-{i}" for i in range(4))
AGGRESSOR = "aggressor"
TENANTS = (*VICTIMS, AGGRESSOR)


def bench_key(tenant: str) -> str:
    """The API key the bench sends for `tenant` (the config it deploys holds only its sha256)."""
    return f"sk-noisy-neighbour-{tenant}"


@dataclass(frozen=True)
class NoisyOptions:
    system_tokens: int = 1000
    question_tokens: int = 30
    output_tokens: int = 16
    duration_s: float = 45.0
    victim_load: float = 0.6
    aggressor_mult: float = 10.0
    timeout_s: float = 120.0
    seed: int = 0


def noisy_config(base: KVServeConfig, flow_on: bool) -> KVServeConfig:
    cfg = base.model_copy(deep=True)
    cfg.tenants.open_mode = False
    cfg.tenants.keys = [TenantKey.model_validate({"tenant": t, "key_sha256": hashlib.sha256(bench_key(t).encode()).hexdigest()})
                        for t in TENANTS]
    cfg.flow.enabled = flow_on
    return cfg


def prompts(vocab: SafeVocab, opts: NoisyOptions, n: int, tenant: str) -> list[BenchRequest]:
    """`n` requests of `tenant`: its own system prompt + a unique question each."""
    system = vocab.sample(random.Random(f"{opts.seed}:noisy:system:{tenant}"), opts.system_tokens)
    qrng = random.Random(f"{opts.seed}:noisy:questions:{tenant}")
    out = []
    for i in range(n):
        ids = system + vocab.sample(qrng, opts.question_tokens)
        out.append(BenchRequest(i, tuple(ids), vocab.text(ids), opts.output_tokens, tenant=tenant))
    return out


def schedule(rates: Mapping[str, float], duration_s: float, seed: int) -> list[tuple[float, str]]:
    out = []
    for t, rate in rates.items():
        rng, now = random.Random(f"{seed}:noisy:{t}"), 0.0
        while rate > 0:
            now += rng.expovariate(rate)
            if now >= duration_s:
                break
            out.append((now, t))
    return sorted(out)


async def _send(client: httpx.AsyncClient, url: str, model: str, req: BenchRequest, timeout_s: float) -> RequestResult:
    return await stream_request(client, f"{url}/v1/completions", completion_body(req, model, False), idx=req.idx,
                                tenant=req.tenant, timeout_s=timeout_s,
                                headers={"Authorization": f"Bearer {bench_key(req.tenant or '')}"})


async def replay(url: str, model: str, plan: list[tuple[float, BenchRequest]], timeout_s: float) -> list[RequestResult]:
    """Open loop: each request at its offset, however many are outstanding (the server must cope)."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(limits=limits, timeout=None) as client:
        t0 = time.perf_counter()

        async def one(at: float, req: BenchRequest) -> RequestResult:
            await asyncio.sleep(max(at - (time.perf_counter() - t0), 0.0))
            return await _send(client, url, model, req, timeout_s)

        return list(await asyncio.gather(*(one(at, r) for at, r in plan)))


async def capacity_rps(url: str, model: str, reqs: list[BenchRequest], concurrency: int, timeout_s: float) -> float:
    """Completed requests/s of a closed loop with `concurrency` in flight (victims' mix, all replicas busy)."""
    async with httpx.AsyncClient(timeout=None) as client:
        it, done = iter(reqs), []
        t0 = time.perf_counter()

        async def worker() -> None:
            for r in it:
                res = await _send(client, url, model, r, timeout_s)
                if res.ok:
                    done.append(res)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return len(done) / (time.perf_counter() - t0)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q / 100 * len(s) + 0.5)) - 1))]


def summarize(results: list[RequestResult], span_s: float, ttft_target_ms: float) -> dict[str, Any]:
    by: dict[str, list[RequestResult]] = {}
    for r in results:
        by.setdefault(r.tenant or "", []).append(r)
    tenants, service, demand = {}, {}, {}
    for t, rs in sorted(by.items()):
        ok = [r for r in rs if r.ok]
        ttft = [r.ttft_s * 1000.0 for r in ok if r.ttft_s is not None]
        work = [(r.prompt_tokens or 0) - (r.cached_tokens or 0) + r.output_tokens for r in ok]
        per_req = sum(work) / len(work) if work else 0.0
        service[t], demand[t] = sum(work) / span_s, len(rs) * per_req / span_s
        n429 = sum(1 for r in rs if r.status == 429)
        n503 = sum(1 for r in rs if r.status == 503)
        tenants[t] = {
            "ttft_p50_ms": _pct(ttft, 50), "ttft_p90_ms": _pct(ttft, 90),
            "output_tok_per_s": sum(r.output_tokens for r in ok) / span_s,
            "status_429": n429, "status_503": n503, "errors": sum(1 for r in rs if not r.ok) - n429 - n503,
            "requests": len(rs), "ttft_slo_attainment": ttft_attainment(
                [r.ttft_s * 1000.0 if r.ok and r.ttft_s is not None else None for r in rs], ttft_target_ms),
        }
    return {"tenants": tenants, "jain_fairness": jain_fairness(service, demand, {t: 1.0 for t in service}),
            "output_tok_per_s": sum(v["output_tok_per_s"] for v in tenants.values())}


def targets(runs: Mapping[str, Any]) -> dict[str, Any]:
    on, off, solo = runs["on"]["tenants"], runs["off"], runs["solo"]["tenants"]
    ratios = {v: on[v]["ttft_p90_ms"] / solo[v]["ttft_p90_ms"] for v in VICTIMS
              if on.get(v, {}).get("ttft_p90_ms") and solo.get(v, {}).get("ttft_p90_ms")}
    turned = sum(on[v]["status_429"] + on[v]["status_503"] for v in VICTIMS if v in on)
    agg = on.get(AGGRESSOR, {})
    tput = runs["on"]["output_tok_per_s"] / off["output_tok_per_s"] if off["output_tok_per_s"] else None
    jf = runs["on"]["jain_fairness"]
    return {
        "victim_p90_over_solo": {"bound": 1.3, "value": max(ratios.values(), default=None), "per_victim": ratios,
                                 "met": bool(ratios) and max(ratios.values()) <= 1.3},
        "victims_turned_away": {"bound": 0, "value": turned, "met": turned == 0,
                                "aggressor": agg.get("status_429", 0) + agg.get("status_503", 0)},
        "jain_fairness": {"bound": 0.95, "value": jf, "met": (jf or 0) >= 0.95},
        "throughput_on_over_off": {"bound": 0.95, "value": tput, "met": tput is not None and tput >= 0.95},
    }


def run_noisy(base: KVServeConfig, url: str, vocab: SafeVocab, opts: NoisyOptions,
              deploy: Callable[[KVServeConfig], None], log: Callable[[str], None]) -> dict[str, Any]:
    model = base.model.name
    target = next((c.ttft_p90_ms for c in base.tenants.classes.values() if c.ttft_p90_ms), None) or base.slo.ttft_p90_ms
    pools = {t: prompts(vocab, opts, 4000 if t == AGGRESSOR else 800, t) for t in TENANTS}
    warm = {t: pools[t].pop() for t in TENANTS}
    out: dict[str, Any] = {"runs": {}}
    cap = victim_rate = None
    for run in ("solo", "off", "on"):
        cfg = noisy_config(base, flow_on=run == "on")
        log(f"{run}: deploying (flow control {'on' if cfg.flow.enabled else 'off'})")
        deploy(cfg)
        tenants = VICTIMS if run == "solo" else TENANTS
        asyncio.run(replay(url, model, [(0.0, warm[t]) for t in tenants], opts.timeout_s))  # not measured
        if cap is None:
            probe = [r for t in VICTIMS for r in pools[t][-8:]]
            slots = base.num_replicas * base.engine.max_num_seqs
            cap = asyncio.run(capacity_rps(url, model, probe, slots, opts.timeout_s))
            victim_rate = opts.victim_load * cap / len(VICTIMS)
            log(f"capacity {cap:.2f} req/s of the victims' mix: each victim at {victim_rate:.3f} req/s, "
                f"the aggressor at {opts.aggressor_mult * victim_rate:.3f}")
        rates = {t: (opts.aggressor_mult if t == AGGRESSOR else 1.0) * victim_rate for t in tenants}
        sched = schedule(rates, opts.duration_s, opts.seed)
        used = {t: 0 for t in TENANTS}
        plan = []
        for at, t in sched:
            plan.append((at, pools[t][used[t] % (len(pools[t]) - 8)]))
            used[t] += 1
        t0 = time.perf_counter()
        results = asyncio.run(replay(url, model, plan, opts.timeout_s))
        out["runs"][run] = summarize(results, time.perf_counter() - t0, target)
        log(f"{run}: {len(results)} requests in {time.perf_counter() - t0:.0f} s")
    out["targets"] = targets(out["runs"])
    out["workload"] = {
        **vars(opts), "replicas": base.num_replicas, "capacity_req_per_s": cap, "victim_rate_per_s": victim_rate,
        "aggressor_rate_per_s": opts.aggressor_mult * (victim_rate or 0), "flow": base.flow.model_dump(),
        "serve_max_queued_requests": base.server.max_queued_requests,
        "mechanism": {"off": "Serve's FIFO router queue; 503 past server.max_queued_requests (no per-tenant limits)",
                      "on": "the ingress's fair queue; 503 past its per-tenant / total bounds (no per-tenant limits)",
                      "solo": "victims alone, flow control off"},
    }
    return out
