"""One path, profile always present: an unmeasured model starts from a conservative estimate and
fits it to its replicas' reports; the latency targets are an input of each decision."""

from __future__ import annotations

import dataclasses

from autoscaling.base import ReplicaMetrics, ScalingInput
from autoscaling.policies.kvserve import SLOAutoscaler
from autoscaling.profile_fit import OnlineProfile, conservative_base
from kvserve.config import AutoscalingConfig
from kvserve.policy_params import SLOTargets

SLO = SLOTargets(ttft_p90_ms=2000.0, itl_p90_ms=200.0)
BASE = conservative_base()


def report(rate: float, prompt: float, running: int, prefill_x: float, decode_x: float) -> ReplicaMetrics:
    """A replica whose engine is `prefill_x` / `decode_x` times as slow as the base profile."""
    return ReplicaMetrics("r0", ttft_p90_ms=prefill_x * BASE.prefill_ms_for(prompt),
                          itl_p90_ms=decode_x * BASE.decode_step_ms(running, prompt + 25), waiting=0, running=running,
                          requests_per_s=rate, mean_prompt_tokens=prompt, mean_output_tokens=50)


def test_the_fit_moves_from_the_conservative_start_to_what_replicas_report():
    fit = OnlineProfile(scale=4.0)
    assert fit.profile.prefill_ms_for(500) == 4.0 * BASE.prefill_ms_for(500)
    for _ in range(100):
        fit.observe([report(1.0, 500.0, 8, prefill_x=1.5, decode_x=0.5)])
    assert abs(fit.prefill - 1.5) < 0.01 and abs(fit.decode - 0.5) < 0.01
    assert abs(fit.profile.prefill_ms_for(500) / BASE.prefill_ms_for(500) - 1.5) < 0.1


def test_an_unmeasured_model_plans_more_replicas_until_fitted_then_the_same():
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=50, upscale_delay_s=0, downscale_delay_s=0, max_step=50)
    ms = [dataclasses.replace(report(0.5, 500.0, 4, 1.0, 1.0), replica_id=f"r{i}") for i in range(4)]
    measured = SLOAutoscaler(cfg.params(), SLO, BASE)
    unmeasured = SLOAutoscaler(cfg.params(), SLO, None)
    first = unmeasured.decide(ScalingInput(0.0, 4, 4, ms)).replicas
    want = measured.decide(ScalingInput(0.0, 4, 4, ms)).replicas
    assert first > want  # the conservative estimate over-provisions
    for t in range(1, 200):
        unmeasured.decide(ScalingInput(float(t), 4, 4, ms))
    assert abs(unmeasured.decide(ScalingInput(200.0, 4, 4, ms)).replicas - want) <= 1


def test_the_fitted_profile_survives_a_state_round_trip():
    cfg = AutoscalingConfig()
    a = SLOAutoscaler(cfg.params(), SLO, None)
    for t in range(30):
        a.decide(ScalingInput(float(t), 1, 1, [report(0.5, 500.0, 4, 2.0, 1.0)]))
    b = SLOAutoscaler(cfg.params(), SLO, None)
    b.set_state(a.get_state())
    assert (b.fit.prefill, b.fit.decode) == (a.fit.prefill, a.fit.decode)  # type: ignore[union-attr]


def test_a_tighter_target_passed_in_asks_for_at_least_as_many_replicas():
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=50, upscale_delay_s=0, max_step=50)
    ms = [report(3.0, 500.0, 4, 1.0, 1.0)]
    loose = SLOAutoscaler(cfg.params(), SLO, BASE).decide(ScalingInput(0.0, 1, 1, ms)).replicas
    tight = SLOAutoscaler(cfg.params(), SLO, BASE).decide(
        ScalingInput(0.0, 1, 1, ms, slo=SLOTargets(ttft_p90_ms=800.0, itl_p90_ms=200.0))).replicas
    assert tight > loose >= 1
