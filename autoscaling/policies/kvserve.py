"""kvserve's SLO autoscaler: the fewest replicas that keep p90 TTFT and ITL within target.

One pipeline, read top to bottom in `decide`:
  1. signals   (`autoscaling.signals`)  the fleet's declared signals from the replicas' reports;
  2. demand    (`autoscaling.demand`)   the rate to plan for (look-back, recent, ramp, routers'
               queue) through the engine profile's queueing model of one replica -> replicas;
  3. feedback  (`autoscaling.feedback`) the SLO error adds what the model misses, when it is evidence;
  4. guards    (`autoscaling.guards`)   named holds on a scale-down, each with its logged reason;
  5. the delay gate (`autoscaling.delay`) a wish acts once it has lasted its direction's delay.
The engine profile is always present: a measured one (the embedded model ships its own; `kvserve
profile` measures others), or for an unmeasured model a conservative estimate fitted online from
the replicas' own reports (`autoscaling.profile_fit`). The latency targets are an input of each
decision (`ScalingInput.slo`), defaulting to the configured ones.
"""

from __future__ import annotations

from typing import Any, ClassVar

from autoscaling import guards
from autoscaling.base import Decision, ScalingInput, ScalingPolicy
from autoscaling.capacity import DEFAULT_MAX_BATCH
from autoscaling.delay import DelayGate, clamp, limit_step
from autoscaling.demand import Arrivals, CapacityModel
from autoscaling.feedback import OverloadMemory, slo_correction
from autoscaling.profile_fit import OnlineProfile
from autoscaling.signals import FleetSignals, fleet_signals, fleet_slo_ratio
from kvserve.perf_model import EngineProfile
from kvserve.policy_params import AutoscalerParams, SLOTargets

IDLE_RPS = 1e-6  # below this a fleet is idle: too little traffic to learn an overload from


class SLOAutoscaler(ScalingPolicy):
    name: ClassVar[str] = "kvserve"

    @classmethod
    def create(cls, params: AutoscalerParams, slo: SLOTargets, profile: EngineProfile | None) -> ScalingPolicy:
        return cls(params, slo, profile)

    def __init__(self, cfg: AutoscalerParams, slo: SLOTargets, profile: EngineProfile | None = None,
                 max_batch: int = DEFAULT_MAX_BATCH) -> None:
        """`profile` None: the model was never measured; start conservative and fit online."""
        self.cfg, self.slo = cfg, slo
        self.fit = OnlineProfile(cfg.unprofiled_scale) if profile is None else None
        self.model = CapacityModel(profile or self.fit.profile, cfg, max_batch)  # type: ignore[union-attr]
        self.arrivals = Arrivals(cfg)
        self.memory = OverloadMemory(cfg)
        self.gate = DelayGate(cfg.upscale_delay_s, cfg.downscale_delay_s)
        self.overload: tuple[int, float, int] | None = None  # recent-rate test: (fleet size, sum, readings)

    @property
    def max_batch(self) -> int:
        return self.model.max_batch

    @max_batch.setter
    def max_batch(self, n: int) -> None:  # the engine's max_num_seqs (autoscaling.registry sets it)
        self.model.max_batch, self.model._memo = n, {}

    def decide(self, inp: ScalingInput) -> Decision:
        cfg, current, now = self.cfg, inp.target_replicas, inp.now
        slo = inp.slo or self.slo
        queued = max(inp.queued_requests, 0.0)  # the window's peak: it lags a drain by `look_back_s`
        if inp.running_replicas == 0 and current == 0 and inp.total_ongoing > 0:
            return Decision(clamp(1, max(cfg.min_replicas, 1), cfg.max_replicas), "cold start")
        if not inp.metrics:
            self.arrivals.observe(now, current, inp.running_replicas, queued, None)
            return Decision(clamp(current, cfg.min_replicas, cfg.max_replicas), "no metrics: hold")

        # 1. signals
        sig = fleet_signals(inp.metrics)
        self.arrivals.observe(now, current, inp.running_replicas, queued, sig)
        if self.fit is not None:
            self.model.use(self.fit.observe(inp.metrics))
        self.memory.expire(now)

        # 2. demand: the rate to plan for, through the model of one replica
        fit = self.arrivals.trend_fit(now)
        ramp = self.arrivals.ramp_rate(fit, queued)
        predicted = max(self.arrivals.rate(sig, now, queued, self.recent_overloads(sig, slo, current, now)), ramp)
        model_n = self.model.replicas(sig, slo, predicted)

        # 3. SLO feedback
        r = fleet_slo_ratio(inp.metrics, slo, cfg.fleet_ratio_quantile)
        corr = slo_correction(
            cfg, r, fleet_slo_ratio(inp.metrics, slo, cfg.fleet_ratio_quantile, low=True), current,
            inp.running_replicas, sig.rate_rps * cfg.look_back_s, sig.waiting > 0 or queued > 0,
            self.arrivals.settled(now), model_n,
            idle=sig.rate_rps == 0 and sig.waiting == 0 and sig.running == 0)
        desired = max(corr.replicas, model_n)

        # 4. guards on a scale-down
        holds: list[guards.Hold] = []
        if desired <= current:
            # Planned on the look-back rate; the recent rate may only hold it (a guard below).
            settled_n = max(corr.replicas, self.model.replicas(sig, slo, max(sig.rate_rps + queued / cfg.look_back_s, ramp)))
            recent_n = max(corr.replicas, self.model.replicas(sig, slo, max(self.arrivals.rate(sig, now, queued, True), ramp)))
            desired = settled_n
            holds += [guards.recent_rate(settled_n, recent_n, current), guards.slo_unproven(corr.hold, corr.why)]
        if desired < current:
            backlog = sig.rate_rps + (sig.waiting + queued) / cfg.look_back_s
            holds += [guards.overload_memory(current, self.memory.floor(self.model.busy(sig, slo))),
                      guards.engine_backlog(current, sig.waiting, queued, self.model.replicas(sig, slo, backlog))]
        holds = [h for h in holds if h is not None]
        planned = desired
        desired = max([desired] + [h.floor for h in holds if not h.keeps_clock])
        if r is not None and r < cfg.hysteresis and current > 0 and sig.rate_rps > IDLE_RPS:
            self.memory.raise_to(self.model.busy(sig, slo) / current)
        desired = clamp(limit_step(clamp(desired, cfg.min_replicas, cfg.max_replicas), current, cfg.max_step),
                        cfg.min_replicas, cfg.max_replicas)
        if desired < current and (q := guards.routers_queue(queued)) is not None:
            holds.append(q)
        clock_holds = [h for h in holds if h.keeps_clock and desired < current]

        # 5. the delay gate
        out = clamp(self.gate.apply(desired, current, now, hold_down=bool(clock_holds)), cfg.min_replicas,
                    cfg.max_replicas)
        if out > current and corr.replicas >= model_n and corr.replicas > current and sig.rate_rps > IDLE_RPS \
                and current > 0:
            self.memory.learn(self.model.busy(sig, slo) / current, now)
        held = [h for h in holds if (h.floor > planned and not h.keeps_clock) or h in clock_holds]
        return Decision(out, self._reason(corr.why, predicted, fit, ramp, queued, model_n, desired, holds, clock_holds,
                                          out != current or desired == current), tuple(h.guard for h in held))

    def recent_overloads(self, sig: FleetSignals, slo: SLOTargets, replicas: int, now: float) -> bool:
        """Whether the recent rate is more than `replicas` can serve within the TTFT target (the modelled
        utilization cap, without headroom). A few seconds' Poisson noise is no reason to add a replica:
        one reading over the bar starts a test, and the recent rate counts while the mean of the
        readings since stays over it. A step to just over the fleet's capacity passes it through the
        noisy readings under the bar (each of which made the wish "none" and restarted the upscale
        delay); a spike that ends fails it within a reading or two."""
        if sig.rate_rps <= 0:
            return True
        bar = max(replicas, 0) * self.model.per_replica(sig, slo).max_rps
        if self.overload is None or self.overload[0] != replicas:
            if sig.recent_rate_rps <= bar:
                return False
            self.overload = (replicas, 0.0, 0)
        n, total, count = self.overload
        total, count = total + sig.recent_rate_rps, count + 1
        self.overload = (n, total, count) if total / count > bar else None
        return self.overload is not None

    @staticmethod
    def _reason(why: str, predicted: float, fit: tuple[float, float] | None, ramp: float, queued: float, model_n: int,
                desired: int, holds: list[guards.Hold], clock_holds: list[guards.Hold], acted: bool) -> str:
        on_ramp = f" (ramp forecast: {60.0 * fit[1]:+.1f} req/s per min)" if fit and ramp >= predicted - 1e-9 else ""
        at_routers = f" ({queued:.0f} queued at the routers)" if queued > 0 else ""
        reason = f"{why}; predicted {predicted:.1f} req/s{on_ramp}{at_routers} -> capacity={model_n}; desired={desired}"
        for h in holds:
            if not h.keeps_clock and h.floor >= desired:
                reason += f" ({h.reason})"
        if clock_holds:
            reason += f" ({clock_holds[0].reason})"
        return reason if acted else reason + " (delayed)"

    # -- state: plain data, so Serve's policy_state carries it between calls and restarts ------------

    def get_state(self) -> dict[str, Any]:
        st = {"gate": self.gate.get_state(), **self.memory.get_state(), "arrivals": self.arrivals.get_state(),
              "overload": None if self.overload is None else list(self.overload)}
        if self.fit is not None:
            st["fit"] = self.fit.get_state()
        return st

    def set_state(self, state: dict[str, Any]) -> None:
        self.gate.set_state(state.get("gate", {}))
        self.memory.set_state(state)
        self.arrivals.set_state(state.get("arrivals", {}))
        ov = state.get("overload")
        self.overload = None if ov is None else (int(ov[0]), float(ov[1]), int(ov[2]))
        if self.fit is not None and "fit" in state:
            self.fit.set_state(state["fit"])
            self.model.use(self.fit.profile)
