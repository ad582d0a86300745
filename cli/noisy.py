"""`--workload noisy-neighbour` for `kvserve sim` and `kvserve bench`: the off / on / solo table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def _f(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if isinstance(v, float) else str(v)


def print_runs(console: Console, out: dict[str, Any], title: str) -> None:
    t = Table(title=title)
    for c in ("run", "tenant", "ttft_p50_ms", "ttft_p90_ms", "output_tok_per_s", "429", "503", "errors"):
        t.add_column(c, justify="right" if c not in ("run", "tenant") else "left")
    for run, r in out["runs"].items():
        for name, row in r["tenants"].items():
            t.add_row(run, name, _f(row["ttft_p50_ms"]), _f(row["ttft_p90_ms"]), _f(row["output_tok_per_s"]),
                      str(row["status_429"]), str(row["status_503"]), str(row["errors"]))
        t.add_row(run, "[b]all[/b]", "", "", _f(r["output_tok_per_s"]), "", "", "",
                  end_section=True)
    console.print(t)
    for run, r in out["runs"].items():
        console.print(f"{run}: jain_fairness {r['jain_fairness']:.3f}" if r["jain_fairness"] is not None else run)
    for name, tgt in out.get("targets", {}).items():
        extra = ""
        if "lowest_possible_per_victim" in tgt:
            lows = [x for x in tgt["lowest_possible_per_victim"].values() if x is not None]
            extra = f" (no non-preemptive order gets below {max(lows):.2f})" if lows else ""
        value = tgt["value"]
        shown = f"{value:.3f}" if isinstance(value, float) else value
        console.print(f"target {name}: {shown} vs bound {tgt['bound']} -> {'met' if tgt['met'] else 'NOT met'}{extra}")


def sim_noisy(setup: Any, mix: Any, json_out: Path | None, console: Console) -> dict[str, Any]:
    from simulator.noisy_neighbour import noisy_neighbour

    out = noisy_neighbour(setup, mix)
    print_runs(console, out, f"noisy neighbour, {setup.replicas} simulated replicas, flow control off / on / victims solo")
    if json_out is not None:
        json_out.write_text(json.dumps(out, indent=1) + "\n")
        console.print(f"wrote {json_out}")
    return out


def bench_noisy(full_cfg: Any, url: str, vocab: Any, opts: Any, address: str, json_out: Path | None,
                console: Console) -> dict[str, Any]:
    """Live: redeploys the cluster three times (solo, off, on) with the bench's five tenant keys."""
    from bench.noisy_neighbour import run_noisy
    from bench.runner import default_deploy

    out = run_noisy(full_cfg, url, vocab, opts, default_deploy(address, cold_engines=True), console.print)
    print_runs(console, out, f"noisy neighbour, live, {full_cfg.num_replicas} replicas: flow control off / on / victims solo")
    if json_out is not None:
        json_out.write_text(json.dumps(out, indent=1) + "\n")
        console.print(f"wrote {json_out}")
    return out
