"""Stage 2 of the kvserve policy: demand, in replicas, from the arrival rate and the engine profile.

`CapacityModel` is the queueing model of one replica (`autoscaling.capacity`): prefill time of
the mean request's uncached tokens plus its decode steps at the batch the ITL target allows (at
the whole prompt's context: a cache hit saves prefill, not KV or decode reads),
planned to a TTFT-bounded utilization. `Arrivals` says what rate to plan for:
  max(look-back rate, recent rate if it overloads the fleet, ramp forecast) + the routers' queue.
The recent rate (last few seconds) sees a step at once, but a few seconds of Poisson noise is no
reason to add a replica: it counts only when it is more than the fleet can serve at all. The ramp
forecast is a least-squares line through the last `trend_fit_s` of recent-rate samples (one per
`SAMPLE_S`: disjoint, so independent Poisson estimates), read one start-up plus the upscale delay
ahead; it counts only when the slope is `trend_z` standard errors above zero, the line fits (a step
or a burst leaves residuals far above Poisson noise) and no step fits clearly better (at a few
requests/s a step's samples can fit a line within the noise: a two-level fit tells it apart).
Samples taken while the routers' queue grows are left out: replicas then count what they admit, not
what arrives; while the newest is left out there is no forecast (a line through older samples would
be read across the gap). Requests held at the routers reach no replica's window: their queue's
growth counts as arrivals, the queue itself as work to drain within `look_back_s`.
"""

from __future__ import annotations

import math
from typing import Any

from autoscaling.capacity import CapacityEstimate, per_replica_capacity, replicas_for
from autoscaling.signals import FleetSignals
from autoscaling.window import RECENT_S, metrics_push_interval_s
from kvserve.perf_model import EngineProfile
from kvserve.policy_params import AutoscalerParams, SLOTargets

SAMPLE_S = RECENT_S  # one trend sample per replicas' recent window keeps the samples disjoint


def _shape(x: float) -> float:
    """The mean request's token counts to 3 significant digits (<= 0.5% off), so its capacity can be
    memoized; rounding is monotone, so a longer request still never gets more capacity."""
    return float(f"{max(x, 0.0):.3g}")


class CapacityModel:
    """One replica's modelled capacity for the window's mean request, from the engine profile."""

    def __init__(self, profile: EngineProfile, cfg: AutoscalerParams, max_batch: int) -> None:
        self.profile, self.cfg, self.max_batch = profile, cfg, max_batch
        self._memo: dict[tuple[float, float, float, float, float], CapacityEstimate] = {}

    def use(self, profile: EngineProfile) -> None:
        """Plan with `profile` from now on (an online fit rebuilt it)."""
        if profile is not self.profile:
            self.profile, self._memo = profile, {}

    def per_replica(self, sig: FleetSignals, slo: SLOTargets) -> CapacityEstimate:
        uncached = _shape(sig.uncached_prompt_tokens)
        key = (uncached, _shape(sig.output_tokens), _shape(max(sig.prompt_tokens - uncached, 0.0)), slo.ttft_p90_ms,
               slo.itl_p90_ms)
        cap = self._memo.get(key)
        if cap is None:
            if len(self._memo) >= 256:
                self._memo.clear()
            cap = self._memo[key] = per_replica_capacity(self.profile, key[0], key[1], slo.ttft_p90_ms, slo.itl_p90_ms,
                                                         self.cfg.headroom, self.max_batch, cached_tokens=key[2])
        return cap

    def replicas(self, sig: FleetSignals, slo: SLOTargets, rate_rps: float) -> int:
        return replicas_for(self.per_replica(sig, slo), rate_rps).replicas if rate_rps > 0 else 0

    def busy(self, sig: FleetSignals, slo: SLOTargets, rate_rps: float | None = None) -> float:
        """Modelled replica-busy seconds per second: the same rate of longer requests is more load."""
        rate = sig.rate_rps if rate_rps is None else rate_rps
        return rate * self.per_replica(sig, slo).service_ms / 1000.0


def _step_sse(pts: list[tuple[float, float]]) -> float:
    """Squared residuals of the best two-level fit (one level before a change point, one after)."""
    ys = [y for _, y in pts]
    best = math.inf
    for k in range(1, len(ys)):
        a, b = ys[:k], ys[k:]
        ma, mb = sum(a) / len(a), sum(b) / len(b)
        best = min(best, sum((y - ma) ** 2 for y in a) + sum((y - mb) ** 2 for y in b))
    return best


class Arrivals:
    """The fleet's history the forecast needs: recent-rate samples, the routers' queue, start-up
    time of the replicas asked for, and when the serving count last rose. Plain-data state."""

    def __init__(self, cfg: AutoscalerParams) -> None:
        self.cfg = cfg
        self.samples: list[tuple[float, float, bool]] = []  # (t, recent rate, counts: queue not growing)
        self.queue: list[tuple[float, float]] = []  # (t, requests queued at the routers), ~1 s apart
        self.startup_s = cfg.startup_estimate_s
        self.pending_since: float | None = None  # when replicas asked for started to be pending
        self.last_running: int | None = None
        self.running_rose_at: float | None = None

    def observe(self, now: float, target: int, running: int, queued: float, sig: FleetSignals | None) -> None:
        if running < target:
            self.pending_since = now if self.pending_since is None else self.pending_since
        elif self.pending_since is not None:
            self.startup_s, self.pending_since = min(max(now - self.pending_since, 0.0), 600.0), None
        if self.last_running is not None and running > self.last_running:
            self.running_rose_at = now
        self.last_running = running
        if sig is not None:
            # One sample per recent window and never two of one stats push: independent samples.
            spacing = max(SAMPLE_S, metrics_push_interval_s(self.cfg.look_back_s))
            if not self.samples or now - self.samples[-1][0] >= spacing - 1e-9:
                # `queued` is the look-back window's peak: "grew since the last sample" is the test.
                before = [q for t, q in self.queue if t <= now - SAMPLE_S + 0.5]
                growing = queued > 0 and (not before or queued > before[-1])
                self.samples.append((now, sig.recent_rate_rps, not growing))
            self.samples = [s for s in self.samples if now - s[0] <= self.cfg.trend_fit_s + 1e-9]
        if not self.queue or now - self.queue[-1][0] >= 1.0:
            self.queue.append((now, max(queued, 0.0)))
        else:
            self.queue[-1] = (self.queue[-1][0], max(queued, 0.0))
        self.queue = [(t, q) for t, q in self.queue if now - t <= self.cfg.queue_growth_s + 1.0]

    def settled(self, now: float) -> bool:
        """The latency window no longer holds the time before the last scale-up took effect."""
        return self.running_rose_at is None or now - self.running_rose_at >= self.cfg.look_back_s

    def trend_fit(self, now: float) -> tuple[float, float] | None:
        """(fitted rate at `now`, slope) of a significant, linear rise over the fit window; else None."""
        if not self.samples or not self.samples[-1][2]:
            return None  # the newest sample left out: a line through older ones would extrapolate over the gap
        pts = [(t, y) for t, y, ok in self.samples if ok and now - t <= self.cfg.trend_fit_s + 1e-9]
        n = len(pts)
        if n < math.ceil((self.cfg.trend_fit_s / SAMPLE_S + 1) / 2):  # half the window's samples: a burst is no ramp
            return None
        t_mean, y_mean = sum(t for t, _ in pts) / n, sum(y for _, y in pts) / n
        sxx = sum((t - t_mean) ** 2 for t, _ in pts)
        if sxx <= 0:
            return None
        slope = sum((t - t_mean) * (y - y_mean) for t, y in pts) / sxx
        var = max(y_mean, 1.0) / SAMPLE_S  # Poisson variance of one sample's rate
        z = self.cfg.trend_z
        if slope <= z * math.sqrt(var / sxx):
            return None
        sse = sum((y - y_mean - slope * (t - t_mean)) ** 2 for t, y in pts)
        if sse / var > n - 2 + z * math.sqrt(2.0 * (n - 2)) or (sse - _step_sse(pts)) / var > z * z:
            return None  # no line, or a step fits the samples clearly better (z standard errors of likelihood)
        return y_mean + slope * (now - t_mean), slope

    def ramp_rate(self, fit: tuple[float, float] | None, queued: float) -> float:
        """The fitted rate one start-up plus the upscale delay ahead (0 without a ramp)."""
        if fit is None:
            return 0.0
        return fit[0] + queued / self.cfg.look_back_s + fit[1] * (self.startup_s + self.cfg.upscale_delay_s)

    def queue_growth(self) -> float:
        """Requests/s joining the routers' queue over the last `queue_growth_s` (0 if it did not grow)."""
        if not self.queue:
            return 0.0
        span = self.cfg.queue_growth_s
        t_new, q_new = self.queue[-1]
        older = [(t, q) for t, q in self.queue if t <= t_new - span + 0.5]
        t_old, q_old = older[-1] if older else self.queue[0]
        return max(q_new - q_old, 0.0) / max(t_new - t_old, span)

    def rate(self, sig: FleetSignals, now: float, queued: float, use_recent: bool) -> float:
        """Requests/s arriving now: look-back (or recent) rate; while the routers' queue grows, what
        the replicas admit plus its growth -- unless replicas joined within `queue_growth_s` (they
        take the queue's flush, while its growth still shows the smaller fleet); plus the queue's drain."""
        rate = max(sig.rate_rps, sig.recent_rate_rps) if use_recent else sig.rate_rps
        if queued <= 0:
            return rate
        joined = self.running_rose_at is not None and now - self.running_rose_at < self.cfg.queue_growth_s
        growth = 0.0 if joined else self.queue_growth()
        saturated = sig.recent_admitted_rps + growth if growth > 0 else 0.0
        return max(rate, saturated) + queued / self.cfg.look_back_s

    def get_state(self) -> dict[str, Any]:
        return {"samples": [list(s) for s in self.samples], "queue": [list(q) for q in self.queue],
                "startup_s": self.startup_s, "pending_since": self.pending_since,
                "last_running": self.last_running, "running_rose_at": self.running_rose_at}

    def set_state(self, st: dict[str, Any]) -> None:
        self.samples = [(float(t), float(y), bool(ok)) for t, y, ok in st.get("samples", [])]
        self.queue = [(float(t), float(q)) for t, q in st.get("queue", [])]
        self.startup_s = float(st.get("startup_s", self.cfg.startup_estimate_s))
        self.pending_since = _opt(st.get("pending_since"))
        self.running_rose_at = _opt(st.get("running_rose_at"))
        lr = st.get("last_running")
        self.last_running = None if lr is None else int(lr)


def _opt(v: Any) -> float | None:
    return None if v is None else float(v)
