"""What kvserve's autoscaling knobs buy on the suite: one setting per grid point, all cells and seeds.

Each setting of `autoscaling.headroom`, `downscale_delay_s` and `trend_z` runs the kvserve policy
on every suite cell (same workloads, oracle and causal bound as `simulator.suite`) and counts the
rows that meet issue 27's bars: attainment >= causal bound - 0.02, replica-seconds <= 1.2x the
oracle's. Two readings:

- the frontier: the settings no other setting beats on both counts (a setting that gains cost rows
  without losing attainment rows would show here);
- per row, the cheapest setting that keeps the row's attainment bar, chosen in hindsight for that
  row alone: a row no setting reaches is beyond this policy family's knobs; a row some setting
  reaches, while no single setting reaches all, needs a policy that tells the rows apart.

    python -m simulator.knob_frontier --seeds 0-9 --tune-seeds 0-4 --trace mooncake_synthetic_trace.jsonl --json F
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvserve.config import AutoscalingConfig
from simulator.metrics import slo_attainment
from simulator.oracle import oracle_replica_seconds
from simulator.runner import run_autoscaler
from simulator.suite import (ATTAINMENT_SLACK, COST_X, TRACE_NAME, ZeroLagScript, cell_setup, cells, command_line,
                             map_cells, oracle_need, run_script, seed_list)

# trend_z 99: no ramp ever clears it, so the ramp forecast is off.
GRID = {"headroom": (0.7, 0.8, 0.9, 1.0), "downscale_delay_s": (10.0, 20.0, 30.0, 60.0), "trend_z": (2.5, 4.0, 99.0)}


def settings(grid: dict[str, Sequence[float]] = GRID) -> list[dict[str, float]]:
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def run_settings(cell_name: str, seed: int, grid: list[dict[str, float]], trace: Path | None = None) -> dict[str, Any]:
    """One cell and seed: the causal bound's attainment, and per setting kvserve's attainment,
    replica-seconds and the oracle's replica-seconds over the same span."""
    setup = cell_setup(next(c for c in cells(trace) if c.name == cell_name), seed)
    slo, base = setup.cfg.slo, setup.cfg.autoscaling
    fixed, need = oracle_need(setup)
    causal = run_script(setup, ZeroLagScript(need), base, "causal_bound")
    runs = []
    for knobs in grid:
        a = base.model_copy(update=knobs)
        res = run_autoscaler(dataclasses.replace(setup, cfg=setup.cfg.model_copy(update={"autoscaling": a})),
                             "kvserve", "kvserve")
        oracle, _ = oracle_replica_seconds(fixed, a.min_replicas, a.max_replicas, res.end_time)
        runs.append({"slo_attainment": slo_attainment(res.requests, res.itl, slo),
                     "replica_seconds": res.replica_seconds, "oracle_replica_seconds": oracle})
    return {"causal_bound_attainment": slo_attainment(causal.requests, causal.itl, slo), "runs": runs}


def summarize(per_seed: dict[str, dict[int, dict[str, Any]]], grid: list[dict[str, float]],
              seeds: list[int]) -> dict[str, Any]:
    """Medians over `seeds` per row and setting (cost as the suite takes it: median replica-seconds
    over median oracle replica-seconds), the counts per setting, the frontier and each row's best."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for name, by_seed in per_seed.items():
        ss = [s for s in seeds if s in by_seed] or sorted(by_seed)[:1]
        causal = statistics.median(by_seed[s]["causal_bound_attainment"] for s in ss)
        rows[name] = []
        for i in range(len(grid)):
            med = {k: statistics.median(by_seed[s]["runs"][i][k] for s in ss)
                   for k in ("slo_attainment", "replica_seconds", "oracle_replica_seconds")}
            att, cost = med["slo_attainment"], med["replica_seconds"] / med["oracle_replica_seconds"]
            rows[name].append({"slo_attainment": att, "cost_over_oracle": cost, "causal_bound_attainment": causal,
                               "attainment_met": att >= causal - ATTAINMENT_SLACK - 1e-9,
                               "cost_met": cost <= COST_X + 1e-9})
    counts = []
    for i, knobs in enumerate(grid):
        att = [n for n in rows if rows[n][i]["attainment_met"]]
        cost = [n for n in rows if rows[n][i]["cost_met"]]
        counts.append({**knobs, "attainment_met": len(att), "cost_met": len(cost),
                       "both_met": len(set(att) & set(cost)),
                       "missed": sorted(n for n in rows if n not in att or n not in cost)})
    return {"settings": counts, "frontier": frontier(counts), "per_row": {n: row_best(r, grid) for n, r in rows.items()},
            "rows": rows}


def frontier(counts: list[dict[str, Any]]) -> list[int]:
    """Indices of the settings no other one beats on attainment rows and cost rows (ties kept)."""
    def beaten(c: dict[str, Any]) -> bool:
        return any(o["attainment_met"] >= c["attainment_met"] and o["cost_met"] >= c["cost_met"]
                   and (o["attainment_met"], o["cost_met"]) != (c["attainment_met"], c["cost_met"]) for o in counts)
    return [i for i, c in enumerate(counts) if not beaten(c)]


def row_best(row: list[dict[str, Any]], grid: list[dict[str, float]]) -> dict[str, Any]:
    """The cheapest setting that keeps this row's attainment bar (None: no setting keeps it)."""
    ok = [i for i, x in enumerate(row) if x["attainment_met"]]
    if not ok:
        return {"setting": None, "settings_meeting_attainment": 0}
    i = min(ok, key=lambda j: (row[j]["cost_over_oracle"], j))
    return {"setting": grid[i], "slo_attainment": row[i]["slo_attainment"], "cost_over_oracle": row[i]["cost_over_oracle"],
            "settings_meeting_attainment": len(ok),
            "settings_meeting_both": sum(1 for x in row if x["attainment_met"] and x["cost_met"])}


def _job(args: tuple[str, int, list[dict[str, float]], Path | None]) -> tuple[str, int, dict[str, Any]]:
    name, seed, grid, trace = args
    return name, seed, run_settings(name, seed, grid, trace)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0-9")
    p.add_argument("--tune-seeds", default="0-4")
    p.add_argument("--only", help="only cells whose name starts with this")
    p.add_argument("--grid", help='JSON {knob: [values]} instead of the default grid')
    p.add_argument("--trace", type=Path, help=f"the shared {TRACE_NAME} (for the trace cells)")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    grid = settings(json.loads(args.grid) if args.grid else GRID)
    seeds, tune = seed_list(args.seeds), set(seed_list(args.tune_seeds))
    todo = [c for c in cells(args.trace) if args.only is None or c.name.startswith(args.only)]
    t0 = time.perf_counter()
    per_seed = map_cells(_job, todo, seeds, (grid, args.trace), args.jobs)
    report, tuned = [s for s in seeds if s not in tune] or seeds, [s for s in seeds if s in tune]
    default = {k: getattr(AutoscalingConfig(), k) for k in grid[0]}
    out: dict[str, Any] = {"date": datetime.date.today().isoformat(),
                           "command": command_line("simulator.knob_frontier", argv), "grid": grid,
                           "default_setting": grid.index(default) if default in grid else None,
                           "seeds": {"tune": tuned, "report": report},
                           "report": summarize(per_seed, grid, report),
                           "tune": summarize(per_seed, grid, tuned) if tuned else None,
                           "sim_wall_s": time.perf_counter() - t0}
    for split in ("report", "tune"):
        if out[split] is None:
            continue
        print(f"{split}: frontier (attainment rows, cost rows, both) of {len(todo)}")
        for i in out[split]["frontier"]:
            c = out[split]["settings"][i]
            mark = "  (the default)" if i == out["default_setting"] else ""
            print(f"  {_knobs(grid[i])}: {c['attainment_met']}, {c['cost_met']}, {c['both_met']}{mark}")
        if out["default_setting"] is not None and out["default_setting"] not in out[split]["frontier"]:
            c = out[split]["settings"][out["default_setting"]]
            print(f"  the default, {_knobs(grid[out['default_setting']])}: {c['attainment_met']}, {c['cost_met']}, "
                  f"{c['both_met']} (not on the frontier)")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return out


def _knobs(k: dict[str, float]) -> str:
    return " ".join(f"{n}={v:g}" for n, v in k.items())


if __name__ == "__main__":
    main()
