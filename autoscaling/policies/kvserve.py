"""kvserve's SLO autoscaler: the fewest replicas that keep p90 TTFT and ITL within target.

With an engine profile (the normal case) the capacity model leads and latency is the
safety net:
  (b) Capacity model (`autoscaling.capacity`): the *predicted* request rate and mean
      uncached prompt / output lengths -> replicas needed. Arrival rate is visible at
      once (latency lags it), so the prediction is
        max(look-back rate, recent rate, ramp forecast)
      where the recent rate covers the last few seconds (a load step shows up within
      them) and counts only when it is more than the fleet can serve at all (modelled
      utilization 1: its queues then grow from the first second); below that, a few
      seconds of Poisson noise is no reason to add a replica, and the look-back rate
      decides. The ramp forecast is a least-squares line through the last minute of
      recent-rate samples (disjoint 5 s windows), read one replica start-up plus the
      upscale delay ahead; it counts only when its slope is significant against the
      samples' Poisson noise and the line fits them (a step or a burst does not: its
      residuals are far larger than that noise, and extrapolating it would over-provision).
      Samples taken while the routers' queue grows are left out (replicas then count
      what they admit, not what arrives), and the line needs half a minute of samples. The start-up
      time is measured from the replicas the policy asked for. Scale-down is planned on
      the look-back rate (the recent rate's noise would keep restarting the delay), does
      not act while the recent rate alone asks for more (a step's first seconds), and goes
      straight to the modelled demand once the wish has lasted `downscale_delay_s`.
      Requests held at the routers (every replica at `max_ongoing_requests`) never reach
      a replica's window, so there the replicas report their service rate, not the load:
      the routers' queue's growth over `QUEUE_GROWTH_S` is added to the recent rate, and
      the queue itself, to be drained within `look_back_s`, to the demand.
  (a) SLO error r = max(p90 TTFT / target, p90 ITL / target) over the fleet (per-replica
      p90s weighted by request rate). r > 1 vetoes every scale-down; it adds replicas
      (ceil(current * min(r, 4)), at least one more; min(r, 1.5) when the capacity model
      says the current fleet carries the predicted rate) only once the fleet has settled --
      nothing starting and `look_back_s` since the serving count last rose -- because a
      backlog queued on old replicas during a start-up does not move to new ones, and its
      latencies stay in the window for `look_back_s`. With a profile, r only adds replicas
      when the p90s' lower confidence bounds (the window's, one-sided 95%) are over the
      target too: a 30 s window's p90 a few percent over it is within sampling noise, and
      acting on it would also teach the overload memory a load the fleet can carry; such
      an r holds the fleet (vetoes scale-down). Below `MIN_P90_SAMPLES` requests
      in the window with nothing queued, r > 1 only holds (a fresh replica's first cold
      prompts are not an overload, and would teach the overload memory a bogus rate).
Without a profile, the SLO error alone drives it, as before:
        r > 1                       -> ceil(current * r)    (scale up in proportion)
        hysteresis <= r <= 1        -> current              (hold; veto scale-down)
        r < hysteresis              -> one replica fewer, provided that the load-scaled
                                       r * n/(n-1) would still be below hysteresis.
Then: an overload memory (the per-replica load that once broke the SLO: req/s planned at
`hysteresis` of it without a profile; with one, modelled busy time per second -- rate x
service time of the window's mean request, so the same rate of longer prompts is more
load -- at the load itself) vetoes scale-downs
that would recreate that overload -- this is what stops 1 -> 2 -> 1 -> 2 flapping on a
steady load when latency is steep in load (or when the profile is optimistic). It expires
after `overload_memory_s` (one real overload must not hold a replica for good); re-learnt
soon after an expiry, its lifetime doubles (up to `overload_memory_max_s`); min/max
bounds; at most `max_step` replicas per decision; upscale/downscale delays (a wish must
persist that long, as in Ray Serve).
No metrics at all -> hold (except from zero replicas with requests waiting: cold
start to one).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from autoscaling.base import Decision, ReplicaMetrics, ScalingInput, ScalingPolicy
from autoscaling.capacity import DEFAULT_MAX_BATCH, CapacityEstimate, per_replica_capacity, replicas_for
from autoscaling.delay import DelayGate, clamp, limit_step
from autoscaling.window import metrics_push_interval_s
from kvserve.policy_params import AutoscalerParams, SLOTargets
from kvserve.perf_model import EngineProfile

MIN_RATE_RPS = 1e-6  # below this a fleet is idle: too little traffic to learn an overload rate from
DEFAULT_STARTUP_S = 30.0  # replica start-up assumed until one has been measured
TREND_SAMPLE_S = 5.0  # one recent-rate sample per this (the replicas' recent window: disjoint samples)
TREND_FIT_S = 60.0  # the rising trend is a line fitted through this much of them
TREND_MIN_SAMPLES = 7  # half the fit window: a line through less is a burst read 40 s ahead
TREND_Z = 2.5  # standard errors: the slope's significance, and the line's fit
FLEET_RATIO_QUANTILE = 0.75  # with a profile: the fleet's SLO ratio is this rate-weighted quantile
MAX_SLO_FACTOR = 4.0  # an SLO-driven upscale at most quadruples the fleet per settle period: with 2,
# a burst that needs 3x took two settle periods (a missed minute on the Mooncake trace)
MAX_SLO_FACTOR_WITHIN_CAPACITY = 1.5  # ... and by half when the capacity model says the fleet carries
# the load: r then measures what the model does not see (long prompts queued behind each other on a
# few replicas), not a rate, and 4x over-provisioned for minutes (Mooncake trace seed 7: 4 -> 8)
MIN_P90_SAMPLES = 10  # requests in the look-back window before a p90 above target may add replicas
QUEUE_GROWTH_S = 10.0  # the router queue's growth over this span counts as arrivals no replica saw


@dataclass(frozen=True)
class FleetSignals:
    rate_rps: float  # arrivals/s summed over replicas (look-back window)
    recent_rate_rps: float  # arrivals/s over the replicas' last few seconds (look-back rate if not reported)
    recent_admitted_rps: float  # requests/s the replicas received over their last few seconds
    uncached_prompt_tokens: float  # rate-weighted mean prompt tokens not served from cache
    output_tokens: float  # rate-weighted mean output tokens
    ttft_p90_ms: float | None  # rate-weighted mean of replicas' p90s (None: no samples)
    itl_p90_ms: float | None
    waiting: int
    running: int


def _weighted(pairs: Sequence[tuple[float, float]]) -> float | None:
    """Weighted mean of (value, weight); equal weights when all weights are zero."""
    if not pairs:
        return None
    total = sum(w for _, w in pairs)
    if total <= 0:
        return sum(v for v, _ in pairs) / len(pairs)
    # Clamped to the values' range: rounding must not lift one replica's p90 of exactly the
    # target (v * w / w) above it, which would read as a violation.
    lo, hi = min(v for v, _ in pairs), max(v for v, _ in pairs)
    return min(max(sum(v * w for v, w in pairs) / total, lo), hi)


def fleet_signals(metrics: Sequence[ReplicaMetrics]) -> FleetSignals:
    rate = sum(max(m.requests_per_s, 0.0) for m in metrics)
    recent = sum(
        max(r if (r := getattr(m, "recent_requests_per_s", None)) is not None else m.requests_per_s, 0.0)
        for m in metrics
    )
    uncached = [(m.mean_prompt_tokens * (1.0 - min(max(m.cache_hit_rate, 0.0), 1.0)), m.requests_per_s) for m in metrics]
    output = [(m.mean_output_tokens, m.requests_per_s) for m in metrics]
    ttft = [(m.ttft_p90_ms, m.requests_per_s) for m in metrics if m.ttft_p90_ms is not None]
    itl = [(m.itl_p90_ms, m.requests_per_s) for m in metrics if m.itl_p90_ms is not None]
    admitted = sum(max(a if (a := getattr(m, "recent_admitted_per_s", None)) is not None else 0.0, 0.0) for m in metrics)
    return FleetSignals(
        rate_rps=rate,
        recent_rate_rps=recent,
        recent_admitted_rps=admitted,
        uncached_prompt_tokens=_weighted(uncached) or 0.0,
        output_tokens=_weighted(output) or 0.0,
        ttft_p90_ms=_weighted(ttft),  # type: ignore[arg-type]
        itl_p90_ms=_weighted(itl),  # type: ignore[arg-type]
        waiting=sum(m.waiting for m in metrics),
        running=sum(m.running for m in metrics),
    )


class SLOAutoscaler(ScalingPolicy):
    name: ClassVar[str] = "kvserve"

    @classmethod
    def create(cls, params: AutoscalerParams, slo: SLOTargets, profile: EngineProfile | None) -> ScalingPolicy:
        return cls(params, slo, profile)

    def __init__(
        self,
        cfg: AutoscalerParams,
        slo: SLOTargets,
        profile: EngineProfile | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> None:
        self.cfg, self.slo, self.profile, self.max_batch = cfg, slo, profile, max_batch
        self.gate = DelayGate(cfg.upscale_delay_s, cfg.downscale_delay_s)
        self.overload_per_replica: float | None = None  # `load()` per replica that broke the SLO
        self.memory_until: float | None = None  # when the overload memory expires
        self.memory_ttl_s = cfg.overload_memory_s  # its current lifetime (doubles on a premature expiry)
        self.memory_expired_at: float | None = None
        # (t, recent rate, whether it counts arrivals: the routers' queue not growing), >= TREND_SAMPLE_S apart
        self.recent_history: list[tuple[float, float, bool]] = []
        self.queue_history: list[tuple[float, float]] = []  # (t, requests queued at the routers)
        self.startup_s = DEFAULT_STARTUP_S
        self.pending_since: float | None = None  # when the fleet last had replicas starting
        self.last_running: int | None = None  # None: nothing observed yet (a fresh policy)
        self.running_rose_at: float | None = None
        self._shape_memo: dict[tuple[float, float], CapacityEstimate] = {}

    # -- the two demands ---------------------------------------------------------

    def slo_ratio(self, sig: FleetSignals) -> float | None:
        ratios = []
        if sig.ttft_p90_ms is not None:
            ratios.append(sig.ttft_p90_ms / self.slo.ttft_p90_ms)
        if sig.itl_p90_ms is not None:
            ratios.append(sig.itl_p90_ms / self.slo.itl_p90_ms)
        return max(ratios) if ratios else None

    def replica_slo_ratio(self, m: ReplicaMetrics, low: bool = False) -> float | None:
        """max(p90 / target) over TTFT and ITL; `low`: of the p90s' lower confidence bounds
        (the point p90s where a replica does not report bounds)."""
        ttft, itl = m.ttft_p90_ms, m.itl_p90_ms
        if low:
            ttft_low, itl_low = getattr(m, "ttft_p90_low_ms", None), getattr(m, "itl_p90_low_ms", None)
            ttft = ttft if ttft is None or ttft_low is None else ttft_low
            itl = itl if itl is None or itl_low is None else itl_low
        ratios = []
        if ttft is not None:
            ratios.append(ttft / self.slo.ttft_p90_ms)
        if itl is not None:
            ratios.append(itl / self.slo.itl_p90_ms)
        return max(ratios) if ratios else None

    def fleet_slo_ratio(self, metrics: Sequence[ReplicaMetrics], sig: FleetSignals, low: bool = False) -> float | None:
        """With a profile: the `FLEET_RATIO_QUANTILE` of per-replica ratios, weighted by each
        replica's recent rate. A backlog queued on one replica while others started (it gets
        few new requests, and more replicas cannot drain it) then does not read as a fleet-wide
        violation; an overload of most of the fleet does. Without a profile: the mean of p90s."""
        if self.profile is None:
            return self.slo_ratio(sig)
        pairs = []
        for m in metrics:
            r = self.replica_slo_ratio(m, low)
            if r is not None:
                w = getattr(m, "recent_requests_per_s", None)
                pairs.append((r, max(m.requests_per_s if w is None else w, 0.0)))
        if not pairs:
            return None
        total = sum(w for _, w in pairs)
        if total <= 0:
            pairs, total = [(r, 1.0) for r, _ in pairs], float(len(pairs))
        acc = 0.0
        for r, w in sorted(pairs):
            acc += w
            if acc >= FLEET_RATIO_QUANTILE * total - 1e-12:
                return r
        return max(r for r, _ in pairs)

    def slo_demand(self, sig: FleetSignals, inp: ScalingInput, r: float | None,
                   r_low: float | None = None, cap_n: int | None = None) -> tuple[int, str]:
        """`cap_n`: the capacity model's replicas for the predicted rate (None: not known)."""
        current = inp.target_replicas
        if r is None:
            if sig.rate_rps == 0 and sig.waiting == 0 and sig.running == 0:
                return 0, "idle"
            return current, "no latency samples yet: hold"
        if r > 1:
            if sig.rate_rps * self.cfg.look_back_s < MIN_P90_SAMPLES and sig.waiting == 0 \
                    and inp.queued_requests <= 0:
                # A p90 over a handful of requests is their maximum: one cold prompt on an idle
                # fleet, which more replicas would not make faster (nothing is queued).
                return current, f"slo r={r:.2f} from fewer than {MIN_P90_SAMPLES} requests, none queued: hold"
            if inp.running_replicas < current:
                # Replicas still starting: the latency they will remove is not measured yet.
                return current, f"slo r={r:.2f} but scale-up in progress"
            if self.profile is not None:
                if r_low is not None and r_low <= 1:
                    # Over the target, but within the sampling noise of the window's p90: no
                    # replica is added on it (the capacity model sizes the fleet), none removed.
                    return current, f"slo r={r:.2f} (lower bound {r_low:.2f}, not significant): hold"
                if not self.settled(inp.now):
                    return current, f"slo r={r:.2f}: fleet not settled since its last scale-up"
                why = f"slo r={r:.2f} > 1"
                factor = MAX_SLO_FACTOR
                if cap_n is not None and cap_n <= current and current > 0:
                    factor = MAX_SLO_FACTOR_WITHIN_CAPACITY
                    if r > factor:
                        why += f" (capacity model: {cap_n} suffice; x{factor:g} at most)"
                return max(current + 1, math.ceil(max(current, 1) * min(r, factor) - 1e-9)), why
            return max(current + 1, math.ceil(max(current, 1) * r - 1e-9)), f"slo r={r:.2f} > 1"
        if self.profile is not None:
            # The capacity model sizes the fleet; latency within target sets no floor.
            return 0, f"slo r={r:.2f} <= 1"
        if r >= self.cfg.hysteresis:
            return current, f"slo r={r:.2f} within hysteresis band"
        if current > 1 and r * current / (current - 1) < self.cfg.hysteresis:
            # With a capacity model it sizes the fleet; without one, shed one replica at a
            # time (latency is not linear in load, so larger steps would be guesses).
            return current - 1, f"slo r={r:.2f} comfortable"
        return current, f"slo r={r:.2f}: one replica fewer would not stay comfortable"

    def settled(self, now: float) -> bool:
        return self.running_rose_at is None or now - self.running_rose_at >= self.cfg.look_back_s

    def trend_fit(self, now: float) -> tuple[float, float] | None:
        """(fitted arrival rate at `now`, rising slope in req/s per s) of the recent-rate samples,
        or None unless the last `TREND_FIT_S` show a significant, linear rise.

        The samples are the replicas' recent (5 s) rates, one per `TREND_SAMPLE_S` (or per stats
        push, if that is slower): disjoint windows, so each is an independent Poisson estimate with variance ~ rate / 5 s, and a
        least-squares line through them has a known noise. The slope counts when it is
        `TREND_Z` standard errors above zero (a flat load's noise almost never is) and the line
        fits (residuals' chi-square within `TREND_Z` of its degrees of freedom): a step, or a
        burst, leaves residuals far larger than Poisson noise, and extrapolating one would
        over-provision."""
        pts = [(t, y) for t, y, ok in self.recent_history if ok and now - t <= TREND_FIT_S + 1e-9]
        n = len(pts)
        if n < TREND_MIN_SAMPLES:
            return None
        t_mean = sum(t for t, _ in pts) / n
        y_mean = sum(y for _, y in pts) / n
        sxx = sum((t - t_mean) ** 2 for t, _ in pts)
        if sxx <= 0:
            return None
        slope = sum((t - t_mean) * (y - y_mean) for t, y in pts) / sxx
        var = max(y_mean, 1.0) / TREND_SAMPLE_S  # Poisson variance of one sample's rate
        se = math.sqrt(var / sxx)
        if slope <= TREND_Z * se:
            return None
        chi2 = sum((y - y_mean - slope * (t - t_mean)) ** 2 for t, y in pts) / var
        dof = n - 2
        if chi2 > dof + TREND_Z * math.sqrt(2.0 * dof):
            return None
        return y_mean + slope * (now - t_mean), slope

    def predicted_rate(self, sig: FleetSignals, now: float, queued: float = 0.0, replicas: int | None = None,
                       ramp: float | None = None) -> float:
        """`replicas`: the recent rate counts only if it overloads that many (None: always).
        `ramp`: `ramp_rate(now, queued)` if the caller has it already."""
        return max(self.arrival_rate(sig, now, queued, replicas), self.ramp_rate(now, queued) if ramp is None else ramp)

    def ramp_rate(self, now: float, queued: float = 0.0) -> float:
        """On a rising ramp: the fitted rate one start-up (and upscale delay) ahead; 0 without a
        ramp. The line's own level at `now` is the base, as the look-back rate lags a ramp by
        half its window."""
        return self._ahead(self.trend_fit(now), queued)

    def _ahead(self, fit: tuple[float, float] | None, queued: float) -> float:
        if fit is None:
            return 0.0
        level, slope = fit
        return level + queued / self.cfg.look_back_s + slope * (self.startup_s + self.cfg.upscale_delay_s)

    def recent_overloads(self, sig: FleetSignals, replicas: int) -> bool:
        """Whether the recent rate is more than `replicas` can serve at all (modelled utilization
        1). Below that their queues stay bounded, and a few seconds' rate (~20 requests: a
        Poisson noise of +-20%) is no reason to add a replica: the look-back rate (6x the
        samples) decides. Above it, backlogs grow from the first second: act on it at once."""
        if self.profile is None or sig.rate_rps <= 0:
            return True
        return sig.recent_rate_rps > max(replicas, 0) * 1000.0 / self.shape_capacity(sig).service_ms

    def arrival_rate(self, sig: FleetSignals, now: float, queued: float, replicas: int | None = None) -> float:
        """Requests/s to plan for now: the larger of the look-back and the recent arrival rate
        (the recent one only if it overloads `replicas`), plus what the routers hold (every replica full). While their queue grows, arrivals are
        what the replicas took plus its growth; the queue itself is to be drained within
        `look_back_s`. Replicas that joined within `QUEUE_GROWTH_S` take the queue's flush as
        their first intake, while its growth still shows the smaller fleet: no growth term then."""
        rate = sig.rate_rps
        if replicas is None or self.recent_overloads(sig, replicas):
            rate = max(rate, sig.recent_rate_rps)
        if queued <= 0:
            return rate
        joined = self.running_rose_at is not None and now - self.running_rose_at < QUEUE_GROWTH_S
        growth = 0.0 if joined else self.queue_growth(now)
        saturated = sig.recent_admitted_rps + growth if growth > 0 else 0.0
        return max(rate, saturated) + queued / self.cfg.look_back_s

    def queue_growth(self, now: float) -> float:
        """Requests/s joining the routers' queue over the last `QUEUE_GROWTH_S` (0 if it did not
        grow). With every replica full, the replicas' windows count only what they admit (their
        service rate); arrivals = admitted + the queue's growth."""
        if not self.queue_history:
            return 0.0
        t_new, q_new = self.queue_history[-1]
        older = [(t, q) for t, q in self.queue_history if t <= t_new - QUEUE_GROWTH_S + 0.5]
        t_old, q_old = older[-1] if older else self.queue_history[0]
        return max(q_new - q_old, 0.0) / max(t_new - t_old, QUEUE_GROWTH_S)

    def _observe(self, inp: ScalingInput, sig: FleetSignals | None) -> None:
        """Start-up time of the replicas asked for, when the serving count rose, the rate history."""
        now = inp.now
        if inp.running_replicas < inp.target_replicas:
            if self.pending_since is None:
                self.pending_since = now
        elif self.pending_since is not None:
            self.startup_s = min(max(now - self.pending_since, 0.0), 600.0)
            self.pending_since = None
        if self.last_running is not None and inp.running_replicas > self.last_running:
            self.running_rose_at = now
        self.last_running = inp.running_replicas
        if sig is not None:
            # One sample per recent window, and never two of one stats report (pushed every
            # `metrics_push_interval_s`): the fit's noise model needs independent samples.
            spacing = max(TREND_SAMPLE_S, metrics_push_interval_s(self.cfg.look_back_s))
            if not self.recent_history or now - self.recent_history[-1][0] >= spacing - 1e-9:
                # While the routers' queue grows, replicas count only what they admit: such a
                # sample is their service rate, not the arrivals, and would bend the line.
                # (`queued_requests` is the look-back window's peak: it stays up for a window
                # after the queue drained, so "grew over the last sample" is the test, not > 0.)
                before = [q for t, q in self.queue_history if t <= now - TREND_SAMPLE_S + 0.5]
                growing = inp.queued_requests > 0 and (not before or inp.queued_requests > before[-1])
                self.recent_history.append((now, sig.recent_rate_rps, not growing))
            self.recent_history = [h for h in self.recent_history if now - h[0] <= TREND_FIT_S + 1e-9]
        if not self.queue_history or now - self.queue_history[-1][0] >= 1.0:
            self.queue_history.append((now, max(inp.queued_requests, 0.0)))
        else:
            self.queue_history[-1] = (self.queue_history[-1][0], max(inp.queued_requests, 0.0))
        self.queue_history = [(t, q) for (t, q) in self.queue_history if now - t <= QUEUE_GROWTH_S + 1.0]

    def shape_capacity(self, sig: FleetSignals) -> CapacityEstimate:
        """One replica's modelled capacity for the window's mean request (requires a profile).
        Memoized by shape: the rate varies tick to tick, the mean request much less."""
        key = (sig.uncached_prompt_tokens, sig.output_tokens)
        cap = self._shape_memo.get(key)
        if cap is None:
            cap = per_replica_capacity(self.profile, *key, self.slo.ttft_p90_ms, self.slo.itl_p90_ms,  # type: ignore[arg-type]
                                       self.cfg.headroom, self.max_batch)
            if len(self._shape_memo) >= 64:
                self._shape_memo.clear()
            self._shape_memo[key] = cap
        return cap

    def capacity_demand(self, sig: FleetSignals, rate_rps: float | None = None) -> int:
        rate = sig.rate_rps if rate_rps is None else rate_rps
        if self.profile is None or rate <= 0:
            return 0
        return replicas_for(self.shape_capacity(sig), rate).replicas

    def load(self, sig: FleetSignals) -> float:
        """What the overload memory measures. With a profile: the modelled busy time per second
        (rate x service time of the window's mean request), so a window of longer prompts at the
        same request rate is more load, and one of shorter prompts less; without: req/s."""
        if self.profile is None:
            return sig.rate_rps
        return sig.rate_rps * self.shape_capacity(sig).service_ms / 1000.0

    def memory_floor(self, sig: FleetSignals) -> int:
        load = self.load(sig)
        if not self.overload_per_replica or load <= 0:
            return 0
        # The ratio is capped: the floor only ever limits a scale-down to at most `current` anyway.
        if self.profile is not None:
            # The capacity model already plans each replica at `headroom`; planning the memory at
            # `hysteresis` as well compounded the two margins (0.8 x 0.6) and held a replica the
            # load never needed. The floor only forbids a per-replica load at the overload's or above.
            x = min(load / self.overload_per_replica, 1e6)
            return math.floor(x * (1 + 1e-9)) + 1  # (the epsilon: load / (load / n) can come out just below n)
        x = min(load / (self.overload_per_replica * self.cfg.hysteresis), 1e6)
        return math.ceil(x * (1 - 1e-12))

    def learn_overload(self, load_per_replica: float, now: float) -> None:
        """Remember an SLO-driven overload. Re-learned within its lifetime of an expiry, the
        expiry was premature (the load came back, and the fleet paid an overload for it): the
        lifetime doubles, up to `overload_memory_max_s`, so a recurring overload flaps about
        log2(max / base) times before the memory holds for that long."""
        if self.memory_expired_at is not None and now - self.memory_expired_at < self.memory_ttl_s:
            self.memory_ttl_s = min(2.0 * self.memory_ttl_s, self.cfg.overload_memory_max_s)
        self.overload_per_replica = load_per_replica
        self.memory_until = now + self.memory_ttl_s

    def expire_overload(self, now: float) -> None:
        """Forget the overload memory after its lifetime: one real overload (a burst of long
        prompts, a minute of peak traffic) must not hold an extra replica for good."""
        if self.overload_per_replica is not None and self.memory_until is not None and now >= self.memory_until:
            self.overload_per_replica, self.memory_until, self.memory_expired_at = None, None, now

    # -- decision ----------------------------------------------------------------

    def decide(self, inp: ScalingInput) -> Decision:
        cfg = self.cfg
        current = inp.target_replicas
        if inp.running_replicas == 0 and current == 0 and inp.total_ongoing > 0:
            # Scale from zero at once (Serve's cold-start path does the same live).
            return Decision(clamp(1, max(cfg.min_replicas, 1), cfg.max_replicas), "cold start")
        if not inp.metrics:
            self._observe(inp, None)
            return Decision(clamp(current, cfg.min_replicas, cfg.max_replicas), "no metrics: hold")
        sig = fleet_signals(inp.metrics)
        self._observe(inp, sig)
        self.expire_overload(inp.now)
        r = self.fleet_slo_ratio(inp.metrics, sig)
        queued = max(inp.queued_requests, 0.0)  # the window's peak: it lags a drain by `look_back_s`
        fit = self.trend_fit(inp.now)
        ramp = self._ahead(fit, queued)
        predicted = self.predicted_rate(sig, inp.now, queued, inp.target_replicas, ramp)
        cap_n = self.capacity_demand(sig, predicted)
        slo_n, slo_why = self.slo_demand(sig, inp, r, self.fleet_slo_ratio(inp.metrics, sig, low=True), cap_n)
        desired = max(slo_n, cap_n)
        recent_holds = False
        if desired <= current:
            # The downscale clock runs on the look-back rate: over a few seconds the recent
            # rate's Poisson noise crosses a replica boundary every minute or so, and each
            # crossing would restart the delay. But a shrink never *acts* while the recent rate
            # alone asks for more (the start of a load step, which the look-back rate lags).
            settled_rate = max(sig.rate_rps + queued / cfg.look_back_s, ramp)
            settled = max(slo_n, self.capacity_demand(sig, settled_rate))
            recent_holds = settled < max(slo_n, self.capacity_demand(sig, self.predicted_rate(sig, inp.now, queued, ramp=ramp)))
            desired = settled
        if desired < current:
            desired = max(desired, min(self.memory_floor(sig), current))
            if self.profile is not None and sig.waiting + queued > 0:
                # Queued requests are demand too: keep capacity to drain them within a window
                # (shrinking onto a backlogged replica would route new requests behind it).
                backlog = sig.rate_rps + (sig.waiting + queued) / self.cfg.look_back_s
                desired = max(desired, min(self.capacity_demand(sig, backlog), current))
        # Learn: a comfortable fleet at a higher per-replica load than the remembered overload
        # proves the memory stale (e.g. the profile was pessimistic), so raise it.
        if self.overload_per_replica and r is not None and r < cfg.hysteresis and current > 0 \
                and sig.rate_rps > MIN_RATE_RPS:
            self.overload_per_replica = max(self.overload_per_replica, self.load(sig) / current)
        desired = clamp(limit_step(clamp(desired, cfg.min_replicas, cfg.max_replicas), current, cfg.max_step),
                        cfg.min_replicas, cfg.max_replicas)
        # Requests held at the routers mean every replica is full: no shrink acts while any are
        # (with a short downscale delay, a queue that hit the routers' cap read as falling demand
        # while new replicas started, and one of them was cancelled).
        queue_holds = queued > 0 and desired < current
        out = clamp(self.gate.apply(desired, current, inp.now, hold_down=recent_holds or queue_holds),
                    cfg.min_replicas, cfg.max_replicas)
        if out > current and slo_n >= cap_n and slo_n > current and sig.rate_rps > MIN_RATE_RPS and current > 0:
            self.learn_overload(self.load(sig) / current, inp.now)
        at_routers = f" ({queued:.0f} queued at the routers)" if queued > 0 else ""
        on_ramp = f" (ramp forecast: {60.0 * fit[1]:+.1f} req/s per min)" if fit and ramp >= predicted - 1e-9 else ""
        reason = f"{slo_why}; predicted {predicted:.1f} req/s{on_ramp}{at_routers} -> capacity={cap_n}; desired={desired}"
        if recent_holds and desired < current:
            reason += " (held: the recent rate needs more)"
        elif queue_holds:
            reason += " (held: requests wait at the routers)"
        return Decision(out, reason if out != current or desired == current else reason + " (delayed)")

    def get_state(self) -> dict[str, Any]:
        return {
            "gate": self.gate.get_state(),
            "overload_per_replica": self.overload_per_replica,
            "memory_until": self.memory_until,
            "memory_ttl_s": self.memory_ttl_s,
            "memory_expired_at": self.memory_expired_at,
            "recent_history": [[t, w, ok] for t, w, ok in self.recent_history],
            "queue_history": [[t, q] for t, q in self.queue_history],
            "startup_s": self.startup_s,
            "pending_since": self.pending_since,
            "last_running": self.last_running,
            "running_rose_at": self.running_rose_at,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self.gate.set_state(state.get("gate", {}))
        v = state.get("overload_per_replica")
        self.overload_per_replica = None if v is None else float(v)
        u, e = state.get("memory_until"), state.get("memory_expired_at")
        self.memory_until = None if u is None else float(u)
        self.memory_expired_at = None if e is None else float(e)
        self.memory_ttl_s = float(state.get("memory_ttl_s", self.cfg.overload_memory_s))
        self.recent_history = [(float(t), float(w), bool(ok)) for t, w, ok in state.get("recent_history", [])]
        self.queue_history = [(float(t), float(q)) for t, q in state.get("queue_history", [])]
        self.startup_s = float(state.get("startup_s", DEFAULT_STARTUP_S))
        p, r = state.get("pending_since"), state.get("running_rose_at")
        self.pending_since = None if p is None else float(p)
        self.running_rose_at = None if r is None else float(r)
        lr = state.get("last_running")
        self.last_running = None if lr is None else int(lr)
