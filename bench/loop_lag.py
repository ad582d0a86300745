"""How late the load generator's own event loop runs.

On a machine the cluster under test saturates (this project's 2-core CI kind), the bench
process can wait seconds for a CPU. Every latency it measures then includes that wait,
and an httpx connect timeout can fire although the kernel had completed the handshake at
once: the timer and the connect's completion both wait for the loop. Measured, not
guessed: a task sleeps `interval_s` at a time and records how much later it woke.
"""

from __future__ import annotations

import asyncio
import time

from bench.metrics import percentile

STARVED_MS = 1000.0  # a report warns when the loop ever ran this late


class LoopLag:
    def __init__(self, interval_s: float = 0.1) -> None:
        self.interval_s = interval_s
        self.lags_ms: list[float] = []
        self._stop = asyncio.Event()

    async def run(self) -> None:
        while not self._stop.is_set():
            t = time.perf_counter()
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=self.interval_s)
            except TimeoutError:
                self.lags_ms.append(max((time.perf_counter() - t - self.interval_s) * 1000.0, 0.0))

    def stop(self) -> None:
        self._stop.set()

    def summary(self) -> tuple[float | None, float | None]:
        """(p99, max) in ms; None before any sample."""
        if not self.lags_ms:
            return None, None
        return percentile(self.lags_ms, 99), max(self.lags_ms)
