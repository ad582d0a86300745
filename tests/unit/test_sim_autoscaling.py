"""Autoscaling harness of the simulator: bounds, start-up delay, drain without loss."""

from __future__ import annotations

from autoscaling.base import Decision, ScalingInput, ScalingPolicy
from kvserve.config import AutoscalingConfig
from kvserve.sim.cluster import Cluster, ScalingSetup
from kvserve.sim.engine import EngineSettings
from kvserve.sim.workloads import TenantMix, generated
from router.registry import make_policy
from tests.unit.test_sim_cluster import LINEAR


class Scripted(ScalingPolicy):
    """Asks for `high` replicas between t_up and t_down, else 1; records what it was shown."""

    name = "scripted"

    def __init__(self, high: int, t_up: float, t_down: float) -> None:
        self.high, self.t_up, self.t_down = high, t_up, t_down
        self.seen: list[ScalingInput] = []

    def decide(self, inp: ScalingInput) -> Decision:
        self.seen.append(inp)
        return Decision(self.high if self.t_up <= inp.now < self.t_down else 1, "scripted")


def _cluster(policy: ScalingPolicy, cfg: AutoscalingConfig, start_s: float = 2.0, out_tokens: int = 40):  # type: ignore[no-untyped-def]
    mix = TenantMix(tenants=3, system_tokens=32, question_tokens=8, output_tokens=out_tokens)
    wl = generated("step", mix, 4, rate=20.0, phase_s=10.0, seed=1)
    eng = EngineSettings(block_size=4, kv_blocks=256, max_num_seqs=4, max_batched_tokens=64)
    sc = ScalingSetup(policy, cfg, start_s=start_s, decision_interval_s=0.5)
    return wl, Cluster(wl, LINEAR, eng, make_policy("round_robin"), replicas=0, scaling=sc, trace_events=True)


def test_replicas_bounded_and_drained_replicas_finish_their_requests() -> None:
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=3, drain_grace_s=1000.0)
    pol = Scripted(high=10, t_up=5.0, t_down=15.0)  # asks above max: must be clamped
    wl, cluster = _cluster(pol, cfg)
    res = cluster.run()
    assert max(row["existing"] for row in res.timeline) == 3
    assert min(row["existing"] for row in res.timeline) >= 1
    assert res.failed_requests == 0
    assert all(r.finished is not None and not r.failed for r in res.requests)
    gone = {rid: rep for rid, rep in cluster.replicas.items() if rep.drain_started is not None}
    assert gone, "the scripted scale-down drained nobody"
    for r in res.requests:
        rep = cluster.replicas[r.replica]
        if rep.drain_started is not None:
            assert r.finished <= rep.gone_at  # in-flight work finished before the replica left
            assert r.arrival <= rep.drain_started  # and nothing new was routed to it while draining
    # start-up delay: no request lands on a scaled-up replica before it is ready
    for r in res.requests:
        rep = cluster.replicas[r.replica]
        if rep.created > 0:
            assert r.arrival >= rep.created + 2.0 - 1e-9
    assert pol.seen and all(inp.running_replicas <= inp.current_replicas <= 3 for inp in pol.seen)


def test_grace_expiry_counts_failed_requests_and_loses_none() -> None:
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=3, drain_grace_s=0.0)
    wl, cluster = _cluster(Scripted(high=3, t_up=1.0, t_down=15.0), cfg, out_tokens=400)
    res = cluster.run()
    failed = [r for r in res.requests if r.failed]
    assert res.failed_requests == len(failed) > 0
    assert all(r.finished is not None for r in res.requests)  # every request accounted for


def test_replica_seconds_count_starting_and_draining_replicas() -> None:
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=2, drain_grace_s=1000.0)
    wl, cluster = _cluster(Scripted(high=2, t_up=0.0, t_down=1e9), cfg, start_s=3.0)
    res = cluster.run()
    # r0000 from 0, r0001 asked for at the first decision (0.5 s): both counted to the end
    assert abs(res.replica_seconds - (res.end_time + (res.end_time - 0.5))) < 1e-6
