"""Fault scenarios under load (`kvserve bench --duration D --chaos KIND`): SIGKILL a replica's
vLLM engine process, a whole replica, or the ingress (and with it the router and its prefix index)
mid-load, then count what the clients saw.

- lost: requests that failed without producing any output. For the replica faults that must be
  zero (the ingress re-sends them); for an ingress restart, the requests that were in flight on
  the killed process are counted apart (they had nowhere to be re-sent from). A 503/429 saying
  "overloaded, retry later" (with Retry-After) is counted apart too (`shed_overloaded`): the
  survivors' capacity, not the fault, refused it.
- cut mid-stream: requests that had tokens when their replica died; each should end with an SSE
  error event (`cut_with_error_event`), not a dropped connection.
- hit rate over the `window_s` before the fault and after it; times to drop the dead replica
  from routing (the router's own record in /kvserve/stats), to a replacement replica serving, and
  to its first prefix-cache hit.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import httpx

from bench.client import RequestResult
from bench.ray_procs import engine_core, serve_processes
from bench.timed_load import failure_key, hit_rate

KINDS = ("kill-engine", "kill-replica", "restart-ingress")


@dataclass
class Fault:
    kind: str
    at_s: float  # since the run's start
    wall: float  # time.time() when the signal was sent
    victim: str  # replica id, or "ingress"
    pid: int


@dataclass
class Poll:
    at_s: float
    replicas: list[str] | None  # None: /kvserve/stats did not answer
    ready: bool | None
    router_drops: dict = field(default_factory=dict)


def inject(kind: str, app_name: str, stats: Sequence[dict], at_s: float) -> Fault:
    """SIGKILL the fault's process. The replica victim is the busiest one (most requests served)."""
    if kind not in KINDS:
        raise ValueError(f"unknown fault {kind!r}; one of {', '.join(KINDS)}")
    procs = serve_processes(app_name)
    if kind == "restart-ingress":
        if not procs.ingress:
            raise LookupError("no live Ingress actor")
        victim, pid = "ingress", procs.ingress[0]
    else:
        ranked = sorted((s for s in stats if s["replica_id"] in procs.replicas), key=lambda s: -s.get("num_requests", 0))
        if not ranked:
            raise LookupError(f"no replica in /kvserve/stats matches a live actor ({sorted(procs.replicas)})")
        victim = ranked[0]["replica_id"]
        pid = procs.replicas[victim] if kind == "kill-replica" else engine_core(procs.replicas[victim]).pid
    wall = time.time()
    os.kill(pid, signal.SIGKILL)
    return Fault(kind, at_s, wall, victim, pid)


async def poll(client: httpx.AsyncClient, base_url: str, headers: dict | None, t0: float, until_s: float,
               out: list[Poll], period_s: float = 0.5) -> None:
    """Every `period_s`: the replicas /kvserve/stats lists, the router's drops, and /ready."""
    while time.perf_counter() - t0 < until_s:
        at = time.perf_counter() - t0
        replicas, drops, ready = None, {}, None
        try:
            r = await client.get(f"{base_url}/kvserve/stats", headers=headers, timeout=5.0)
            if r.status_code == 200:
                body = r.json()
                replicas = [s["replica_id"] for s in body.get("replicas", [])]
                drops = body.get("router_drops") or {}
            ready = (await client.get(f"{base_url}/ready", headers=headers, timeout=5.0)).status_code == 200
        except (httpx.HTTPError, ValueError):
            pass
        out.append(Poll(at, replicas, ready, drops))
        await asyncio.sleep(period_s)


def _rel(r: RequestResult, t0: float) -> float:
    return r.start - t0


def summarize(fault: Fault, results: Sequence[RequestResult], polls: Sequence[Poll], t0: float,
              replicas_before: Sequence[str], window_s: float = 60.0) -> dict:
    """What the clients saw around the fault (see the module docstring)."""
    failed = [r for r in results if not r.ok]
    fault_s = fault.at_s

    def in_flight_at_fault(r: RequestResult) -> bool:
        return _rel(r, t0) < fault_s <= (r.done_at or r.start) - t0

    cut = [r for r in failed if r.output_tokens > 0]
    # A 503/429 that says "overloaded, retry later" is the server shedding load the survivors cannot
    # carry (capacity, not the fault's requests): counted apart from requests the fault lost.
    shed = [r for r in failed if r.output_tokens == 0 and r.status in (429, 503)
            and r.error_detail not in ("code: engine_dead", "code: replica_lost")]
    unstarted = [r for r in failed if r.output_tokens == 0 and r not in shed]
    if fault.kind == "restart-ingress":
        lost = [r for r in unstarted if not in_flight_at_fault(r)]
        lost_in_flight = [r for r in failed if in_flight_at_fault(r)]
    else:
        lost, lost_in_flight = unstarted, []
    before = [r for r in results if fault_s - window_s <= _rel(r, t0) < fault_s]
    after = [r for r in results if fault_s <= _rel(r, t0) < fault_s + window_s]
    hit_before, hit_after = hit_rate(before), hit_rate(after)
    out: dict = {
        "fault": asdict(fault),
        "requests": len(results),
        "ok": len(results) - len(failed),
        "lost": len(lost),
        "failed_in_flight_on_killed_process": len(lost_in_flight),
        "shed_overloaded": len(shed),
        "cut_mid_stream": len(cut),
        "cut_with_error_event": sum(1 for r in cut if r.error == "stream_error"),
        "errors_by_status": dict(Counter(failure_key(r) for r in failed)),
        "window_s": window_s,
        "hit_rate_before": hit_before,
        "hit_rate_after": hit_after,
        "hit_rate_delta_points": None if hit_before is None or hit_after is None
        else round(100 * (hit_after - hit_before), 2),
        "requests_before": len(before),
        "requests_after": len(after),
    }
    after_polls = [p for p in polls if p.at_s >= fault_s]
    drop = next((p.router_drops[fault.victim] for p in after_polls if fault.victim in p.router_drops), None)
    out["time_to_drop_s"] = None if drop is None else round(drop["at"] - fault.wall, 2)
    out["drop_reason"] = None if drop is None else drop["reason"]
    new = next((p for p in after_polls if p.replicas and set(p.replicas) - set(replicas_before)), None)
    out["time_to_replacement_listed_s"] = None if new is None else round(new.at_s - fault_s, 2)
    not_ready = next((p for p in after_polls if p.ready is False), None)
    ready = next((p for p in after_polls if not_ready and p.at_s > not_ready.at_s and p.ready), None)
    out["time_to_ready_again_s"] = None if ready is None else round(ready.at_s - fault_s, 2)
    if fault.kind == "restart-ingress":
        served = [r for r in results if r.ok and _rel(r, t0) >= fault_s]
        first = min(((r.end_at or 0) - t0 for r in served), default=None)
        out["time_to_serving_again_s"] = None if first is None else round(first - fault_s, 2)
    else:
        fresh = [r for r in results if r.ok and r.replica and r.replica not in replicas_before]
        first = min(((r.first_token_at or 0) - t0 for r in fresh), default=None)
        hit = min(((r.first_token_at or 0) - t0 for r in fresh if r.cached_tokens), default=None)
        out["time_to_replacement_serving_s"] = None if first is None else round(first - fault_s, 2)
        out["time_to_replacement_cache_hit_s"] = None if hit is None else round(hit - fault_s, 2)
        out["requests_on_replacement"] = len(fresh)
    return out
