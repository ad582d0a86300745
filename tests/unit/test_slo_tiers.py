"""Per-tenant SLO tiers: replicas report the tiers with traffic; the autoscaler (live adapter and the
simulator's) plans for the tightest."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.serve")

from autoscaling.base import Decision, ScalingInput  # noqa: E402
from deployments.autoscaling_policy import SLOAutoscalingPolicy  # noqa: E402
from deployments.tier_stats import TIER_TTFT_KEY, TierStats, tier_targets  # noqa: E402
from kvserve.config import KVServeConfig  # noqa: E402
from kvserve.policy_params import SLOTargets  # noqa: E402
from simulator.engine import SimRequest  # noqa: E402
from simulator.slo_tiers import TieredTargets  # noqa: E402
from tests.unit.test_autoscaling_serve_adapter import context, kv_cfg, replica_stats, serve_policy  # noqa: E402

TIERS = {"tenants": {"classes": {"gold": {"ttft_p90_ms": 500}, "free": {"priority": -1}},
                     "keys": [{"tenant": "acme", "key_sha256": "a" * 64, "class": "gold"},
                              {"tenant": "hobby", "key_sha256": "b" * 64, "class": "free"}]}}


def test_a_replica_reports_the_tightest_tier_it_served_lately() -> None:
    cfg = KVServeConfig.model_validate(TIERS)
    t = TierStats(cfg)
    assert t.stats()[TIER_TTFT_KEY] < 0  # no tiered traffic: no data
    t.saw("hobby")
    assert t.stats()[TIER_TTFT_KEY] < 0  # `free` has no tier of its own
    t.saw("acme")
    assert t.stats()[TIER_TTFT_KEY] == 500
    assert tier_targets(SLOTargets(1000, 100), [t.stats(), {}]) == SLOTargets(500, 100)


def test_the_live_adapter_scales_for_the_gold_tier_only_while_gold_sends_traffic() -> None:
    cfg = kv_cfg(upscale_delay_s=0.0)
    serve_cfg, _ = serve_policy(cfg)
    policy = SLOAutoscalingPolicy(**serve_cfg.policy.policy_kwargs)  # 1000 ms, the embedded model's profile
    quiet = replica_stats(700.0, rate=0.5)  # within the cluster's 1000 ms, and one replica's work
    n, _ = policy(context(serve_cfg, {"a": [quiet]}, target=1))
    assert n == 1 and policy.targets.ttft_p90_ms == 1000
    gold = {**quiet, TIER_TTFT_KEY: 500.0}  # but 1.4x gold's 500 ms
    n, _ = policy(context(serve_cfg, {"a": [gold]}, target=1))
    assert n == 2 and policy.targets.ttft_p90_ms == 500


class _Recorder:
    def __init__(self, targets: SLOTargets) -> None:
        self.targets = targets

    def decide(self, inp: ScalingInput) -> Decision:
        return Decision(1, str(self.targets.ttft_p90_ms))

    def get_state(self) -> dict:
        return {}

    def set_state(self, state: dict) -> None:
        pass


def test_the_simulators_hook_follows_the_tiers_with_traffic() -> None:
    cfg = KVServeConfig.model_validate({**TIERS, "slo": {"ttft_p90_ms": 1000}, "autoscaling": {"look_back_s": 30}})
    reqs = [SimRequest(0, 5.0, 10, 10, [], 1, "hobby"), SimRequest(1, 10.0, 10, 10, [], 1, "acme")]
    wrapped = TieredTargets(_Recorder, cfg, reqs)
    inp = lambda t: ScalingInput(now=t, target_replicas=1, running_replicas=1, metrics=[])  # noqa: E731
    assert wrapped.decide(inp(6.0)).reason == "1000.0"
    assert wrapped.decide(inp(11.0)).reason == "500.0"  # gold arrived
    assert wrapped.decide(inp(100.0)).reason == "1000.0"  # gold silent for longer than the look-back
