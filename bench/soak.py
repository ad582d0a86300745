"""Soak (`kvserve bench --duration 30m` without --chaos): memory and file descriptors of every
Serve process over a long steady load. The ingress, each engine replica (with its vLLM engine-core
child) and the Serve controller are sampled with psutil from the Ray actors' pids; the verdict is
each one's RSS growth from the end of the warm-up (first 5 min, or a third of a shorter run) to the
end, and its open-fd change."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import psutil

from bench.ray_procs import serve_processes, tree_usage

RSS_GROWTH_LIMIT_PCT = 5.0  # issue 25: < 5% after the first 5 min


async def sample(app_name: str, t0: float, until_s: float, period_s: float, out: list[dict]) -> None:
    """Every `period_s`: {"at_s", "procs": {name: {rss_mib, fds, tree_rss_mib, tree_fds}}}."""
    while True:
        at = time.perf_counter() - t0
        procs: dict[str, dict] = {}
        try:
            named = await asyncio.to_thread(lambda: serve_processes(app_name).named())
            for name, pid in named.items():
                try:
                    procs[name] = tree_usage(pid)
                except psutil.Error:
                    continue  # gone between the listing and the sample
        except Exception as e:  # the state API can time out on a saturated host: keep sampling
            procs = {"_error": {"message": f"{type(e).__name__}: {e}"}}
        out.append({"at_s": round(at, 1), "procs": procs})
        if at >= until_s:
            return
        await asyncio.sleep(min(period_s, max(until_s - at, 0.0)) or period_s)


def warmup_s(duration_s: float) -> float:
    return min(300.0, duration_s / 3)


def summarize(samples: Sequence[dict], duration_s: float) -> dict:
    """Per process: RSS (own and with children) and fds at the warm-up's end and at the end, growth %."""
    warm = warmup_s(duration_s)
    names = sorted({n for s in samples for n in s["procs"] if not n.startswith("_")})
    per: dict[str, dict] = {}
    for name in names:
        seen = [(s["at_s"], s["procs"][name]) for s in samples if name in s["procs"]]
        base = next((u for at, u in seen if at >= warm), None)
        if base is None:
            continue
        last = seen[-1][1]
        row = {"samples": len(seen), "first_at_s": seen[0][0], "last_at_s": seen[-1][0]}
        for key in ("rss_mib", "tree_rss_mib"):
            row[f"{key}_at_warmup"], row[f"{key}_end"] = base[key], last[key]
            row[f"{key}_max"] = max(u[key] for _, u in seen)
            row[f"{key}_growth_pct"] = round(100 * (last[key] - base[key]) / base[key], 2) if base[key] else None
        for key in ("fds", "tree_fds"):
            row[f"{key}_at_warmup"], row[f"{key}_end"] = base[key], last[key]
            row[f"{key}_max"] = max(u[key] for _, u in seen)
        per[name] = row
    growth = [r["tree_rss_mib_growth_pct"] for r in per.values() if r["tree_rss_mib_growth_pct"] is not None]
    return {
        "warmup_s": warm,
        "processes": per,
        "max_rss_growth_pct": max(growth, default=None),
        "rss_growth_under_limit": bool(growth) and max(growth) < RSS_GROWTH_LIMIT_PCT,
        "rss_growth_limit_pct": RSS_GROWTH_LIMIT_PCT,
        "fds_flat": all(r["tree_fds_end"] <= r["tree_fds_at_warmup"] + 2 for r in per.values()),
        "sample_errors": sum(1 for s in samples if "_error" in s["procs"]),
    }
