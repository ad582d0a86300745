"""Rolling window of serving signals a replica keeps for the autoscaler.

The replica deployment calls the `on_*` hooks from its request path and
returns `to_stats_dict()` from Ray Serve's `record_autoscaling_stats()`;
the controller side turns that dict back into `ReplicaMetrics` with
`metrics_from_stats()`. Pure Python, no Ray: the simulator uses it too.

Memory is bounded: latency samples live in fixed-size ring buffers (the
newest `max_samples` inside the look-back window), counters in at most
`num_buckets` time buckets. Each record is O(1) amortized; a percentile
query sorts at most `max_samples` values.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from autoscaling.base import ReplicaMetrics

# Keys of the dict `record_autoscaling_stats()` returns. Serve accepts only
# int/float values (no None), so "no sample" is encoded as NO_DATA.
STAT_PREFIX = "kvserve_"
NO_DATA = -1.0
STAT_KEYS: tuple[str, ...] = (
    "kvserve_ttft_p90_ms",  # NO_DATA when no request reached its first token in the window
    "kvserve_itl_p90_ms",  # NO_DATA when no inter-token gap in the window
    "kvserve_ttft_p90_low_ms",  # a lower confidence bound of the TTFT p90 (`P90_LOW_Z`)
    "kvserve_itl_p90_low_ms",
    "kvserve_ttft_samples",
    "kvserve_itl_samples",
    "kvserve_waiting",
    "kvserve_running",
    "kvserve_kv_usage",
    "kvserve_requests_per_s",
    "kvserve_recent_requests_per_s",  # arrivals over the last `recent_s` only: sees a load step at once
    "kvserve_recent_admitted_per_s",  # requests received over the last `recent_s`, whenever they arrived
    "kvserve_prompt_tokens_per_s",
    "kvserve_output_tokens_per_s",
    "kvserve_mean_prompt_tokens",
    "kvserve_mean_output_tokens",
    "kvserve_cache_hit_rate",
)


# What a replica's window reports is exactly the declared `ReplicaMetrics` (the name stays for callers).
WindowMetrics = ReplicaMetrics


RECENT_S = 5.0  # the recent rate's span: a load step shows within it; ~20 requests at GPU rates

# One-sided 95%: the p90's lower bound is exceeded by the true p90 with this confidence.
P90_LOW_Z = 1.645


def quantile_lower_bound(values: Iterable[float], q: float, z: float = P90_LOW_Z) -> float | None:
    """A distribution-free lower confidence bound of the q-quantile (q in (0, 1)): the order
    statistic of rank n q - z sqrt(n q (1 - q)) (the number of samples below the true quantile
    is Binomial(n, q); normal approximation). At least the smallest sample."""
    ordered = sorted(values)
    if not ordered:
        return None
    n = len(ordered)
    rank = math.floor(n * q - z * math.sqrt(n * q * (1.0 - q)))
    return ordered[min(max(rank, 1), n) - 1]


def percentile_nearest_rank(values: Iterable[float], q: float) -> float | None:
    """Nearest-rank percentile (q in (0, 100]): the smallest sample with at least q% of samples <= it."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


class _TimedRing:
    """(timestamp, value, count) runs, newest last: the newest `max_samples` samples, trimmed by
    age on read. One engine step's gap, shared by the batch's tokens, is one run, so recording
    and reading cost per step, not per token."""

    def __init__(self, max_samples: int) -> None:
        self.maxlen = max_samples
        self._items: deque[list] = deque()  # [t, value, count]
        self._total = 0

    def add(self, now: float, value: float, count: int = 1) -> None:
        count = min(count, self.maxlen)
        if count <= 0:
            return
        self._items.append([now, value, count])
        self._total += count
        while self._total > self.maxlen:  # drop the oldest samples, a run in part if need be
            drop = min(self._items[0][2], self._total - self.maxlen)
            self._items[0][2] -= drop
            self._total -= drop
            if self._items[0][2] == 0:
                self._items.popleft()

    def _trim(self, cutoff: float) -> None:
        while self._items and self._items[0][0] < cutoff:
            self._total -= self._items.popleft()[2]

    def runs_since(self, cutoff: float) -> list[tuple[float, int]]:
        """(value, count) of the samples at or after `cutoff`, sorted by value."""
        self._trim(cutoff)
        merged: dict[float, int] = {}
        for _, v, n in self._items:
            merged[v] = merged.get(v, 0) + n
        return sorted(merged.items())

    def values_since(self, cutoff: float) -> list[float]:
        self._trim(cutoff)
        return [v for _, v, n in self._items for _ in range(n)]


def _rank(runs: list[tuple[float, int]], rank: int) -> float:
    """The `rank`-th smallest sample (1-based) of sorted (value, count) runs."""
    acc = 0
    for v, n in runs:
        acc += n
        if acc >= rank:
            return v
    return runs[-1][0]


def p90_of_runs(runs: list[tuple[float, int]]) -> tuple[float | None, float | None, int]:
    """(nearest-rank p90, its lower confidence bound, sample count) of sorted (value, count) runs;
    the same numbers `percentile_nearest_rank` and `quantile_lower_bound` give on the samples."""
    n = sum(c for _, c in runs)
    if n == 0:
        return None, None, 0
    p90 = _rank(runs, max(1, math.ceil(90 / 100.0 * n)))
    low = _rank(runs, min(max(math.floor(n * 0.9 - P90_LOW_Z * math.sqrt(n * 0.9 * 0.1)), 1), n))
    return p90, low, n


@dataclass
class _Bucket:
    start: float
    arrivals: int = 0  # by when the request arrived at the router
    admitted: int = 0  # by when this replica received it
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completions: int = 0
    output_tokens: int = 0


class SignalWindow:
    """Per-replica rolling TTFT/ITL percentiles, rates and means over the last `look_back_s`."""

    def __init__(
        self,
        look_back_s: float = 30.0,
        max_samples: int = 4096,
        num_buckets: int = 30,
        clock: Callable[[], float] = time.monotonic,
        recent_s: float = RECENT_S,
    ) -> None:
        if look_back_s <= 0 or max_samples < 1 or num_buckets < 1 or recent_s <= 0:
            raise ValueError("look_back_s > 0, recent_s > 0, max_samples >= 1 and num_buckets >= 1 are required")
        self.look_back_s = look_back_s
        self.recent_s = min(recent_s, look_back_s)
        self._clock = clock
        self._bucket_s = look_back_s / num_buckets
        self._ttft = _TimedRing(max_samples)
        self._itl = _TimedRing(max_samples)
        self._buckets: deque[_Bucket] = deque()
        self._started = clock()
        # Engine gauges are instantaneous: the latest value wins.
        self.waiting = 0
        self.running = 0
        self.kv_usage = 0.0
        self._engine_hit_rate: float | None = None
        self._ttft_n = self._itl_n = 0  # sample counts behind the last `metrics()`

    # -- recording (request path) ------------------------------------------------

    def _now(self, now: float | None) -> float:
        return self._clock() if now is None else now

    def _bucket(self, now: float) -> _Bucket:
        start = math.floor(now / self._bucket_s) * self._bucket_s
        if not self._buckets or self._buckets[-1].start < start:
            self._buckets.append(_Bucket(start))
        # Out-of-order timestamps (rare) land in the newest bucket rather than reordering.
        return self._buckets[-1]

    def _bucket_at(self, t: float) -> _Bucket:
        """The bucket holding an earlier time `t` (kept in order; made if it had no events)."""
        start = math.floor(t / self._bucket_s) * self._bucket_s
        if not self._buckets or self._buckets[-1].start <= start:
            return self._bucket(t)
        i = len(self._buckets) - 1
        while i >= 0 and self._buckets[i].start > start:
            i -= 1
        if i >= 0 and self._buckets[i].start == start:
            return self._buckets[i]
        self._buckets.insert(i + 1, _Bucket(start))
        return self._buckets[i + 1]

    def on_arrival(
        self, prompt_tokens: int, cached_tokens: int = 0, now: float | None = None, waited_s: float = 0.0
    ) -> None:
        """`waited_s`: how long the request waited at the router for room on a replica. It is
        counted when it arrived there, so a queue flushed onto a new replica reads as the load
        it was, not as a burst of arrivals. An arrival from before this window (or before this
        replica started: its rates divide by its age) is not counted as one: the autoscaler saw
        it as the routers' queue growing."""
        t = self._now(now)
        self._bucket(t).admitted += 1
        arrived = t - max(waited_s, 0.0)
        if arrived < max(t - self.look_back_s, self._started):
            return
        b = self._bucket(t) if arrived >= t else self._bucket_at(arrived)
        b.arrivals += 1
        b.prompt_tokens += max(prompt_tokens, 0)
        b.cached_tokens += min(max(cached_tokens, 0), max(prompt_tokens, 0))

    def on_first_token(self, ttft_ms: float, now: float | None = None) -> None:
        self._ttft.add(self._now(now), float(ttft_ms))

    def on_token_gap(self, itl_ms: float, now: float | None = None, count: int = 1) -> None:
        """`count` tokens that each waited `itl_ms` (one engine step serving several sequences)."""
        self._itl.add(self._now(now), float(itl_ms), count)

    def on_completion(self, output_tokens: int, now: float | None = None) -> None:
        b = self._bucket(self._now(now))
        b.completions += 1
        b.output_tokens += max(output_tokens, 0)

    def set_engine_state(
        self, waiting: int, running: int, kv_usage: float, cache_hit_rate: float | None = None
    ) -> None:
        """Latest engine gauges; `cache_hit_rate` overrides the window's own cached/prompt ratio."""
        self.waiting, self.running, self.kv_usage = int(waiting), int(running), float(kv_usage)
        self._engine_hit_rate = cache_hit_rate

    # -- queries -----------------------------------------------------------------

    def _cutoff(self, now: float) -> float:
        return now - self.look_back_s

    def ttft_samples(self, now: float | None = None) -> list[float]:
        return self._ttft.values_since(self._cutoff(self._now(now)))

    def itl_samples(self, now: float | None = None) -> list[float]:
        return self._itl.values_since(self._cutoff(self._now(now)))

    def ttft_p90_ms(self, now: float | None = None) -> float | None:
        return percentile_nearest_rank(self.ttft_samples(now), 90)

    def itl_p90_ms(self, now: float | None = None) -> float | None:
        return percentile_nearest_rank(self.itl_samples(now), 90)

    def _live_buckets(self, now: float) -> list[_Bucket]:
        # A bucket counts while any part of it is inside the window; the span below matches.
        cutoff = self._cutoff(now)
        while self._buckets and self._buckets[0].start + self._bucket_s <= cutoff:
            self._buckets.popleft()
        return list(self._buckets)

    def _span_s(self, now: float) -> float:
        # A young replica divides by its age, not the full window, so its rates are not diluted.
        return max(min(self.look_back_s, now - self._started), self._bucket_s, 1e-9)

    def _recent_rate(self, now: float, buckets: list[_Bucket], admitted: bool = False) -> float:
        # The last n buckets, the newest one partial: the span runs from the oldest one's start.
        n = max(1, round(self.recent_s / self._bucket_s))
        first = (math.floor(now / self._bucket_s) - n + 1) * self._bucket_s
        count = sum(b.admitted if admitted else b.arrivals for b in buckets if b.start >= first - 1e-9)
        span = max(min(now - first, now - self._started), self._bucket_s, 1e-9)
        return count / span

    def metrics(self, replica_id: str, now: float | None = None) -> WindowMetrics:
        t = self._now(now)
        buckets = self._live_buckets(t)
        span = self._span_s(t)
        arrivals = sum(b.arrivals for b in buckets)
        prompt = sum(b.prompt_tokens for b in buckets)
        cached = sum(b.cached_tokens for b in buckets)
        done = sum(b.completions for b in buckets)
        output = sum(b.output_tokens for b in buckets)
        hit_rate = self._engine_hit_rate if self._engine_hit_rate is not None else (cached / prompt if prompt else 0.0)
        ttft, ttft_low, self._ttft_n = p90_of_runs(self._ttft.runs_since(self._cutoff(t)))
        itl, itl_low, self._itl_n = p90_of_runs(self._itl.runs_since(self._cutoff(t)))
        return WindowMetrics(
            replica_id=replica_id,
            ttft_p90_ms=ttft,
            itl_p90_ms=itl,
            waiting=self.waiting,
            running=self.running,
            kv_usage=self.kv_usage,
            requests_per_s=arrivals / span,
            prompt_tokens_per_s=prompt / span,
            output_tokens_per_s=output / span,
            mean_prompt_tokens=prompt / arrivals if arrivals else 0.0,
            mean_output_tokens=output / done if done else 0.0,
            cache_hit_rate=hit_rate,
            recent_requests_per_s=self._recent_rate(t, buckets),
            recent_admitted_per_s=self._recent_rate(t, buckets, admitted=True),
            ttft_p90_low_ms=ttft_low,
            itl_p90_low_ms=itl_low,
        )

    def to_stats_dict(self, now: float | None = None) -> dict[str, float]:
        """What `record_autoscaling_stats()` returns: plain floats, keys `STAT_KEYS`."""
        t = self._now(now)
        m = self.metrics("", t)
        return {
            "kvserve_ttft_p90_ms": NO_DATA if m.ttft_p90_ms is None else float(m.ttft_p90_ms),
            "kvserve_itl_p90_ms": NO_DATA if m.itl_p90_ms is None else float(m.itl_p90_ms),
            "kvserve_ttft_p90_low_ms": NO_DATA if m.ttft_p90_low_ms is None else float(m.ttft_p90_low_ms),
            "kvserve_itl_p90_low_ms": NO_DATA if m.itl_p90_low_ms is None else float(m.itl_p90_low_ms),
            "kvserve_ttft_samples": float(self._ttft_n),
            "kvserve_itl_samples": float(self._itl_n),
            "kvserve_waiting": float(m.waiting),
            "kvserve_running": float(m.running),
            "kvserve_kv_usage": float(m.kv_usage),
            "kvserve_requests_per_s": float(m.requests_per_s),
            "kvserve_recent_requests_per_s": float(m.recent_requests_per_s or 0.0),
            "kvserve_recent_admitted_per_s": float(m.recent_admitted_per_s or 0.0),
            "kvserve_prompt_tokens_per_s": float(m.prompt_tokens_per_s),
            "kvserve_output_tokens_per_s": float(m.output_tokens_per_s),
            "kvserve_mean_prompt_tokens": float(m.mean_prompt_tokens),
            "kvserve_mean_output_tokens": float(m.mean_output_tokens),
            "kvserve_cache_hit_rate": float(m.cache_hit_rate),
        }


def metrics_push_interval_s(look_back_s: float) -> float:
    """How often replicas push their stats to Serve's controller: several times per look-back
    window (Serve's default, 10 s, would leave a 30 s window with three points)."""
    return max(0.5, min(10.0, look_back_s / 6.0))


def metrics_from_stats(replica_id: str, stats: Mapping[str, float]) -> WindowMetrics:
    """Inverse of `SignalWindow.to_stats_dict` (missing keys read as no data / zero)."""

    def latency(key: str) -> float | None:
        v = stats.get(key)
        return None if v is None or v < 0 else float(v)

    def num(key: str) -> float:
        v = stats.get(key)
        return 0.0 if v is None or v < 0 else float(v)

    return WindowMetrics(
        replica_id=replica_id,
        ttft_p90_ms=latency("kvserve_ttft_p90_ms"),
        itl_p90_ms=latency("kvserve_itl_p90_ms"),
        waiting=int(round(num("kvserve_waiting"))),
        running=int(round(num("kvserve_running"))),
        kv_usage=num("kvserve_kv_usage"),
        requests_per_s=num("kvserve_requests_per_s"),
        prompt_tokens_per_s=num("kvserve_prompt_tokens_per_s"),
        output_tokens_per_s=num("kvserve_output_tokens_per_s"),
        mean_prompt_tokens=num("kvserve_mean_prompt_tokens"),
        mean_output_tokens=num("kvserve_mean_output_tokens"),
        cache_hit_rate=num("kvserve_cache_hit_rate"),
        # An older replica build does not send it: None, and the policy uses the look-back rate.
        recent_requests_per_s=latency("kvserve_recent_requests_per_s"),
        recent_admitted_per_s=latency("kvserve_recent_admitted_per_s"),
        ttft_p90_low_ms=latency("kvserve_ttft_p90_low_ms"),
        itl_p90_low_ms=latency("kvserve_itl_p90_low_ms"),
    )
