"""The contract every autoscaling policy implements, live (Ray Serve) and in the simulator."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from kvserve.perf_model import EngineProfile
from kvserve.policy_params import AutoscalerParams, SLOTargets


@dataclass(frozen=True)
class ReplicaMetrics:
    """Rolling metrics one replica reports (record_autoscaling_stats / the simulator)."""

    replica_id: str
    ttft_p90_ms: float | None = None  # None: no request finished prefill in the window
    itl_p90_ms: float | None = None
    waiting: int = 0  # engine queue depth
    running: int = 0
    kv_usage: float = 0.0
    requests_per_s: float = 0.0  # arrivals in the window
    prompt_tokens_per_s: float = 0.0
    output_tokens_per_s: float = 0.0
    mean_prompt_tokens: float = 0.0
    mean_output_tokens: float = 0.0
    cache_hit_rate: float = 0.0
    # Arrivals over the last few seconds (None: not reported): sees a load step before the
    # look-back rate, which lags it by half the window.
    recent_requests_per_s: float | None = None
    # Requests the replica received over those seconds, however long they waited at the router:
    # with every replica full, the fleet's service rate.
    recent_admitted_per_s: float | None = None
    # One-sided 95% lower confidence bounds of the p90s (None: not reported): a p90 just over the
    # target from a few dozen requests is within its sampling noise; these say whether it is for sure.
    ttft_p90_low_ms: float | None = None
    itl_p90_low_ms: float | None = None


@dataclass(frozen=True)
class ScalingInput:
    now: float
    target_replicas: int  # replicas running or starting (the target Serve is working towards)
    running_replicas: int  # replicas serving now
    metrics: Sequence[ReplicaMetrics]  # may be empty: the policy must then hold
    total_ongoing: float = 0.0  # ongoing requests across the deployment (Serve's own signal)
    # Requests waiting at the routers because every replica had `max_ongoing_requests`
    # (Serve's `total_queued_requests`: the look-back window's peak, as the adapter sets
    # `aggregation_function: max`). The replicas' arrival rates never saw them: at
    # saturation they count what the replicas admit.
    queued_requests: float = 0.0
    # The latency targets to plan for now (None: the policy's configured ones). The adapter may
    # pass the tightest target among the tenant classes that have traffic.
    slo: SLOTargets | None = None


@dataclass(frozen=True)
class Decision:
    replicas: int
    reason: str
    holds: tuple[str, ...] = ()  # names of the guards that held a scale-down at this decision


class ScalingPolicy(ABC):
    """Desired replica count from metrics. Pure; state lives on the instance and round-trips
    through `get_state`/`set_state` (Serve keeps it in the policy_state dict between calls)."""

    name: ClassVar[str]

    @classmethod
    def create(cls, params: AutoscalerParams, slo: SLOTargets, profile: EngineProfile | None) -> ScalingPolicy:
        """The registry's constructor (autoscaling.registry.make_autoscaler); a policy takes what it needs."""
        return cls(params)  # type: ignore[call-arg]

    @abstractmethod
    def decide(self, inp: ScalingInput) -> Decision: ...

    def get_state(self) -> dict[str, Any]:
        return {}

    def set_state(self, state: dict[str, Any]) -> None:
        return None
