"""The GPU A/B table's arithmetic: ratios to pow2 and to the partition bound, the sim command, seed ranges."""

from pathlib import Path

from bench.gpu_ab_table import POLICIES, medians_of, sim_command, summary


def _policy(p50: float, p90: float) -> dict[str, float]:
    return {"ttft_p50_ms": p50, "ttft_p90_ms": p90, "prefix_hit_rate": 0.5}


def test_summary_ratios_are_to_pow2_and_to_the_partition_bound() -> None:
    out = summary({"pow2": _policy(500, 2000), "kvserve": _policy(100, 600), "partition_oracle": _policy(90, 400)})
    assert out["kvserve"]["p90_over_pow2"] == 0.3
    assert out["kvserve"]["p90_over_partition_bound"] == 1.5
    assert out["partition_oracle"]["p90_over_partition_bound"] == 1.0


def test_sim_command_replays_the_live_workload() -> None:
    live = {"workload": {"workload": "multi-tenant", "tenants": 32, "tenant_skew": "zipf:1.1", "system_tokens": 2000,
                         "question_tokens": 50, "output_tokens": 64, "concurrency": 64, "requests": 600},
            "policies": {p: {} for p in POLICIES}}
    cmd = sim_command(live, Path("p.json"), 3)
    flags = dict(zip(cmd[2::2], cmd[3::2]))
    assert flags["--tenants"] == "32" and flags["--system-tokens"] == "2000" and flags["--concurrency"] == "64"
    assert flags["--policies"] == ",".join(POLICIES) and flags["--seed"] == "3" and flags["--profile"] == "p.json"
    assert flags["--requests"] == "600"
    longer = dict(zip(*(lambda c: (c[2::2], c[3::2]))(sim_command(live, Path("p.json"), 3, 1200))))
    assert longer == {**flags, "--requests": "1200"}


def test_sim_command_runs_the_policies_the_live_run_had() -> None:
    live = {"workload": {"workload": "multi-tenant", "tenants": 8, "tenant_skew": "zipf:1.1", "system_tokens": 200,
                         "question_tokens": 5, "output_tokens": 4, "concurrency": 16, "requests": 60},
            "policies": {"pow2": {}, "kvserve": {}}}
    flags = dict(zip(*(lambda c: (c[2::2], c[3::2]))(sim_command(live, Path("p.json"), 0))))
    assert flags["--policies"] == "pow2,kvserve"


def test_sim_over_live_pairs_only_the_policies_both_ran() -> None:
    from bench.gpu_ab_table import over_live

    sim = {"kvserve": _policy(120, 660), "pow2": _policy(500, 2000)}
    assert over_live(sim, {"kvserve": _policy(100, 600)}) == {"kvserve": {"p50": 1.2, "p90": 1.1}}


def test_seed_ranges() -> None:
    from simulator.suite import seed_list

    assert seed_list("0-9") == list(range(10))
    assert seed_list("4") == [4]


def test_p90_after_the_burst_skips_the_first_concurrency_requests() -> None:
    import json

    from bench.gpu_ab_table import p90_after_burst

    lines = [json.dumps({"policy": "kvserve", "idx": i, "ttft_ms": 1000.0 if i < 4 else float(i), "ok": True})
             for i in range(24)]
    lines.append(json.dumps({"policy": "kvserve", "idx": 30, "ttft_ms": None, "ok": False}))
    assert p90_after_burst(lines, 4) == {"kvserve": 22.0}  # 4..23: the 90th percentile of 20 values
    assert p90_after_burst(lines, 0) == {"kvserve": 1000.0}


def test_medians_are_per_policy_and_field_over_the_seeds() -> None:
    runs = [{"kvserve": {"ttft_p90_ms": v, "p90_over_partition_bound": v / 100}} for v in (300.0, 500.0, 400.0)]
    assert medians_of(runs) == {"kvserve": {"ttft_p90_ms": 400.0, "p90_over_partition_bound": 4.0}}


def test_live_runs_beside_the_simulator_keep_each_policy_first_run_and_every_run_ttft() -> None:
    from bench.gpu_ab_table import live_beside

    seed0 = {"kvserve": _policy(200, 350), "pow2": _policy(600, 1700), "partition_oracle": _policy(190, 400)}
    first = {"policies": {"kvserve": _policy(150, 440), "pow2": _policy(700, 2200)}}
    second = {"policies": {"kvserve": _policy(160, 400), "ray_prefix": _policy(210, 420)}}
    live, targets = live_beside(seed0, [first, second], "cmd")
    assert live["policies"]["kvserve"]["ttft_p90_ms"] == 440 and set(live["policies"]) == {"kvserve", "pow2", "ray_prefix"}
    assert targets["kvserve_live_p90_over_sim_partition_bound_runs"] == [1.1, 1.0]
    assert live["ttft_ms_runs"]["kvserve"] == {"p50": [150, 160], "p90": [440, 400]}
    assert live["ttft_ms_runs"]["ray_prefix"] == {"p50": [210], "p90": [420]}
    assert targets["kvserve_p90_over_pow2_live"] == 0.2
    assert live["sim_over_live"] == {"pow2": {"p50": 0.857, "p90": 0.773}, "kvserve": {"p50": 1.333, "p90": 0.795}}
