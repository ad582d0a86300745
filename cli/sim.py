"""`kvserve sim`: replay a trace or a generated workload on N simulated replicas.

Routing mode (`--policies`) compares routers on a fixed replica count; autoscaling
mode (`--autoscalers`) compares autoscalers (routing with `--policy`) and the
oracle's replica-seconds. Both print a rich table and can write JSON and PNGs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvserve.config import load_config
from kvserve.perf_model import EngineProfile
from router.registry import policy_names

DEFAULT_SIM_MAX_REPLICAS = 8


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.0f}"
    return str(v)


def _table(title: str, rows: dict[str, dict[str, Any]], cols: list[str]):  # type: ignore[no-untyped-def]
    t = Table(title=title)
    t.add_column("name")
    for c in cols:
        t.add_column(c, justify="right")
    for name, row in rows.items():
        t.add_row(name, *(_fmt(row.get(c)) for c in cols))
    return t


def _minute_table(details: dict[str, dict[str, Any]]):  # type: ignore[no-untyped-def]
    """Minute | oracle | per autoscaler: mean replicas, with a cross where the SLO was missed."""
    names = list(details)
    longest = max((details[n]["per_minute"] for n in names), key=len, default=[])
    t = Table(title="replicas per minute (mean; x = SLO missed)")
    for c in ["minute", "oracle", *names]:
        t.add_column(c, justify="right")
    for m, row in enumerate(longest):
        cells = []
        for n in names:
            pm = details[n]["per_minute"]
            if m >= len(pm):
                cells.append("")
                continue
            miss = " x" if pm[m]["slo_met"] is False else ""
            cells.append(f"{pm[m]['replicas']:.2f}{miss}")
        t.add_row(str(m), _fmt(row["oracle_replicas"]), *cells)
    return t


def sim(
    trace: Optional[Path] = typer.Option(None, "--trace", help="Mooncake JSONL trace (timestamp ms, input_length, output_length, hash_ids of 512-token blocks)."),
    workload: str = typer.Option("multi-tenant", "--workload", help="Generated workload when no --trace: multi-tenant | step (1x->4x->1x) | burst (8x for 30 s mid-run) | diurnal (1x->5x->1x) | noisy-neighbour (4 victims at 60% of capacity + an aggressor at 10x a victim's rate, --phase-s long; flow control off / on / victims solo)."),
    replicas: int = typer.Option(16, "--replicas", min=1, help="Fixed replica count (routing mode)."),
    policies: Optional[str] = typer.Option(None, "--policies", help="Comma list of routing policies; default: every policy in router.registry."),
    autoscalers: Optional[str] = typer.Option(None, "--autoscalers", help="Comma list of autoscalers (autoscaling.registry): switches to autoscaling mode."),
    policy: str = typer.Option("kvserve", "--policy", help="Routing policy used in autoscaling mode."),
    profile: Optional[Path] = typer.Option(None, "--profile", help="Engine profile JSON (`kvserve profile`). Default: the packaged H200 / vLLM 0.24 / Llama-8B profile (kvserve/profiles)."),
    kv_blocks: Optional[int] = typer.Option(None, "--kv-blocks", min=1, help="KV capacity per replica in cache blocks (trace: 512-token blocks). Default for a trace: the trace's distinct blocks fill 70% of the cluster's cache (never below the largest request); otherwise the profile's kv_cache_tokens."),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs", help="Default: engine.max_num_seqs from config."),
    max_batched_tokens: Optional[int] = typer.Option(None, "--max-batched-tokens", help="Default: engine.max_num_batched_tokens from config."),
    long_prefill_tokens: Optional[int] = typer.Option(None, "--long-prefill-tokens", min=0, help="Per-request prefill cap per step (vLLM long_prefill_token_threshold). Default: engine.long_prefill_token_threshold from config."),
    engine_start_s: Optional[float] = typer.Option(None, "--engine-start-s", help="Start-up delay of a new replica. Default: the profile's engine_start_s (else 30)."),
    time_scale: float = typer.Option(1.0, "--time-scale", help="Trace: multiply arrival times (0.5 = twice the rate)."),
    tenants: int = typer.Option(32, "--tenants"),
    tenant_skew: str = typer.Option("zipf:1.1", "--tenant-skew", help="uniform | zipf:S"),
    system_tokens: int = typer.Option(2048, "--system-tokens"),
    question_tokens: int = typer.Option(256, "--question-tokens"),
    output_tokens: int = typer.Option(128, "--output-tokens"),
    rate: float = typer.Option(10.0, "--rate", help="Poisson arrivals/s (step/burst/diurnal: the 1x rate). One H200 replica at the default engine settings serves ~20/s of the default mix."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", help="multi-tenant: closed loop with this many in flight instead of --rate."),
    requests: Optional[int] = typer.Option(None, "--requests", help="multi-tenant: request count (default 2000); others: cap."),
    phase_s: float = typer.Option(180.0, "--phase-s", help="step: length of each of the 3 phases; burst/diurnal run 3x this."),
    min_replicas: Optional[int] = typer.Option(None, "--min-replicas", help="Default: autoscaling.min_replicas from config."),
    max_replicas: Optional[int] = typer.Option(None, "--max-replicas", help=f"Default: autoscaling.max_replicas from --config, else {DEFAULT_SIM_MAX_REPLICAS}."),
    decision_interval_s: float = typer.Option(1.0, "--decision-interval-s", help="How often the autoscaler is asked."),
    ttft_slo_ms: Optional[float] = typer.Option(None, "--ttft-slo-ms", help="Default: slo.ttft_p90_ms from config."),
    itl_slo_ms: Optional[float] = typer.Option(None, "--itl-slo-ms", help="Default: slo.itl_p90_ms from config."),
    partition_oracle: int = typer.Option(0, "--partition-oracle", min=0, help="Routing mode, multi-tenant: also simulate the N best-ranked static tenant splits (share within --partition-max-share; every split for 2 replicas and <= 20 tenants, else the best a seeded local search finds) and report the one with the lowest p90 TTFT as `partition_oracle` -- a hindsight bound for routers that keep each tenant on one replica."),
    partition_max_share: float = typer.Option(1.25, "--partition-max-share", min=1.0, help="Request share max/mean the partition oracle must keep."),
    config: Optional[Path] = typer.Option(None, "--config", help="kvserve YAML config (router, slo, autoscaling, engine sections)."),
    seed: int = typer.Option(0, "--seed"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write results as JSON."),
    requests_jsonl: Optional[Path] = typer.Option(None, "--requests-jsonl", help="Write one JSON line per simulated request, with the fields of `kvserve bench --requests-jsonl`."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="PNG path (default: next to --json)."),
    per_minute: bool = typer.Option(False, "--per-minute", help="Autoscaling mode: also print each minute's mean replicas per autoscaler against the oracle's, and which minutes missed the SLO (always in the JSON, under details.NAME.per_minute)."),
    suite: Optional[str] = typer.Option(None, "--suite", help="Run a workload suite instead (autoscaling: step, burst, diurnal, conversations, agentic, heavy-tailed prompts and the --trace, each at 2 load levels, against the oracle and the causal bound). Only --seeds, --tune-seeds, --trace, --jobs, --json apply."),
    seeds: str = typer.Option("0-9", "--seeds", help="--suite: seeds to run, e.g. 0-9."),
    tune_seeds: str = typer.Option("0-4", "--tune-seeds", help="--suite: the seeds tuned on; the others are the report seeds."),
    jobs: int = typer.Option(2, "--jobs", min=1, help="--suite: simulations in parallel."),
    only: Optional[str] = typer.Option(None, "--only", help="--suite: only workloads whose name starts with this."),
) -> None:
    """Simulate a cluster of replicas with the production routing/autoscaling policy code."""
    if suite is not None:
        from cli import sim_suite

        sim_suite.run(suite, seeds, tune_seeds, trace, jobs, json_out, only)
        return
    from simulator import plots
    from simulator.engine import EngineSettings
    from simulator.runner import (
        PACKAGED_PROFILE, TRACE_CACHE_FILL, SimSetup, add_partition_oracle, compare_autoscalers, compare_policies,
        default_kv_blocks, router_config_for,
    )
    from simulator.workloads import TenantMix, generated, load_trace
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # logs and CI: keep the comparison table's columns whole
    overrides: dict[str, Any] = {}
    if ttft_slo_ms is not None:
        overrides.setdefault("slo", {})["ttft_p90_ms"] = ttft_slo_ms
    if itl_slo_ms is not None:
        overrides.setdefault("slo", {})["itl_p90_ms"] = itl_slo_ms
    a_over: dict[str, Any] = {"enabled": True}
    if min_replicas is not None:
        a_over["min_replicas"] = min_replicas
    if max_replicas is not None:
        a_over["max_replicas"] = max_replicas
    elif config is None:
        a_over["max_replicas"] = DEFAULT_SIM_MAX_REPLICAS
    overrides["autoscaling"] = a_over
    cfg = load_config(config, overrides, environ={})
    prof_path = profile or PACKAGED_PROFILE
    prof_raw = json.loads(Path(prof_path).read_text())
    prof = EngineProfile.from_dict(prof_raw, source=str(prof_path))
    explicit = set((cfg.router.model_fields_set if config else set()))
    cfg = router_config_for(cfg, prof, explicit)

    if workload == "noisy-neighbour" and trace is None:
        from cli.noisy import sim_noisy
        from simulator.noisy_neighbour import NoisyMix

        engine = EngineSettings(
            block_size=prof.block_size, kv_blocks=kv_blocks or prof.kv_cache_tokens // prof.block_size,
            max_num_seqs=max_num_seqs or cfg.engine.max_num_seqs,
            max_batched_tokens=max_batched_tokens or cfg.engine.max_num_batched_tokens,
            long_prefill_tokens=cfg.engine.long_prefill_token_threshold if long_prefill_tokens is None else long_prefill_tokens)
        mix = NoisyMix(system_tokens, question_tokens, output_tokens, duration_s=phase_s)
        sim_noisy(SimSetup(None, prof, engine, cfg, replicas, seed), mix, json_out, console)  # type: ignore[arg-type]
        return
    if trace is not None:
        wl = load_trace(trace, time_scale=time_scale, max_requests=requests)
    else:
        mix = TenantMix(tenants, tenant_skew, system_tokens, question_tokens, output_tokens)
        wl = generated(workload, mix, prof.block_size, rate=rate, requests=requests, concurrency=concurrency, phase_s=phase_s, seed=seed)
    scaling_mode = bool(autoscalers)
    n_rep = cfg.autoscaling.max_replicas if scaling_mode else replicas
    kv = kv_blocks or default_kv_blocks(wl, n_rep, prof)
    engine = EngineSettings(
        block_size=wl.block_size,
        kv_blocks=kv,
        max_num_seqs=max_num_seqs or cfg.engine.max_num_seqs,
        max_batched_tokens=max_batched_tokens or cfg.engine.max_num_batched_tokens,
        long_prefill_tokens=cfg.engine.long_prefill_token_threshold if long_prefill_tokens is None else long_prefill_tokens,
        engines_per_device=cfg.engine.engines_per_device,
    )
    start_s = engine_start_s if engine_start_s is not None else float(prof_raw.get("engine_start_s", 30.0))
    setup = SimSetup(wl, prof, engine, cfg, replicas, seed, start_s, decision_interval_s)
    params = {
        **wl.params,
        "replicas": None if scaling_mode else replicas,
        "profile": Path(prof_path).name,
        "kv_blocks_per_replica": kv,
        "block_tokens": wl.block_size,
        "max_num_seqs": engine.max_num_seqs,
        "max_batched_tokens": engine.max_batched_tokens,
        "long_prefill_tokens": engine.long_prefill_tokens,
        "engines_per_device": engine.engines_per_device,
        "slo": cfg.slo.model_dump(),
        "seed": seed,
    }
    if trace is not None:
        params["cache_fill_of_cluster"] = wl.distinct_blocks() / (kv * n_rep)
        if kv_blocks is None and kv == wl.max_request_blocks() and params["cache_fill_of_cluster"] < TRACE_CACHE_FILL:
            # Many replicas: the 70% rule would make the largest request unrunnable, so the floor wins.
            console.print(
                f"KV capacity {kv} blocks per replica: the largest request's size (the 70%-fill rule gives less); "
                f"the trace fills {params['cache_fill_of_cluster']:.3f} of the cluster cache. Set --kv-blocks to override."
            )

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True) as bar:
        tasks: dict[str, int] = {}

        def progress(name: str, done: int, total: int) -> None:
            if name not in tasks:
                tasks[name] = bar.add_task(name, total=total)
            bar.update(tasks[name], completed=done)

        if scaling_mode:
            names = [s.strip() for s in autoscalers.split(",") if s.strip()]  # type: ignore[union-attr]
            out, results = compare_autoscalers(setup, names, policy, progress)
            params.update(min_replicas=cfg.autoscaling.min_replicas, max_replicas=cfg.autoscaling.max_replicas, engine_start_s=start_s, decision_interval_s=decision_interval_s)
        else:
            names = [s.strip() for s in policies.split(",") if s.strip()] if policies else policy_names()
            unknown = [n for n in names if n not in policy_names()]
            if unknown:
                raise typer.BadParameter(f"unknown policies {unknown}; known: {', '.join(policy_names())}", param_hint="--policies")
            out, results = compare_policies(setup, names, progress)
            if partition_oracle:
                try:
                    add_partition_oracle(setup, out, results, partition_oracle, partition_max_share)
                except ValueError as exc:
                    raise typer.BadParameter(str(exc), param_hint="--partition-oracle") from exc
    out["workload"] = params

    if scaling_mode:
        cols = ["slo_attainment", "replica_seconds", "oracle_replica_seconds", "replica_seconds_over_oracle", "failed_requests", "overloaded_503", "ttft_p90_ms", "itl_p90_ms", "max_replicas_seen", "scaleup_ttft_p50_ms", "scaleup_ttft_p90_ms"]
        rows = {n: {**out["autoscalers"][n], **out["details"][n]} for n in out["autoscalers"]}
        console.print(_table(f"autoscalers on {wl.name} (routing: {policy})", rows, cols))
        if per_minute:
            console.print(_minute_table(out["details"]))
    else:
        cols = ["ttft_p50_ms", "ttft_p90_ms", "ttft_p90_lower_bound_ms", "itl_p90_ms", "e2e_p90_ms", "prefix_hit_rate", "oracle_hit_rate", "infinite_hit_rate", "share_max_over_mean", "slo_attainment", "replica_seconds"]
        rows = {n: {**out["policies"][n], **out["details"][n]} for n in out["policies"]}
        console.print(_table(f"routing on {wl.name}, {replicas} replicas, {kv} KV blocks each", rows, cols))
    console.print(f"sim wall time {out['sim_wall_s']:.1f} s")

    if json_out is not None:
        json_out.write_text(json.dumps(out, indent=1) + "\n")
        console.print(f"wrote {json_out}")
    if requests_jsonl is not None:
        from bench.report import write_jsonl
        from simulator.metrics import request_rows

        write_jsonl(requests_jsonl, (row for name, res in results.items() for row in request_rows(name, res.requests)))
        console.print(f"wrote {requests_jsonl}")
    png = plot or (json_out.with_suffix(".png") if json_out is not None else None)
    if png is not None:
        if scaling_mode:
            need = max((d["per_minute"] for d in out["details"].values()), key=len, default=[])
            plots.autoscaling_timeline(results, png, cfg.slo.ttft_p90_ms, f"{wl.name}: replicas, TTFT p90, load",
                                       [r["oracle_replicas"] for r in need if r["oracle_replicas"] is not None])
        else:
            plots.ttft_cdf(results, png, f"{wl.name}, {replicas} replicas: TTFT CDF")
        console.print(f"wrote {png}")


def register(app: typer.Typer) -> None:
    app.command("sim")(sim)
