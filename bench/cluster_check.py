"""The bench measures the cluster it claims, or nothing.

Before each measurement: wait until `/ready` (every replica Serve wants is serving), then check
that the replicas answering stats are exactly as many as asked for. A cluster with fewer (still
starting, crashed, a resize that did not take) is refused, not measured.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

import httpx

from bench.server_stats import fetch_stats


class ClusterMismatch(RuntimeError):
    """The cluster is not the one the run claims to measure."""


async def wait_ready(client: httpx.AsyncClient, base_url: str, headers: dict | None, timeout_s: float,
                     on_wait: Callable[[str], None] | None = None, poll_s: float = 1.0) -> dict:
    """Polls `/ready` until it answers 200; returns its body. Raises ClusterMismatch at the deadline."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        try:
            r = await client.get(f"{base_url}/ready", headers=headers, timeout=10.0)
            if r.status_code == 200:
                return r.json()
            last = r.text
        except httpx.HTTPError as e:
            last = repr(e)
        if on_wait:
            on_wait(last)
        if time.monotonic() > deadline:
            raise ClusterMismatch(f"the cluster at {base_url} was not ready after {timeout_s:.0f} s ({last})")
        await asyncio.sleep(poll_s)


async def serving_replicas(client: httpx.AsyncClient, base_url: str, headers: dict | None, expected: int | None,
                           settle_s: float = 30.0, poll_s: float = 0.5, cache_epoch: str | None = None) -> list[str]:
    """The ids of the replicas answering stats, once they are `expected` many (and, with
    `cache_epoch`, once every one has emptied its prefix cache for that epoch).

    A replica that Serve just marked RUNNING reports its first stats within a few stats periods,
    so the count may lag `/ready` briefly: wait up to `settle_s` for it. `expected` None (an
    autoscaled cluster, whose size is the autoscaler's): take whatever serves."""
    deadline = time.monotonic() + settle_s
    while True:
        snap = await fetch_stats(client, base_url, headers)
        ids = sorted(snap)
        stale = [i for i in ids if cache_epoch is not None and snap[i].cache_epoch != cache_epoch]
        if (expected is None or len(ids) == expected) and not stale:
            return ids
        if time.monotonic() > deadline:
            if stale:
                raise ClusterMismatch(f"replica(s) {', '.join(stale)} did not empty their prefix caches; "
                                      "refusing to measure a policy on another policy's caches")
            raise ClusterMismatch(
                f"asked for {expected} replica(s) but {len(ids)} serve ({', '.join(ids) or 'none'}); "
                "refusing to measure a different cluster than the one claimed")
        await asyncio.sleep(poll_s)


async def verify(base_url: str, headers: dict | None, expected: int | None, ready_timeout_s: float,
                 settle_s: float = 30.0, on_wait: Callable[[str], None] | None = None,
                 cache_epoch: str | None = None) -> list[str]:
    async with httpx.AsyncClient() as client:
        await wait_ready(client, base_url, headers, ready_timeout_s, on_wait)
        return await serving_replicas(client, base_url, headers, expected, settle_s, cache_epoch=cache_epoch)
