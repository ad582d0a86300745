"""The policy cores' own parameters: small frozen dataclasses, each default defined here once.

The pure cores (`router/`, `autoscaling/`) take these, never the app's pydantic config;
`kvserve.config` takes its defaults from them and builds them (`RouterConfig.params()`,
`AutoscalingConfig.params()`, `SLOConfig.params()`). Why each value: the matching config
field's description.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CostParams:
    """The router's cost model (router/cost.py). Slopes: this repo's CPU profile
    (kvserve/profiles/cpu-smollm2-135m.json); weights: picked in `kvserve sim` (docs/ROUTING.md)."""

    prefill_ms_per_token: float = 1.87
    decode_ms_per_seq: float = 2.15
    cache_miss_weight: float = 3.0
    kv_pressure_start: float = 0.9
    kv_pressure_weight: float = 1.0
    active_token_weight: float = 0.25


@dataclass(frozen=True)
class RouterParams:
    """The kvserve router's decision rules (router/policies/kvserve.py) around its cost model."""

    cost: CostParams = field(default_factory=CostParams)
    tie_tolerance: float = 0.1
    home_affinity: float = 1.0
    spill_ttft_ms: float | None = None  # None: no spill bound (the config fills in its TTFT SLO)
    speculative_ttl_s: float = 10.0
    footprint_weight: float = 4.0
    footprint_window_s: float = 300.0
    footprint_headroom: float = 0.95
    stale_after_s: float = 10.0
    sample_replicas: int | None = 16  # None: score every replica


@dataclass(frozen=True)
class SLOTargets:
    ttft_p90_ms: float = 2000.0
    itl_p90_ms: float = 200.0


@dataclass(frozen=True)
class AutoscalerParams:
    """What the autoscaling policies (autoscaling/policies/) read."""

    min_replicas: int = 1
    max_replicas: int = 2
    target_ongoing_requests: float = 8.0
    upscale_delay_s: float = 10.0
    downscale_delay_s: float = 30.0
    max_step: int = 4
    headroom: float = 0.8
    hysteresis: float = 0.6
    look_back_s: float = 30.0
    overload_memory_s: float = 300.0
    overload_memory_max_s: float = 86400.0
    fleet_ratio_quantile: float = 0.75
    max_slo_factor: float = 4.0
    max_slo_factor_within_capacity: float = 1.5
    min_p90_samples: int = 10
    trend_fit_s: float = 60.0
    trend_z: float = 2.5
    queue_growth_s: float = 10.0
    startup_estimate_s: float = 30.0
    unprofiled_scale: float = 4.0


COST = CostParams()
ROUTER = RouterParams()
@dataclass(frozen=True)
class FlowParams:
    """The ingress's flow control (flow/fair_queue.py)."""

    max_per_tenant: int = 64  # queued requests per tenant; beyond: rejected (503)
    max_total: int = 512  # queued requests in all; beyond: the longest tenant queue loses its newest
    starvation_limit: int = 8  # dispatches a waiting lower level may be passed over in a row
    burst_tokens: float = 8192.0  # work a tenant below its share may be served ahead of the backlogged ones


SLO = SLOTargets()
FLOW = FlowParams()
AUTOSCALER = AutoscalerParams()
