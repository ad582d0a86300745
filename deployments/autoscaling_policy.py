"""Ray Serve side of the autoscaler: runs a pure autoscaling policy (autoscaling.registry) in Serve.

Ray 2.60 accepts a custom policy as `autoscaling_config["policy"] =
{"policy_function": "module:attr", "policy_kwargs": {...}}`. When `attr` is a
class, the controller instantiates it once with `policy_kwargs` (JSON values)
and calls `instance(ctx: AutoscalingContext) -> (replicas, policy_state)` on
every control-loop tick. Serve then wraps the result with its own scaling
factors, delays and min/max bounds; we set Serve's delays to 0 so that the pure
policy's delays are the only ones, identical live and in the simulator.

Per-replica signals arrive as the dicts replicas return from
`record_autoscaling_stats()` (`autoscaling.window.SignalWindow.to_stats_dict`),
exposed on the context as `raw_metrics[key][ReplicaID] -> [TimeStampedValue]`.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ray.serve.config import AutoscalingContext

from autoscaling.base import ReplicaMetrics, ScalingInput
from autoscaling.registry import make_autoscaler
from autoscaling.window import STAT_PREFIX, metrics_from_stats, metrics_push_interval_s
import kvserve.profiles
from kvserve.config import DEFAULT_MODEL, AutoscalingConfig, KVServeConfig, SLOConfig
from deployments.tier_stats import tier_targets
from kvserve.perf_model import EngineProfile
from kvserve.policy_registry import KVSERVE_AUTOSCALING_POLICY

POLICY_IMPORT_PATH = KVSERVE_AUTOSCALING_POLICY  # this module's SLOAutoscalingPolicy
PROFILE_KEYS = ("block_size", "kv_cache_tokens", "prefill", "prefill_ms_per_cached_token", "decode")
# The embedded model ships its measured profile; any other model without `autoscaling.profile` is
# planned from a conservative estimate fitted online (autoscaling.profile_fit).
EMBEDDED_PROFILE = Path(kvserve.profiles.__file__).resolve().parent / "cpu-smollm2-135m.json"
STATE_KEY = "kvserve"  # our sub-dict of Serve's policy_state (Serve keeps its own "__decision_*" keys)
logger = logging.getLogger("ray.serve")


def _latest(series: Any) -> float | None:
    """Newest value of a Serve TimeSeries (list of TimeStampedValue), or a plain number."""
    if isinstance(series, (int, float)):
        return float(series)
    if not series:
        return None
    newest = max(series, key=lambda p: p.timestamp)
    return float(newest.value)


def replica_stats_from_context(ctx: AutoscalingContext) -> dict[str, dict[str, float]]:
    """replica unique_id -> its latest kvserve stats dict.

    The replica's own window already spans `look_back_s`, so the newest report is used
    (Serve's aggregated view averages reports over the window, which would mix the
    NO_DATA sentinel into percentiles). Falls back to the aggregated view."""
    out: dict[str, dict[str, float]] = {}
    raw = ctx.raw_metrics or {}
    agg = ctx.aggregated_metrics or {}
    for source, pick in ((raw, _latest), (agg, _latest)):
        for key, per_replica in source.items():
            if not key.startswith(STAT_PREFIX):
                continue
            for rid, series in per_replica.items():
                uid = getattr(rid, "unique_id", str(rid))
                value = pick(series)
                if value is not None:
                    out.setdefault(uid, {}).setdefault(key, value)
    running = {getattr(r, "unique_id", str(r)) for r in ctx.running_replicas}
    return {uid: stats for uid, stats in out.items() if uid in running}


def scaling_input_from_context(ctx: AutoscalingContext) -> ScalingInput:
    stats = replica_stats_from_context(ctx)
    metrics: list[ReplicaMetrics] = [metrics_from_stats(uid, s) for uid, s in sorted(stats.items())]
    total = ctx.total_num_requests
    queued = ctx.total_queued_requests
    return ScalingInput(
        now=ctx.current_time if ctx.current_time is not None else time.time(),
        target_replicas=int(ctx.target_num_replicas),
        running_replicas=int(ctx.current_num_replicas),
        metrics=metrics,
        total_ongoing=float(total) if total is not None and math.isfinite(total) else 0.0,
        queued_requests=float(queued) if queued is not None and math.isfinite(queued) else 0.0,
    )


class SLOAutoscalingPolicy:
    """The custom policy Serve calls. Built once per deployment config from `policy_kwargs`;
    the pure policy's state travels in `policy_state[STATE_KEY]`, so a restarted controller
    (or a re-instantiated policy) resumes where it left off."""

    def __init__(
        self,
        autoscaling: Mapping[str, Any] | None = None,
        slo: Mapping[str, Any] | None = None,
        policy: str = "kvserve",
        profile: Mapping[str, Any] | None = None,
        max_batch: int | None = None,
    ) -> None:
        self.cfg = AutoscalingConfig.model_validate(dict(autoscaling or {}))
        self.slo = SLOConfig.model_validate(dict(slo or {}))
        engine_profile = EngineProfile.from_dict(dict(profile), source="policy_kwargs") if profile else None
        self._make = lambda targets: make_autoscaler(policy, self.cfg.params(), targets, engine_profile, max_batch)
        self.targets = self.slo.params()
        self.policy = self._make(self.targets)
        self.last_reason = ""
        self.last_holds: tuple[str, ...] = ()

    def __call__(self, ctx: AutoscalingContext) -> tuple[int, dict[str, Any]]:
        # Per-tenant SLO tiers: plan for the tightest tier with traffic (the replicas report which).
        targets = tier_targets(self.slo.params(), replica_stats_from_context(ctx).values())
        if targets != self.targets:
            logger.info("kvserve autoscaler: planning for SLO targets %s (tenant tiers with traffic)", targets)
            self.targets, self.policy = targets, self._make(targets)
        self.policy.set_state(dict((ctx.policy_state or {}).get(STATE_KEY, {})))
        inp = scaling_input_from_context(ctx)
        decision = self.policy.decide(inp)
        self.last_reason = decision.reason
        if decision.replicas != inp.target_replicas:
            # Serve logs that it scaled; operators also need to know why.
            logger.info("kvserve autoscaler (%s): %d -> %d replicas: %s",
                        self.policy.name, inp.target_replicas, decision.replicas, decision.reason)
        elif decision.holds and decision.holds != self.last_holds:
            # ... and why it did not: once when a guard starts holding a scale-down, not every tick.
            logger.info("kvserve autoscaler (%s): holding %d replicas (%s): %s", self.policy.name,
                        inp.target_replicas, ", ".join(decision.holds), decision.reason)
        self.last_holds = decision.holds
        return decision.replicas, {STATE_KEY: self.policy.get_state()}


def _profile_dict(profile: Mapping[str, Any] | str | Path | None) -> dict[str, Any] | None:
    # Read on the driver: the controller may run on a node without the file.
    if profile is None:
        return None
    data = dict(profile) if isinstance(profile, Mapping) else json.loads(Path(profile).read_text())
    # Only what EngineProfile reads: policy_kwargs are logged and hashed by Serve.
    return {k: data[k] for k in PROFILE_KEYS if k in data}


def autoscaling_config_for(
    cfg: KVServeConfig, profile: Mapping[str, Any] | str | Path | None = None
) -> dict[str, Any]:
    """The replica deployment's `autoscaling_config` (a plain dict Serve validates).

    `profile`: the engine profile (JSON dict or path) for the capacity model; defaults to
    `autoscaling.profile`, then to the embedded model's packaged profile; for another model without
    one the policy fits a conservative estimate online. It is read here, on the driver, and travels
    inside policy_kwargs. `policy: serve_default` uses Serve's own built-in policy with our delays."""
    a = cfg.autoscaling
    if profile is None:
        profile = a.profile or (EMBEDDED_PROFILE if cfg.model.source == DEFAULT_MODEL else None)
    out: dict[str, Any] = {
        "min_replicas": a.min_replicas,
        "max_replicas": a.max_replicas,
        "look_back_period_s": a.look_back_s,
        "target_ongoing_requests": a.target_ongoing_requests,
    }
    if a.initial_replicas is not None:
        out["initial_replicas"] = a.initial_replicas
    if a.policy == "serve_default":
        out.update(upscale_delay_s=a.upscale_delay_s, downscale_delay_s=a.downscale_delay_s)
        return out
    # Delays live in the pure policy (same code as in the simulator); Serve's are turned off.
    out.update(upscale_delay_s=0.0, downscale_delay_s=0.0)
    # `total_queued_requests` as the look-back window's peak, not its mean: the policy reads the
    # routers' queue's growth as arrivals the full replicas never saw, and a mean lags a step.
    out["aggregation_function"] = "max"
    out["policy"] = {
        "policy_function": POLICY_IMPORT_PATH,
        "policy_kwargs": {
            "autoscaling": a.model_dump(mode="json"),
            "slo": cfg.slo.model_dump(mode="json"),
            "policy": a.policy,
            "profile": _profile_dict(profile),
            "max_batch": cfg.engine.max_num_seqs,  # the capacity model plans no larger decode batch
        },
    }
    return out


def drain_options_for(cfg: KVServeConfig) -> dict[str, float]:
    """Deployment options that make scale-down drain in-flight requests within `drain_grace_s`.

    A STOPPING replica is first dropped from the running set Serve broadcasts to every
    router/handle (so it gets no new requests); the replica then polls its ongoing-request
    count every `graceful_shutdown_wait_loop_s` and exits when it reaches zero; the
    controller force-kills it after `graceful_shutdown_timeout_s`."""
    grace = cfg.autoscaling.drain_grace_s
    return {
        "graceful_shutdown_timeout_s": grace,
        "graceful_shutdown_wait_loop_s": min(1.0, grace),
    }


def metrics_push_env_vars(cfg: KVServeConfig) -> dict[str, str]:
    """Env vars (for the replicas' runtime_env / the cluster) so signals reach the controller
    several times per look-back window; Serve's default push interval is 10 s."""
    interval = metrics_push_interval_s(cfg.autoscaling.look_back_s)
    return {
        "RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": f"{interval:g}",
        "RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S": f"{interval:g}",
    }
