"""How late may an autoscaler learn what each minute needs? A suite cell's reaction budget.

For each lag L a script asks for the oracle's count of minute m from L seconds after m starts
(`simulator.bounds.LaggedScript` with no delay gate; real start-up and pre-warm). Lag 0 is the
suite's causal bound. The largest lag that still reaches the causal bound's attainment is all a
causal policy has for detection plus its upscale delay on that cell:

    python -m simulator.reaction_budget --cells step/low --lags 0,6,12,20,30 --seeds 0-9

Prints, per cell and lag, the median attainment over the tune and the report seeds and each seed's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simulator.bounds import LaggedScript
from simulator.metrics import slo_attainment
from simulator.suite import TRACE_NAME, cell_setup, cells, command_line, oracle_need, run_script, seed_list


def attainment_at_lags(cell_name: str, seed: int, lags: Sequence[float], trace: Path | None = None) -> dict[float, float]:
    """{lag: SLO attainment} of the oracle's counts asked for `lag` seconds into each minute, ungated."""
    cell = next(c for c in cells(trace) if c.name == cell_name)
    setup = cell_setup(cell, seed)
    _, need = oracle_need(setup)
    a = setup.cfg.autoscaling
    out = {}
    for lag in lags:
        res = run_script(setup, LaggedScript(need, lag, 0.0, 0.0), a, f"lag {lag:g} s")
        out[lag] = slo_attainment(res.requests, res.itl, setup.cfg.slo)
    return out


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cells", required=True, help="comma-separated suite cells (e.g. step/low,burst/high), or all")
    p.add_argument("--lags", default="0,6,12,20,30", help="seconds into each minute, comma-separated")
    p.add_argument("--seeds", default="0-9")
    p.add_argument("--tune-seeds", default="0-4")
    p.add_argument("--trace", type=Path, help=f"the shared {TRACE_NAME} (for the trace cells)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    lags = [float(x) for x in args.lags.split(",")]
    seeds, tune = seed_list(args.seeds), set(seed_list(args.tune_seeds))
    names = [c.name for c in cells(args.trace)] if args.cells == "all" else args.cells.split(",")
    out: dict[str, Any] = {"date": datetime.date.today().isoformat(),
                           "command": command_line("simulator.reaction_budget", argv), "lags_s": lags,
                           "seeds": {"tune": sorted(tune & set(seeds)), "report": [s for s in seeds if s not in tune]},
                           "cells": {}}
    for name in names:
        if next(c for c in cells(args.trace) if c.name == name).seeded:
            per_seed = {s: attainment_at_lags(name, s, lags, args.trace) for s in seeds}
        else:  # the shared trace ignores the seed: one run stands for every seed, as in the suite
            one = attainment_at_lags(name, seeds[0], lags, args.trace)
            per_seed = {s: one for s in seeds}
        rows = {}
        for lag in lags:
            med = {k: statistics.median([per_seed[s][lag] for s in group]) if group else None
                   for k, group in (("tune", [s for s in seeds if s in tune]), ("report", [s for s in seeds if s not in tune]))}
            rows[f"{lag:g}"] = {**med, "per_seed": {str(s): per_seed[s][lag] for s in seeds}}
            each = " ".join(f"{per_seed[s][lag]:.2f}" for s in seeds)
            print(f"{name:24s} lag {lag:4g} s  tune {_fmt(med['tune'])}  report {_fmt(med['report'])}  seeds {each}")
        out["cells"][name] = rows
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return out


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


if __name__ == "__main__":
    main()
