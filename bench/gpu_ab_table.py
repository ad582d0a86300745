"""The GPU router A/B table: a live `kvserve bench` JSON with the simulator of the same workload beside it.

    python -m bench.gpu_ab_table LIVE.json PROFILE.json OUT.json --device D --vllm V --command C [--seeds 0-9]
        [--also LIVE_OTHER_LOAD.json]

Runs `kvserve sim` (the CLI, so the command in the JSON reproduces each row) on the live run's
workload and the GPU profile measured on the same card, for seed 0 (the live run's seed) and
for every seed given (medians), each with the hindsight partition bound; then writes the live
policies, the simulator's, and the targets of issue 29 (kvserve p90 <= 0.5x pow2's and
<= 1.1x the partition bound; sim vs live p50/p90 within 25%), with the p90 ratios also past the first
`concurrency` requests (a closed loop starts with that many at once on empty caches; `--live-requests`
gives the live run's records for the same). `--also`: a run of the same engines at
another concurrency, put beside its simulator (seed 0) under "other_loads". `--sim-requests N`: the
simulator also at N requests ("simulator_longer"); with `--only-longer`, LIVE is a finished table and
only that block is (re)computed; `--live-longer` (repeatable) puts live runs at N requests beside it, with
the targets against the simulator's seed-0 partition bound at N.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from simulator.suite import seed_list

CONFIG = "bench/configs/gpu-8b-4replicas.yaml"
POLICIES = ("round_robin", "pow2", "ray_prefix", "kvserve")
WITHIN = 0.25  # sim vs live, relative


def sim_command(live: dict[str, Any], profile: Path, seed: int, requests: int | None = None) -> list[str]:
    w, policies = live["workload"], [p for p in POLICIES if p in live["policies"]]
    return ["kvserve", "sim", "--workload", w["workload"], "--replicas", str(len(POLICIES)), "--config", CONFIG,
            "--profile", str(profile), "--tenants", str(w["tenants"]), "--tenant-skew", w["tenant_skew"],
            "--system-tokens", str(w["system_tokens"]), "--question-tokens", str(w["question_tokens"]),
            "--output-tokens", str(w["output_tokens"]), "--concurrency", str(w["concurrency"]),
            "--requests", str(requests or w["requests"]), "--policies", ",".join(policies), "--partition-oracle", "20",
            "--seed", str(seed)]


def run_sim(cmd: list[str], burst: int) -> dict[str, Any]:
    """The simulator's policies, each with `ttft_p90_after_burst_ms` (see `p90_after_burst`)."""
    with tempfile.TemporaryDirectory() as tmp:
        out, reqs = Path(tmp) / "sim.json", Path(tmp) / "requests.jsonl"
        subprocess.run([sys.executable, "-m", "cli", *cmd[1:], "--json", str(out), "--requests-jsonl", str(reqs)],
                       check=True, stdout=subprocess.DEVNULL)
        policies = json.loads(out.read_text())["policies"]
        for name, p90 in p90_after_burst(reqs.read_text().splitlines(), burst).items():
            policies[name]["ttft_p90_after_burst_ms"] = p90
        return policies


def p90_after_burst(lines: list[str], burst: int) -> dict[str, float]:
    """TTFT p90 per policy over the requests after the first `burst` (a closed loop's concurrency: they all
    arrive at once, on empty caches) from `--requests-jsonl` records (the bench's and the simulator's)."""
    by: dict[str, list[tuple[int, float]]] = {}
    for line in lines:
        r = json.loads(line)
        if r.get("ok", True) and r.get("ttft_ms") is not None:
            by.setdefault(r["policy"], []).append((r["idx"], r["ttft_ms"]))
    out = {}
    for name, rows in by.items():
        rest = sorted(t for i, t in rows if i >= burst)
        if rest:
            out[name] = round(rest[min(int(0.9 * len(rest)), len(rest) - 1)], 1)
    return out


def summary(policies: dict[str, Any]) -> dict[str, dict[str, float]]:
    bound, pow2 = policies["partition_oracle"]["ttft_p90_ms"], policies["pow2"]["ttft_p90_ms"]
    after = policies["partition_oracle"].get("ttft_p90_after_burst_ms")
    out = {name: {"ttft_p50_ms": round(p["ttft_p50_ms"], 1), "ttft_p90_ms": round(p["ttft_p90_ms"], 1),
                  "prefix_hit_rate": round(p["prefix_hit_rate"], 3),
                  "p90_over_partition_bound": round(p["ttft_p90_ms"] / bound, 3),
                  "p90_over_pow2": round(p["ttft_p90_ms"] / pow2, 3)}
           for name, p in policies.items()}
    if after:
        for name, p in policies.items():
            out[name]["ttft_p90_after_burst_ms"] = p["ttft_p90_after_burst_ms"]
            out[name]["p90_after_burst_over_partition_bound"] = round(p["ttft_p90_after_burst_ms"] / after, 3)
    return out


def over_live(sim: dict[str, Any], live: dict[str, Any]) -> dict[str, dict[str, float]]:
    return {name: {q: round(sim[name][f"ttft_{q}_ms"] / live[name][f"ttft_{q}_ms"], 3) for q in ("p50", "p90")}
            for name in POLICIES if name in live and name in sim}


def medians_of(runs: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Per policy and field, the median over the seeds' `summary`s."""
    return {name: {k: round(statistics.median(r[name][k] for r in runs), 3) for k in runs[0][name]}
            for name in runs[0]}


def longer(live: dict[str, Any], profile: Path, seeds: str, requests: int,
           live_runs: list[dict[str, Any]] | None = None, live_command: str = "") -> dict[str, Any]:
    """The simulator of the same workload at `requests` (medians over `seeds`): how much of the p90 ratio to
    the partition bound is the opening burst, which weighs concurrency / requests of the run. `live_runs`:
    live bench JSONs of that workload at `requests` (their seed, 0, is the simulator's seed 0)."""
    burst = live["workload"]["concurrency"]
    by_seed = {s: summary(run_sim(sim_command(live, profile, s, requests), burst)) for s in seed_list(seeds)}
    runs = list(by_seed.values())
    out = {"requests": requests, "command": " ".join(sim_command(live, profile, 0, requests)[:-1]) + " S",
           "seeds": seeds, "medians": medians_of(runs),
           "kvserve_p90_over_partition_bound_per_seed": [r["kvserve"]["p90_over_partition_bound"] for r in runs]}
    if live_runs:
        if any(r["workload"]["requests"] != requests for r in live_runs) or 0 not in by_seed:
            raise SystemExit(f"--live-longer needs live runs of {requests} requests and seed 0 among --seeds")
        out["live"], out["live_targets"] = live_beside(by_seed[0], live_runs, live_command)
    return out


def live_beside(seed0: dict[str, Any], runs: list[dict[str, Any]], command: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Live runs beside the simulator's seed 0 of the same workload: each policy as its first run measured
    it, every run's TTFT p50 and p90 per policy, and the targets with kvserve's p90 from every run that had
    it (a repeat shows the run-to-run spread)."""
    policies: dict[str, Any] = {}
    for r in runs:
        for name, p in r["policies"].items():
            policies.setdefault(name, p)
    bound = seed0["partition_oracle"]["ttft_p90_ms"]
    kv = [r["policies"]["kvserve"]["ttft_p90_ms"] for r in runs if "kvserve" in r["policies"]]
    targets = {
        "sim_partition_bound_p90_ms_seed0": bound,
        "kvserve_live_p90_ms_runs": [round(v, 1) for v in kv],
        "kvserve_live_p90_over_sim_partition_bound_runs": [round(v / bound, 3) for v in kv],
        **({"kvserve_p90_over_pow2_live": round(policies["kvserve"]["ttft_p90_ms"] / policies["pow2"]["ttft_p90_ms"], 3)}
           if "pow2" in policies and "kvserve" in policies else {}),
    }
    p50s = {name: [round(r["policies"][name]["ttft_p50_ms"], 1) for r in runs if name in r["policies"]]
            for name in policies}
    p90s = {name: [round(r["policies"][name]["ttft_p90_ms"], 1) for r in runs if name in r["policies"]]
            for name in policies}
    return {"command": command, "runs": len(runs), "policies": policies,
            "ttft_ms_runs": {name: {"p50": p50s[name], "p90": p90s[name]} for name in policies},
            "sim_over_live": over_live(seed0, policies)}, targets


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("live", type=Path)
    ap.add_argument("profile", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", required=True, help="the card the live run and the profile ran on")
    ap.add_argument("--vllm", required=True, help="vLLM version on that card")
    ap.add_argument("--command", required=True,
                    help="the command that produced LIVE.json (with --only-longer: the --live-longer runs')")
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--seeds", default="0-9")
    ap.add_argument("--live-requests", type=Path, help="the live run's --requests-jsonl, gzipped (p90 after the burst)")
    ap.add_argument("--also", type=Path, action="append", default=[], help="a live run at another concurrency")
    ap.add_argument("--sim-requests", type=int, help="also simulate the workload at this many requests (seeds' medians)")
    ap.add_argument("--live-longer", type=Path, action="append", default=[],
                    help="with --only-longer: a live run at --sim-requests requests (repeatable; --command is theirs)")
    ap.add_argument("--only-longer", action="store_true",
                    help="LIVE is a table this tool wrote: add or replace its --sim-requests block, keep the rest")
    a = ap.parse_args(argv)
    live = json.loads(a.live.read_text())
    if a.only_longer:
        if not a.sim_requests:
            ap.error("--only-longer needs --sim-requests")
        runs = [json.loads(f.read_text()) for f in a.live_longer]
        live["simulator_longer"] = longer(live, a.profile, a.seeds, a.sim_requests, runs, a.command)
        a.out.write_text(json.dumps(live, indent=1) + "\n")
        block = live["simulator_longer"]
        print(json.dumps(block.get("live_targets", block["medians"]["kvserve"]), indent=1))
        return
    burst = live["workload"]["concurrency"]
    runs = [summary(run_sim(sim_command(live, a.profile, s), burst)) for s in seed_list(a.seeds)]
    medians = medians_of(runs)
    seed0 = runs[0]
    lp = live["policies"]
    sim_vs_live = over_live(seed0, lp)
    others = {}
    for f in a.also:
        other = json.loads(f.read_text())
        sim = summary(run_sim(sim_command(other, a.profile, 0), other["workload"]["concurrency"]))
        others[f"concurrency_{other['workload']['concurrency']}"] = {
            "policies": other["policies"], "simulator": {"command": " ".join(sim_command(other, a.profile, 0)),
                                                         "policies": sim, "sim_over_live": over_live(sim, other["policies"])}}
    kv = lp["kvserve"]["ttft_p90_ms"]
    live_after = p90_after_burst(gzip.open(a.live_requests, "rt").read().splitlines(), burst) if a.live_requests else {}
    bound_after = seed0["partition_oracle"]["ttft_p90_after_burst_ms"]
    out = {
        "device": a.device, "vllm": a.vllm, "date": a.date, "command": a.command, "profile": a.profile.name,
        **{k: v for k, v in live.items() if k not in ("device", "vllm")},
        "simulator": {"command": " ".join(sim_command(live, a.profile, 0)), "policies": seed0,
                      "sim_over_live": sim_vs_live},
        "simulator_seeds": {"command": " ".join(sim_command(live, a.profile, 0)[:-1]) + " S", "seeds": a.seeds,
                            "medians": medians},
        "targets": {
            "kvserve_p90_over_pow2_live": round(kv / lp["pow2"]["ttft_p90_ms"], 3),
            "kvserve_p90_over_partition_bound_sim_seed0": seed0["kvserve"]["p90_over_partition_bound"],
            "kvserve_p90_over_partition_bound_sim_median": medians["kvserve"]["p90_over_partition_bound"],
            "kvserve_live_p90_over_sim_partition_bound": round(kv / seed0["partition_oracle"]["ttft_p90_ms"], 3),
            # The same past the first `concurrency` requests (they arrive together on empty caches).
            "kvserve_p90_after_burst_over_partition_bound_sim_median":
                medians["kvserve"]["p90_after_burst_over_partition_bound"],
            **({"kvserve_live_p90_after_burst_over_sim_partition_bound": round(
                live_after["kvserve"] / bound_after, 3)} if live_after else {}),
            "sim_vs_live_within_25pct": sum(abs(r - 1) <= WITHIN for v in sim_vs_live.values() for r in v.values()),
            "sim_vs_live_pairs": 2 * len(sim_vs_live),
        },
        "other_loads": others,
        **({"simulator_longer": longer(live, a.profile, a.seeds, a.sim_requests)} if a.sim_requests else {}),
    }
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["targets"], indent=1))


if __name__ == "__main__":
    main()
