"""Per-second timeline of a run (offered load, TTFT p90, replica count) for the live scaling run."""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass
from typing import Awaitable, Callable, Sequence

from bench.client import RequestResult
from bench.metrics import percentile
from bench.server_stats import Snapshot


@dataclass
class StatsSample:
    t: float  # perf_counter time
    replicas: int
    waiting: int
    running: int
    kv_usage_mean: float


class StatsSampler:
    """Polls the server's stats once per `interval_s` while a run is in flight."""

    def __init__(self, fetch: Callable[[], Awaitable[Snapshot]], interval_s: float = 1.0) -> None:
        self.fetch, self.interval_s = fetch, interval_s
        self.samples: list[StatsSample] = []
        self._stop = asyncio.Event()

    async def run(self) -> None:
        while not self._stop.is_set():
            try:
                snap = await asyncio.wait_for(self.fetch(), timeout=max(self.interval_s, 1.0))
                n = len(snap)
                self.samples.append(
                    StatsSample(
                        t=time.perf_counter(),
                        replicas=n,
                        waiting=sum(c.waiting for c in snap.values()),
                        running=sum(c.running for c in snap.values()),
                        kv_usage_mean=sum(c.kv_usage for c in snap.values()) / n if n else 0.0,
                    )
                )
            except Exception:  # noqa: BLE001 - a missed sample is a gap in the plot, not a failed run
                pass
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=self.interval_s)
            except TimeoutError:
                pass

    def stop(self) -> None:
        self._stop.set()


@dataclass
class TimelineRow:
    second: int
    sent: int
    completed: int
    errors: int
    inflight: int
    ttft_p90_ms: float | None
    replicas: int | None
    waiting: int | None
    running: int | None


def build_timeline(results: Sequence[RequestResult], samples: Sequence[StatsSample], t0: float) -> list[TimelineRow]:
    """Bucket a run into 1-second rows starting at perf_counter time t0."""
    ends = [r.done_at or r.start for r in results] + [s.t for s in samples]
    if not ends:
        return []
    horizon = int(max(ends) - t0) + 1
    rows: list[TimelineRow] = []
    for k in range(horizon):
        lo, hi = t0 + k, t0 + k + 1

        def within(t: float | None) -> bool:
            return t is not None and lo <= t < hi

        ttfts = [r.ttft_s * 1000.0 for r in results if r.ok and within(r.first_token_at)]  # type: ignore[operator]
        last = [s for s in samples if lo <= s.t < hi]
        snap = last[-1] if last else None
        rows.append(
            TimelineRow(
                second=k,
                sent=sum(within(r.start) for r in results),
                completed=sum(r.ok and within(r.end_at) for r in results),
                errors=sum((not r.ok) and within(r.done_at) for r in results),
                inflight=sum(r.start < hi and (r.done_at is None or r.done_at >= hi) for r in results),
                ttft_p90_ms=percentile(ttfts, 90),
                replicas=snap.replicas if snap else None,
                waiting=snap.waiting if snap else None,
                running=snap.running if snap else None,
            )
        )
    return rows


def timeline_json(rows: Sequence[TimelineRow], policy: str) -> dict:
    return {"policy": policy, "interval_s": 1.0, "rows": [asdict(r) for r in rows]}
