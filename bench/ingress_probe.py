"""How late the ingress answers: GET /health round trips while a run is under way.

/health does nothing but return from the ingress's event loop, so its round trip is the
time a request waits for that loop (plus the proxy hop and this client's own loop). A
batch worker that blocked the loop (a SQLite commit, a long JSON parse) shows up here as
a tail, before it shows up in every interactive request's TTFT.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from bench.metrics import percentile


class IngressProbe:
    def __init__(self, url: str, headers: dict, interval_s: float = 0.2) -> None:
        self.url, self.headers, self.interval_s = url.rstrip("/") + "/health", headers, interval_s
        self.rtts_ms: list[float] = []
        self._stop = asyncio.Event()

    async def run(self) -> None:
        async with httpx.AsyncClient() as client:
            while not self._stop.is_set():
                t = time.perf_counter()
                try:
                    await client.get(self.url, headers=self.headers, timeout=30)
                    self.rtts_ms.append((time.perf_counter() - t) * 1000.0)
                except httpx.HTTPError:
                    pass  # a failed probe is the run's error to report, not this one's
                try:
                    await asyncio.wait_for(self._stop.wait(), self.interval_s)
                except asyncio.TimeoutError:
                    pass

    def stop(self) -> None:
        self._stop.set()

    def summary(self) -> dict:
        if not self.rtts_ms:
            return {"health_rtt_p50_ms": None, "health_rtt_p99_ms": None, "health_rtt_max_ms": None}
        return {"health_rtt_p50_ms": percentile(self.rtts_ms, 50), "health_rtt_p99_ms": percentile(self.rtts_ms, 99),
                "health_rtt_max_ms": max(self.rtts_ms)}


async def probed(url: str, headers: dict, coro) -> tuple:
    """(coro's result, the probe's summary) with the probe running while coro runs."""
    probe = IngressProbe(url, headers)
    task = asyncio.create_task(probe.run())
    try:
        return await coro, probe.summary()
    finally:
        probe.stop()
        await task
