"""The Serve adapter against Ray 2.60's real config/context classes and policy wrapper (no cluster)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

pytest.importorskip("ray.serve")

from ray.serve._private.autoscaling_state import _resolve_policy_callable  # noqa: E402
from ray.serve._private.common import DeploymentID, ReplicaID, TimeStampedValue  # noqa: E402
from ray.serve.autoscaling_policy import _apply_autoscaling_config  # noqa: E402
from ray.serve.config import AutoscalingConfig as ServeAutoscalingConfig  # noqa: E402
from ray.serve.config import AutoscalingContext  # noqa: E402

from deployments.autoscaling_policy import (  # noqa: E402
    POLICY_IMPORT_PATH,
    STATE_KEY,
    SLOAutoscalingPolicy,
    autoscaling_config_for,
    drain_options_for,
    metrics_push_env_vars,
    scaling_input_from_context,
)
from autoscaling.window import SignalWindow  # noqa: E402
from kvserve.config import KVServeConfig  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"
H200 = SHARED / "profiles" / "h200-vllm0.24-llama8b-profile.json"
DEP = DeploymentID("LLMReplica", "kvserve")


def kv_cfg(**autoscaling) -> KVServeConfig:
    base = {"enabled": True, "min_replicas": 1, "max_replicas": 4, "upscale_delay_s": 10.0,
            "downscale_delay_s": 60.0}
    return KVServeConfig(autoscaling={**base, **autoscaling}, slo={"ttft_p90_ms": 1000, "itl_p90_ms": 100})


def replica_stats(ttft: float | None, rate: float = 2.0) -> dict[str, float]:
    w = SignalWindow(look_back_s=30.0, clock=lambda: 0.0)
    for i in range(int(rate * 10)):
        w.on_arrival(300, now=i * 0.5)
        if ttft is not None:
            w.on_first_token(ttft, now=i * 0.5 + 0.1)
            w.on_token_gap(20.0, now=i * 0.5 + 0.2)
        w.on_completion(50, now=i * 0.5 + 0.3)
    return w.to_stats_dict(now=10.0)


def context(serve_cfg, stats_by_replica: dict[str, list[dict[str, float]]], target: int, running: int | None = None,
            now: float = 1000.0, policy_state: dict | None = None, ongoing: float = 4.0,
            queued: float = 0.0) -> AutoscalingContext:
    replicas = [ReplicaID(uid, DEP) for uid in stats_by_replica]
    raw: dict = {}
    for rid, reports in zip(replicas, stats_by_replica.values()):
        for t, report in enumerate(reports):  # oldest first; the adapter must take the newest
            for key, value in report.items():
                raw.setdefault(key, {}).setdefault(rid, []).append(TimeStampedValue(now - 10 + t, value))
    n = len(replicas) if running is None else running
    return AutoscalingContext(
        deployment_id=DEP, deployment_name=DEP.name, app_name=DEP.app_name,
        current_num_replicas=n, target_num_replicas=target, running_replicas=replicas[:n],
        total_num_requests=ongoing, total_queued_requests=queued, aggregated_metrics=None, raw_metrics=raw,
        capacity_adjusted_min_replicas=serve_cfg.min_replicas, capacity_adjusted_max_replicas=serve_cfg.max_replicas,
        policy_state=policy_state or {}, last_scale_up_time=None, last_scale_down_time=None,
        current_time=now, config=serve_cfg,
    )


def serve_policy(cfg: KVServeConfig, profile=None):
    """What the Serve controller builds: validated config, class instantiated with policy_kwargs,
    wrapped with Serve's own factors/delays."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no deprecated fields
        serve_cfg = ServeAutoscalingConfig(**autoscaling_config_for(cfg, profile))
    return serve_cfg, _apply_autoscaling_config(_resolve_policy_callable(serve_cfg.policy))


def test_config_dict_is_valid_for_serve_and_points_at_our_policy():
    cfg = kv_cfg(initial_replicas=2, look_back_s=20.0)
    d = autoscaling_config_for(cfg)
    serve_cfg = ServeAutoscalingConfig(**d)
    assert (serve_cfg.min_replicas, serve_cfg.max_replicas, serve_cfg.initial_replicas) == (1, 4, 2)
    assert serve_cfg.look_back_period_s == 20.0
    assert serve_cfg.policy.policy_function == POLICY_IMPORT_PATH
    # Delays live in the pure policy; Serve's wrapper must pass decisions straight through.
    assert serve_cfg.upscale_delay_s == 0 and serve_cfg.downscale_delay_s == 0
    # The routers' queue reaches the policy as the window's peak (its growth is read as arrivals).
    assert serve_cfg.aggregation_function == "max"
    json.dumps(d["policy"]["policy_kwargs"])  # Serve requires JSON-serializable kwargs


def test_serve_default_uses_serves_builtin_policy_with_our_delays():
    d = autoscaling_config_for(kv_cfg(policy="serve_default", target_ongoing_requests=3))
    assert "policy" not in d
    assert (d["upscale_delay_s"], d["downscale_delay_s"], d["target_ongoing_requests"]) == (10.0, 60.0, 3)


def test_translation_takes_each_replicas_newest_report():
    serve_cfg, _ = serve_policy(kv_cfg())
    ctx = context(serve_cfg, {"a": [replica_stats(9000.0), replica_stats(400.0)], "b": [replica_stats(None)]},
                  target=3, running=2, ongoing=7.0)
    inp = scaling_input_from_context(ctx)
    assert (inp.target_replicas, inp.running_replicas, inp.total_ongoing, inp.now) == (3, 2, 7.0, 1000.0)
    by_id = {m.replica_id: m for m in inp.metrics}
    assert set(by_id) == {"a", "b"}
    assert by_id["a"].ttft_p90_ms == 400.0 and by_id["a"].requests_per_s == pytest.approx(2.0)
    assert by_id["b"].ttft_p90_ms is None and by_id["b"].itl_p90_ms is None


def test_replicas_not_running_are_ignored():
    serve_cfg, _ = serve_policy(kv_cfg())
    ctx = context(serve_cfg, {"a": [replica_stats(400.0)], "gone": [replica_stats(9000.0)]}, target=2, running=1)
    assert [m.replica_id for m in scaling_input_from_context(ctx).metrics] == ["a"]


def test_through_serves_wrapper_scales_up_after_the_delay_and_keeps_state():
    cfg = kv_cfg()
    serve_cfg, policy = serve_policy(cfg)
    hot = {"a": [replica_stats(2500.0)]}  # p90 TTFT 2.5x the target
    n, state = policy(context(serve_cfg, hot, target=1, now=1000.0))
    assert n == 1 and state[STATE_KEY]["gate"]["direction"] == 1  # waiting out upscale_delay_s
    n, state = policy(context(serve_cfg, hot, target=1, now=1005.0, policy_state=state))
    assert n == 1
    n, state = policy(context(serve_cfg, hot, target=1, now=1010.0, policy_state=state))
    assert n == 3  # ceil(1 * 2.5)
    json.dumps(state)  # plain data


def test_a_scaling_decision_is_logged_with_its_reason(caplog):
    cfg = kv_cfg(upscale_delay_s=0.0)
    serve_cfg, _ = serve_policy(cfg)
    # Built from bare kwargs: no profile, so the conservative estimate (fitted online) plans it.
    policy = SLOAutoscalingPolicy(autoscaling=cfg.autoscaling.model_dump(), slo=cfg.slo.model_dump())
    with caplog.at_level("INFO", logger="ray.serve"):
        n, _ = policy(context(serve_cfg, {"a": [replica_stats(2500.0)]}, target=1))
    assert n > 1
    lines = [r.getMessage() for r in caplog.records if "kvserve autoscaler" in r.getMessage()]
    assert len(lines) == 1 and f"1 -> {n} replicas" in lines[0] and "slo r=2.50 > 1" in lines[0]
    caplog.clear()
    _, policy = serve_policy(cfg)  # the embedded model's profile: this load needs max_replicas (4)
    with caplog.at_level("INFO", logger="ray.serve"):
        policy(context(serve_cfg, {k: [replica_stats(800.0)] for k in "abcd"},
                       target=4))  # within target: no change, nothing logged
    assert not [r for r in caplog.records if "kvserve autoscaler" in r.getMessage()]


def test_a_guard_that_holds_a_scale_down_is_logged_once(caplog):
    serve_cfg, policy = serve_policy(kv_cfg(downscale_delay_s=0.0))
    quiet = {k: [replica_stats(200.0, rate=0.2)] for k in "abcd"}  # one replica's load on four
    with caplog.at_level("INFO", logger="ray.serve"):
        for t in range(3):  # requests wait at the routers: no shrink, whatever the rate says
            n, _ = policy(context(serve_cfg, quiet, target=4, now=1000.0 + t, queued=5.0))
            assert n == 4
    lines = [r.getMessage() for r in caplog.records if "kvserve autoscaler" in r.getMessage()]
    assert len(lines) == 1 and "holding 4 replicas (routers_queue)" in lines[0], lines
    with caplog.at_level("INFO", logger="ray.serve"):
        n, _ = policy(context(serve_cfg, quiet, target=4, now=1010.0))  # the queue drained: it acts
    assert n < 4


def test_no_reports_hold_the_current_target():
    serve_cfg, policy = serve_policy(kv_cfg())
    n, _ = policy(context(serve_cfg, {}, target=2, running=0, ongoing=0.0))
    assert n == 2


def test_policy_restarts_from_policy_state():
    """A controller restart builds a fresh instance; the pending wish survives in policy_state."""
    cfg = kv_cfg()
    serve_cfg, first = serve_policy(cfg)
    hot = {"a": [replica_stats(2500.0)]}
    _, state = first(context(serve_cfg, hot, target=1, now=1000.0))
    _, second = serve_policy(cfg)
    n, _ = second(context(serve_cfg, hot, target=1, now=1010.0, policy_state=state))
    assert n == 3


@pytest.mark.skipif(not H200.exists(), reason="shared profiles not present")
def test_profile_travels_in_policy_kwargs_and_drives_capacity():
    cfg = kv_cfg(max_replicas=16, upscale_delay_s=0.0, max_step=16)
    serve_cfg, policy = serve_policy(cfg, H200)
    assert {"block_size", "kv_cache_tokens", "prefill", "decode"} <= set(serve_cfg.policy.policy_kwargs["profile"])
    # Latency is fine but the rate is far beyond one H200's modelled capacity for 4k-token prompts.
    w = SignalWindow(look_back_s=30.0, clock=lambda: 0.0)
    for i in range(3000):
        w.on_arrival(4000, now=i * 0.01)
        w.on_first_token(200.0, now=i * 0.01)
        w.on_token_gap(20.0, now=i * 0.01)
        w.on_completion(200, now=i * 0.01)
    n, _ = policy(context(serve_cfg, {"a": [w.to_stats_dict(now=30.0)]}, target=1))
    assert n > 1


def test_class_builds_from_plain_kwargs_without_a_profile():
    policy = SLOAutoscalingPolicy(autoscaling={"min_replicas": 2, "max_replicas": 3}, slo={"ttft_p90_ms": 500})
    assert policy.cfg.min_replicas == 2 and policy.slo.ttft_p90_ms == 500 and policy.policy.name == "kvserve"


def test_drain_options_bound_the_grace_period():
    opts = drain_options_for(kv_cfg(drain_grace_s=45.0))
    assert opts == {"graceful_shutdown_timeout_s": 45.0, "graceful_shutdown_wait_loop_s": 1.0}
    assert drain_options_for(kv_cfg(drain_grace_s=0.0))["graceful_shutdown_wait_loop_s"] == 0.0


def test_metrics_push_interval_fits_the_look_back_window():
    env = metrics_push_env_vars(kv_cfg(look_back_s=12.0))
    assert float(env["RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S"]) == 2.0
    assert all(isinstance(v, str) for v in env.values())


def test_requests_queued_at_the_routers_reach_the_policy():
    serve_cfg, _ = serve_policy(kv_cfg())
    stats = {"a": [replica_stats(200.0)]}
    assert scaling_input_from_context(context(serve_cfg, stats, target=1, queued=37.0)).queued_requests == 37.0
    assert scaling_input_from_context(context(serve_cfg, stats, target=1)).queued_requests == 0.0
