"""`kvserve bench --sweep scenario`: redeploys the cluster with each preset (bench/scenario_sweep.py),
prints the rows and who wins each workload, and writes the JSON after every row."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table


def run_scenario(base_cfg, *, address: str, url: str, api_key: str | None, tokenizer: str | None, seed: int,
                 json_out: Path | None, timeout: float, connect_timeout: float, console: Console) -> None:
    from bench.batch_sweep import write_sweep
    from bench.cluster_check import verify
    from bench.prepare import load_tokenizer
    from bench.runner import ReplayOptions, default_deploy
    from bench.scenario_config import scenario_config
    from bench.scenario_sweep import plan, run_scenario_sweep, verdicts
    from bench.sweep_cli import host_description

    vocab_tok = load_tokenizer(base_cfg.model, tokenizer)
    from bench.tokens import SafeVocab

    vocab = SafeVocab(vocab_tok)
    opts = ReplayOptions(base_url=url, model=base_cfg.model.name, api_key=api_key, timeout_s=timeout,
                         connect_timeout_s=connect_timeout)
    redeploy = default_deploy(address, cold_engines=True)  # presets change engine flags: engines restart anyway
    params = {"sweep": "scenario", "seed": seed, "model": base_cfg.model.name, "device": base_cfg.engine.device,
              "replicas": base_cfg.num_replicas, "date": time.strftime("%Y-%m-%d", time.gmtime()),
              "host": host_description(), "plan": plan()}
    rows: list[dict] = []

    def deploy(preset: str) -> None:
        console.print(f"deploying scenario [bold]{preset}[/] (cold engines)...")
        cfg = scenario_config(base_cfg, preset)
        t = time.monotonic()
        redeploy(cfg)
        asyncio.run(verify(url, opts.headers, cfg.num_replicas, opts.ready_timeout_s, opts.replica_settle_s))
        console.print(f"  serving after {time.monotonic() - t:.0f} s")

    def on_row(row: dict) -> None:
        rows.append(row)
        console.print(f"  {row['workload']} on {row['preset']}: {row['output_tok_per_s'] or 0:.1f} tok/s, TTFT p90 "
                      f"{row['ttft_p90_ms'] or 0:.0f} ms, TPOT p50/p90 {row['tpot_p50_ms'] or 0:.0f}/"
                      f"{row['tpot_p90_ms'] or 0:.0f} ms, chats' longest gap {row['short_gap_max_ms'] or 0:.0f} ms, "
                      f"errors {row['errors']}")
        if json_out:
            write_sweep(json_out, rows, {**params, "verdicts": verdicts(rows)})

    try:
        run_scenario_sweep(opts, vocab, deploy, seed=seed, on_row=on_row)
    finally:
        console.print("redeploying the cluster's own config...")
        redeploy(base_cfg)
    table = Table(title="scenario sweep: each preset on its own workload, against a contrast preset")
    for col in ("workload", "owner", "contrast", "metric", "owner", "contrast", "owner's advantage"):
        table.add_column(col)
    for v in verdicts(rows):
        fmt = (lambda x: "-" if x is None else f"{x:.1f}")
        adv = v["owner_advantage"]
        table.add_row(v["workload"], v["owner"], v["contrast"], v["metric"], fmt(v["owner_value"]),
                      fmt(v["contrast_value"]), "-" if adv is None else f"{adv:.2f}x" + ("" if v["owner_wins"] else " (no win)"))
    console.print(table)
    if json_out:
        console.print(f"wrote {json_out}")
