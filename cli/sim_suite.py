"""`kvserve sim --suite autoscaling`: the autoscaling workload suite (simulator.suite), a table and JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

SUITES = ("autoscaling",)
# (targets key, label, the key of its verdict against its bound)
TARGETS = (("attainment_vs_causal", "attainment", ""), ("cost_vs_oracle", "cost", "cost_verdict"),
           ("not_worse_than_serve_default", "vs serve_default", ""), ("prewarm_vs_fleet", "pre-warm", "prewarm_verdict"))


def parse_seeds(spec: str) -> list[int]:
    """'0-9', '3', '0,2,5-7' -> sorted seeds."""
    from simulator.suite import seed_list

    try:
        return seed_list(spec)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--seeds") from e


def _f(v: Any, fmt: str = ".3f") -> str:
    return "-" if v is None else format(v, fmt)


def suite_table(title: str, workloads: dict[str, Any]) -> Table:
    t = Table(title=title)
    for c in ("workload", "autoscaler", "attainment", "causal bound", "lagged bound", "replica-s", "x oracle",
              "x hindsight", "x lagged", "failed", "new-replica hit", "fleet hit", "new/fleet (bound)",
              "targets met"):
        t.add_column(c, justify="left" if c in ("workload", "autoscaler", "targets met") else "right")
    for name, w in workloads.items():
        for a, row in w["autoscalers"].items():
            ratio = row["replica_seconds"] / row["oracle_replica_seconds"] if row["oracle_replica_seconds"] else None
            met, d = "", w["details"][a]
            if a == "kvserve":
                tg = w["targets"]
                missed = [f"{label}{' (' + tg[v] + ')' if tg.get(v) else ''}" for k, label, v in TARGETS
                          if tg.get(k) is False]
                met = "MISSED: " + ", ".join(missed) if missed else "all"
            hs, lag = row.get("hindsight_startup_bound_replica_seconds"), row.get("lagged_causal_bound_replica_seconds")
            t.add_row(name, a, _f(row["slo_attainment"]), _f(row["causal_bound_attainment"]),
                      _f(row.get("lagged_causal_bound_attainment")), _f(row["replica_seconds"], ",.0f"), _f(ratio, ".2f"),
                      _f(row["replica_seconds"] / hs if hs else None, ".2f"),
                      _f(row["replica_seconds"] / lag if lag else None, ".2f"), _f(row["failed_requests"], ".0f"),
                      _f(row["newreplica_hit_rate"]), _f(d.get("fleet_hit_rate")),
                      f"{_f(d.get('newreplica_hit_ratio'), '.2f')} ({_f(row.get('newreplica_hit_bound'), '.2f')})", met)
    return t


def run(suite: str, seeds: str, tune_seeds: str, trace: Path | None, jobs: int, json_out: Path | None,
        only: str | None) -> None:
    from simulator.suite import run_suite

    if suite not in SUITES:
        raise typer.BadParameter(f"unknown suite {suite!r}; known: {', '.join(SUITES)}", param_hint="--suite")
    console = Console() if Console().is_terminal else Console(width=200)
    all_seeds, tune = parse_seeds(seeds), parse_seeds(tune_seeds)
    out = run_suite(all_seeds, tune, trace, jobs, only=only,
                    progress=lambda name, seed: console.print(f"  {name} seed {seed} done", highlight=False))
    if out["tuning"]:
        console.print(suite_table(f"tune seeds {out['seeds']['tune']} (medians)", out["tuning"]["workloads"]))
    console.print(suite_table(f"report seeds {out['seeds']['report']} (medians)", out["workloads"]))
    console.print(f"sim wall time {out['sim_wall_s']:.0f} s")
    if json_out is not None:
        import datetime

        from bench.results import environment

        out = {"date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(), **environment(), **out}
        json_out.write_text(json.dumps(out, indent=1) + "\n")
        console.print(f"wrote {json_out}")
