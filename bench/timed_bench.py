"""`kvserve bench --duration D [--chaos KIND]`: an open-loop load at `--rate` for a fixed time,
with one fault injected (bench.chaos) or, without --chaos, a soak that samples every Serve
process's memory and fds (bench.soak). Writes one JSON result; exit 1 when the run's check fails
(a fault: any lost request; a soak: any error)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from rich.console import Console

from bench import chaos, soak
from bench.client import RequestResult
from bench.timed_load import failure_key, hit_rate, send_for


@dataclass
class TimedOptions:
    url: str
    headers: dict
    model: str
    app_name: str
    rate: float
    duration_s: float
    chaos: str | None = None
    chaos_at_s: float | None = None  # default: half-way
    window_s: float = 60.0
    sample_s: float = 10.0
    timeout_s: float = 120.0
    max_inflight: int = 256
    use_token_ids: bool = False


def requests_for(rate: float, duration_s: float) -> int:
    """Enough seeded Poisson arrivals to cover the duration (the sender stops at the duration)."""
    return max(1, math.ceil(rate * duration_s * 1.3 + 20))


async def _run(opts: TimedOptions, requests: list, console: Console) -> dict:
    t0 = time.perf_counter()
    done = {"n": 0, "failed": 0}

    def on_result(res: RequestResult) -> None:
        done["n"] += 1
        done["failed"] += 0 if res.ok else 1
        if done["n"] % 50 == 0:
            console.print(f"{time.perf_counter() - t0:6.0f} s: {done['n']} done, {done['failed']} failed")

    limits = httpx.Limits(max_connections=opts.max_inflight + 8, max_keepalive_connections=opts.max_inflight)
    async with httpx.AsyncClient(limits=limits, timeout=opts.timeout_s) as client:
        sender = asyncio.create_task(send_for(
            client, opts.url, opts.model, requests, opts.duration_s, t0, headers=opts.headers,
            timeout_s=opts.timeout_s, max_inflight=opts.max_inflight, use_token_ids=opts.use_token_ids,
            on_result=on_result))
        out: dict = {}
        if opts.chaos:
            polls: list[chaos.Poll] = []
            poller = asyncio.create_task(chaos.poll(client, opts.url, opts.headers, t0, opts.duration_s, polls))
            at = opts.chaos_at_s if opts.chaos_at_s is not None else opts.duration_s / 2
            await asyncio.sleep(max(t0 + at - time.perf_counter(), 0.0))
            stats = (await client.get(f"{opts.url}/kvserve/stats", headers=opts.headers, timeout=30)).json()["replicas"]
            before = [s["replica_id"] for s in stats]
            fault = chaos.inject(opts.chaos, opts.app_name, stats, time.perf_counter() - t0)
            console.print(f"[bold red]{fault.at_s:6.0f} s: {opts.chaos}: SIGKILL pid {fault.pid} ({fault.victim})[/]")
            results = await sender
            await poller
            out["summary"] = chaos.summarize(fault, results, polls, t0, before, opts.window_s)
        else:
            samples: list[dict] = []
            sampler = asyncio.create_task(soak.sample(opts.app_name, t0, opts.duration_s, opts.sample_s, samples))
            results = await sender
            await sampler
            out["summary"] = soak.summarize(samples, opts.duration_s)
            out["samples"] = samples
    failed = [r for r in results if not r.ok]
    out["load"] = {
        "requests": len(results), "ok": len(results) - len(failed), "errors": len(failed),
        "errors_by_status": {k: sum(1 for r in failed if failure_key(r) == k) for k in {failure_key(r) for r in failed}},
        "hit_rate": hit_rate(results),
        "achieved_rate_per_s": round(len(results) / opts.duration_s, 3),
    }
    return out


def run_timed(opts: TimedOptions, requests: list, json_out: Path | None, params: dict, console: Console) -> bool:
    """Run it, print the verdict, write the JSON; True when the run's check passed."""
    out = asyncio.run(_run(opts, requests, console))
    result = {"scenario": opts.chaos or "soak", "params": {**params, "duration_s": opts.duration_s,
                                                           "rate": opts.rate, "chaos_at_s": opts.chaos_at_s,
                                                           "window_s": opts.window_s}, **out}
    s, load = out["summary"], out["load"]
    if opts.chaos:
        ok = s["lost"] == 0
        console.print(f"{opts.chaos}: {load['requests']} requests, lost {s['lost']}, cut mid-stream "
                      f"{s['cut_mid_stream']} ({s['cut_with_error_event']} with an SSE error event), errors "
                      f"{s['errors_by_status']}, hit rate {s['hit_rate_before']} -> {s['hit_rate_after']}, "
                      f"drop {s['time_to_drop_s']} s")
    else:
        ok = load["errors"] == 0
        console.print(f"soak: {load['requests']} requests, {load['errors']} errors, max RSS growth "
                      f"{s['max_rss_growth_pct']}% after {s['warmup_s']:.0f} s, fds flat {s['fds_flat']}")
    result["passed"] = ok
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result, indent=1, default=str))
        console.print(f"wrote {json_out}")
    return ok


def check_options(duration: str | None, chaos_kind: str | None, rate: float | None) -> float | None:
    """--duration in seconds (None: not a timed run); ValueError for an unusable combination."""
    from bench.timed_load import parse_duration

    if duration is None:
        if chaos_kind:
            raise ValueError("--chaos needs --duration")
        return None
    if chaos_kind and chaos_kind not in chaos.KINDS:
        raise ValueError(f"--chaos must be one of {', '.join(chaos.KINDS)}")
    if not rate:
        raise ValueError("--duration needs an open-loop --rate")
    return parse_duration(duration)


def app_name(url: str, headers: dict, config_file: Path | None) -> str:
    """The Serve app's name (its actors carry it): from --config, else the server's config."""
    if config_file is not None:
        from kvserve.config import load_config

        return load_config(config_file).app_name
    from bench.server_stats import fetch_config_sync

    return fetch_config_sync(url, headers).get("app_name", "kvserve")
