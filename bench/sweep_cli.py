"""`kvserve bench --sweep ...`: the sweep runs behind the bench command (cli/bench.py hands over)."""

from __future__ import annotations

import platform
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

SWEEPS = ("batch", "scenario")


def run_sweep(kind: str, batch_sizes: str, *, url: str, api_key: str | None, model_cfg, tokenizer: str | None,
              question_tokens: int, output_tokens: int, seed: int, json_out: Path | None, plot: Path | None,
              timeout: float, connect_timeout: float, slo: tuple[float, float], console: Console,
              base_cfg=None, address: str = "auto") -> None:
    from bench.batch_sweep import ROW_KEYS, parse_batches, plot_batch_sweep, run_batch_sweep, write_sweep
    from bench.prepare import load_tokenizer
    from bench.runner import ReplayOptions
    from bench.tokens import SafeVocab

    if kind not in SWEEPS:
        raise typer.BadParameter(f"--sweep: one of {', '.join(SWEEPS)}, got {kind!r}")
    if kind == "scenario":  # redeploys the cluster once per preset (bench/scenario_cli.py)
        from bench.scenario_cli import run_scenario

        return run_scenario(base_cfg, address=address, url=url, api_key=api_key, tokenizer=tokenizer, seed=seed,
                            json_out=json_out, timeout=timeout, connect_timeout=connect_timeout, console=console)
    try:
        batches = parse_batches(batch_sizes)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    vocab = SafeVocab(load_tokenizer(model_cfg, tokenizer))
    opts = ReplayOptions(base_url=url, model=model_cfg.name, api_key=api_key, concurrency=1, timeout_s=timeout,
                         connect_timeout_s=connect_timeout, slo_ttft_ms=slo[0], slo_itl_ms=slo[1])
    params = {"sweep": kind, "batches": batches, "question_tokens": question_tokens, "output_tokens": output_tokens,
              "seed": seed, "model": model_cfg.name, "date": time.strftime("%Y-%m-%d", time.gmtime()),
              "host": host_description(), "requests_per_point": "max(8, 4 x batch)"}
    table = Table(title=f"batch sweep: {question_tokens}-token prompts, {output_tokens} output tokens")
    for key in ROW_KEYS + ("errors",):
        table.add_column(key, justify="right")
    rows: list[dict] = []

    def on_point(row: dict) -> None:
        rows.append(row)
        console.print(f"batch {row['batch']}: {row['output_tok_per_s']:.1f} tok/s, TTFT p50 {row['ttft_p50_ms']:.0f} ms, "
                      f"ITL p50 {row['itl_p50_ms']:.1f} ms")
        if json_out:
            write_sweep(json_out, rows, params)  # after each point: a later failure loses nothing

    run_batch_sweep(opts, vocab, batches, question_tokens=question_tokens, output_tokens=output_tokens, seed=seed,
                    on_point=on_point)
    for r in rows:
        table.add_row(*(f"{r[k]:.1f}" if isinstance(r[k], float) else str(r[k]) for k in ROW_KEYS + ("errors",)))
    console.print(table)
    plot_path = plot or (json_out.with_suffix(".png") if json_out else None)
    if plot_path:
        plot_batch_sweep(rows, plot_path, title=f"{model_cfg.name}: throughput and latency vs batch")
        console.print(f"wrote {plot_path}")
    if json_out:
        console.print(f"wrote {json_out}")


def host_description() -> str:
    return f"{platform.machine()}, {_cpus()} CPUs"


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0
