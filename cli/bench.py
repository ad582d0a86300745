"""`kvserve bench`: live load generator and policy A/B harness (typer command)."""

from __future__ import annotations

import asyncio
import json
import logging
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kvserve.config import KVServeConfig, ModelConfig, SLOConfig, load_config

console = Console()


class WorkloadKind(str, Enum):
    multi_tenant = "multi-tenant"
    trace = "trace"
    noisy_neighbour = "noisy-neighbour"


def _cluster_config(url: str, headers: dict, config_file: Optional[Path], need_full: bool):
    """(model section, SLO section, full KVServeConfig or None, replicas expected or None): from --config,
    else the server's /kvserve/config. Expected replicas: the configured count (None when autoscaled)."""
    from bench.server_stats import fetch_config_sync

    if config_file is not None:
        cfg = load_config(config_file)
        return cfg.model, cfg.slo, cfg, _expected_replicas(cfg.num_replicas, cfg.autoscaling.enabled)
    raw = fetch_config_sync(url, headers)
    model = ModelConfig.model_validate(raw.get("model", {}))
    slo = SLOConfig.model_validate(raw.get("slo", {}))
    expected = _expected_replicas(raw.get("num_replicas"), (raw.get("autoscaling") or {}).get("enabled", False))
    if not need_full:
        return model, slo, None, expected
    try:
        return model, slo, KVServeConfig.model_validate(raw), expected
    except Exception as e:  # redacted secrets may not validate
        raise typer.BadParameter(
            f"cannot rebuild the cluster config from {url}/kvserve/config ({e}); pass --config FILE"
        ) from None


def _cluster_config_or_none(url: str, headers: dict, config_file: Optional[Path]) -> KVServeConfig | None:
    """The full config for per-tenant targets, or None when the server's copy does not validate (redacted keys)."""
    try:
        return _cluster_config(url, headers, config_file, need_full=True)[2]
    except Exception:  # unreachable or redacted: every tenant then gets the cluster's targets
        return None


def _expected_replicas(num_replicas: int | None, autoscaled: bool) -> int | None:
    return None if autoscaled or num_replicas is None else int(num_replicas)


def bench(
    ctx: typer.Context,
    workload: WorkloadKind = typer.Option(WorkloadKind.multi_tenant, "--workload", help="multi-tenant, trace, or noisy-neighbour (4 victims at 60% of the measured capacity + an aggressor at 10x a victim's rate; redeploys victims solo, flow control off, on; --duration is each run's length)."),
    trace_file: Optional[Path] = typer.Option(None, "--trace-file", help="Mooncake JSONL trace (--workload trace)."),
    url: str = typer.Option("http://127.0.0.1:8000", "--url", help="The kvserve endpoint."),
    allow_remote: bool = typer.Option(False, "--allow-remote", help="Permit a non-loopback --url."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="KVSERVE_API_KEY", help="Bearer key."),
    tenants: int = typer.Option(16, "--tenants", min=1),
    tenant_skew: str = typer.Option("uniform", "--tenant-skew", help="uniform or zipf:S (tenant popularity)."),
    system_tokens: int = typer.Option(1000, "--system-tokens", min=0),
    question_tokens: int = typer.Option(30, "--question-tokens", min=1),
    output_tokens: int = typer.Option(16, "--output-tokens", min=1, help="max_tokens (exact; ignore_eos). Trace: cap."),
    requests: int = typer.Option(300, "--requests", min=1),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", min=1, help="Closed loop with C in flight."),
    rate: Optional[float] = typer.Option(None, "--rate", min=0.0, help="Open loop: Poisson arrivals per second."),
    load_shape: Optional[str] = typer.Option(None, "--load-shape", help="step:1,4,1 multiplies --rate per step."),
    step_seconds: Optional[float] = typer.Option(None, "--step-seconds", help="Length of each step of --load-shape."),
    seed: int = typer.Option(0, "--seed"),
    length_scale: float = typer.Option(1.0, "--length-scale", help="Trace: prompt lengths × this (0.02 fits 2k ctx)."),
    time_scale: float = typer.Option(1.0, "--time-scale", help="Trace: arrival times × this."),
    max_requests: Optional[int] = typer.Option(None, "--max-requests", help="Trace: first N rows only."),
    policies: Optional[str] = typer.Option(None, "--policies", help="Redeploy and replay per policy: pow2,kvserve"),
    kv_cache_tokens: Optional[int] = typer.Option(None, "--kv-cache-tokens", help="Redeploy with this KV capacity."),
    config_file: Optional[Path] = typer.Option(None, "--config", help="Base config for redeploys (default: server's)."),
    address: str = typer.Option("auto", "--address", help="Ray cluster address for redeploys."),
    cold_engines: bool = typer.Option(False, "--cold-engines", help="Restart every engine per policy (default: keep the engines, empty their prefix caches)."),
    warmup: int = typer.Option(2, "--warmup", min=0, help="Unrelated requests per policy, excluded from stats."),
    timeout: float = typer.Option(120.0, "--timeout", help="Per-request limit in seconds."),
    ready_timeout: float = typer.Option(900.0, "--ready-timeout", min=0.0, help="Wait this long for every configured replica to serve (/ready) before measuring."),
    connect_timeout: float = typer.Option(30.0, "--connect-timeout", min=0.1, help="TCP connect limit in seconds (measured by the bench's own event loop, which a saturated machine can starve)."),
    max_inflight: int = typer.Option(256, "--max-inflight", min=1, help="Open loop: cap on outstanding requests."),
    slo_ttft_ms: Optional[float] = typer.Option(None, "--slo-ttft-ms", help="Goodput TTFT SLO (default: config slo)."),
    slo_itl_ms: Optional[float] = typer.Option(None, "--slo-itl-ms", help="Goodput ITL SLO (default: config slo)."),
    token_ids: bool = typer.Option(False, "--token-ids", help="Send prompts as token-id lists, not text."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="Tokenizer path/id (default: the model's)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the results JSON here."),
    requests_jsonl: Optional[Path] = typer.Option(None, "--requests-jsonl", help="Write one JSON line per measured request (policy, tenant, replica, sent_s, ttft_ms, cached_tokens, ...)."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="TTFT CDF PNG (default: next to --json)."),
    timeline: Optional[Path] = typer.Option(None, "--timeline", help="Per-second load/TTFT/replicas JSON (+ PNG)."),
    duration: Optional[str] = typer.Option(None, "--duration", help="Timed open-loop run at --rate (30m, 180s): a soak sampling every Serve process's RSS and fds, or with --chaos a fault scenario (bench.timed_bench)."),
    chaos_kind: Optional[str] = typer.Option(None, "--chaos", help="kill-engine, kill-replica or restart-ingress, at --chaos-at (needs --duration; run it on the cluster's head machine)."),
    chaos_at: Optional[float] = typer.Option(None, "--chaos-at", help="Seconds into the run to inject the fault (default: half-way)."),
    window: float = typer.Option(60.0, "--window", help="Chaos: hit rate compared over this many seconds before and after the fault."),
    sample_s: float = typer.Option(10.0, "--sample-s", help="Soak: seconds between process samples."),
    sweep: Optional[str] = typer.Option(None, "--sweep", help="batch: closed-loop batches of each --batch size "
                                        "(throughput and latency vs batch; bench/batch_sweep.py). scenario: "
                                        "redeploys each scenario preset and runs the workload it is for "
                                        "(bench/scenario_sweep.py)."),
    batch_sizes: str = typer.Option("1,4,8,16,32", "--batch", help="--sweep batch: the batch sizes."),
) -> None:
    """Replay a seeded workload against the live endpoint; compare routing policies side by side."""
    if ctx.invoked_subcommand:
        return  # `kvserve bench micro`: the subcommand runs alone
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request would bury the table
    import httpx

    from bench.client import auth_headers, is_loopback_url
    from bench.cluster_check import ClusterMismatch, wait_ready
    from bench.plots import plot_timeline, plot_ttft_cdf
    from bench.loop_lag import STARVED_MS
    from bench.report import comparison_table, tenant_table, ttft_breakdown_table, write_json, write_requests_jsonl
    from bench.runner import ReplayOptions, default_deploy, run_policies
    from bench.tenant_slo import key_tenant, targets_of
    from kvserve.policy_params import SLOTargets
    from bench.prepare import LoadSpec, apply_load, build_workload, load_tokenizer, parse_policies, warmup_requests
    from bench.timeline import timeline_json

    url = url.rstrip("/")
    if not allow_remote and not is_loopback_url(url):
        raise typer.BadParameter(f"{url} is not a loopback address; pass --allow-remote to load it")
    try:
        policy_list = parse_policies(policies)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    redeploy = policy_list != [None] or kv_cache_tokens is not None
    headers = auth_headers(api_key)
    from bench.timed_bench import check_options, requests_for

    try:
        if workload == WorkloadKind.noisy_neighbour:  # --duration: each of its runs' length, no --rate
            from bench.timed_load import parse_duration

            duration_s = parse_duration(duration) if duration else None
        else:
            duration_s = check_options(duration, chaos_kind, rate)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    if duration_s is not None and workload != WorkloadKind.noisy_neighbour:
        requests = requests_for(rate, duration_s)

    async def _ready() -> None:  # the config is read only from a cluster whose replicas all serve
        async with httpx.AsyncClient() as client:
            await wait_ready(client, url, headers, ready_timeout)

    try:
        with console.status("waiting until every configured replica serves (/ready)..."):
            asyncio.run(_ready())
    except ClusterMismatch as e:
        console.print(f"[red]not measuring: {e}[/]")
        raise typer.Exit(2) from None
    model_cfg, slo_cfg, full_cfg, expected_replicas = _cluster_config(url, headers, config_file, need_full=redeploy or sweep == "scenario")
    slo_ttft_ms = slo_ttft_ms if slo_ttft_ms is not None else slo_cfg.ttft_p90_ms
    slo_itl_ms = slo_itl_ms if slo_itl_ms is not None else slo_cfg.itl_p90_ms
    if sweep is not None:
        from bench.sweep_cli import run_sweep

        return run_sweep(sweep, batch_sizes, url=url, api_key=api_key, model_cfg=model_cfg, tokenizer=tokenizer,
                         question_tokens=question_tokens, output_tokens=output_tokens, seed=seed, json_out=json_out,
                         plot=plot, timeout=timeout, connect_timeout=connect_timeout, slo=(slo_ttft_ms, slo_itl_ms),
                         console=console, base_cfg=full_cfg, address=address)

    if workload == WorkloadKind.noisy_neighbour:
        from bench.noisy_neighbour import NoisyOptions
        from bench.tokens import SafeVocab
        from cli.noisy import bench_noisy

        _, _, noisy_cfg, _ = _cluster_config(url, headers, config_file, need_full=True)
        opts = NoisyOptions(system_tokens, question_tokens, output_tokens, duration_s or 45.0, timeout_s=timeout, seed=seed)
        bench_noisy(noisy_cfg, url, SafeVocab(load_tokenizer(model_cfg, tokenizer)), opts, address, json_out, console)
        return
    with console.status("building workload (tokenizer)..."):
        tok = load_tokenizer(model_cfg, tokenizer)
        try:
            wl, vocab = build_workload(
                workload.value, tok, seed=seed, tenants=tenants, tenant_skew=tenant_skew,
                system_tokens=system_tokens, question_tokens=question_tokens, output_tokens=output_tokens,
                requests=requests, trace_file=str(trace_file) if trace_file else None,
                length_scale=length_scale, time_scale=time_scale, max_requests=max_requests,
                max_model_len=model_cfg.max_model_len,
            )
            load = LoadSpec(concurrency, rate, load_shape, step_seconds)
            wl = apply_load(wl, load, seed)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
    warm = warmup_requests(vocab, warmup, output_tokens, seed).requests if warmup else []
    params = {**wl.params, **load.describe(), "requests": len(wl.requests), "warmup_requests_excluded": len(warm),
              "kv_cache_tokens": kv_cache_tokens, "slo_ttft_ms": slo_ttft_ms, "slo_itl_ms": slo_itl_ms,
              "prompt_format": "token_ids" if token_ids else "text"}
    console.print(f"[bold]workload[/]: {json.dumps(params)}")
    if duration_s is not None:
        from bench.timed_bench import TimedOptions, app_name, run_timed

        timed = TimedOptions(url=url, headers=headers, model=model_cfg.name, app_name=app_name(url, headers, config_file),
                             rate=rate, duration_s=duration_s, chaos=chaos_kind, chaos_at_s=chaos_at, window_s=window,
                             sample_s=sample_s, timeout_s=timeout, max_inflight=max_inflight, use_token_ids=token_ids)
        raise typer.Exit(0 if run_timed(timed, wl.requests, json_out, params, console) else 1)

    opts = ReplayOptions(
        base_url=url, model=model_cfg.name, api_key=api_key, concurrency=concurrency, timeout_s=timeout,
        connect_timeout_s=connect_timeout,
        max_inflight=max_inflight, use_token_ids=token_ids, slo_ttft_ms=slo_ttft_ms, slo_itl_ms=slo_itl_ms,
        sample_stats=timeline is not None, ready_timeout_s=ready_timeout,
    )

    tenant_cfg = full_cfg or _cluster_config_or_none(url, headers, config_file)
    targets = targets_of(tenant_cfg.tenants if tenant_cfg else None, SLOTargets(slo_ttft_ms, slo_itl_ms))
    sender = key_tenant(tenant_cfg, api_key)

    def write_results(done: list) -> None:  # after every policy: a later failure loses nothing measured
        if json_out:
            write_json(json_out, done, params, targets, sender)
        if requests_jsonl:
            write_requests_jsonl(requests_jsonl, done)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("errors {task.fields[errors]}"))
    with Progress(*columns, console=console) as progress:
        state: dict = {}

        def on_start(name: str) -> None:
            state["task"] = progress.add_task(name, total=len(wl.requests), errors=0)
            state["errors"] = 0

        def on_result(res) -> None:
            state["errors"] += 0 if res.ok else 1
            progress.update(state["task"], advance=1, errors=state["errors"])

        try:
            runs = run_policies(
                opts, wl.requests, policy_list, base_cfg=full_cfg, kv_cache_tokens=kv_cache_tokens,
                deploy=default_deploy(address, cold_engines) if redeploy else None, warmup=warm, on_start=on_start,
                on_result=on_result, on_done=write_results, expected_replicas=expected_replicas,
            )
        except ClusterMismatch as e:
            console.print(f"[red]not measuring: {e}[/]")
            if json_out and json_out.exists():
                console.print(f"the policies measured before this one are in {json_out}")
            raise typer.Exit(2) from None

    console.print(comparison_table(runs, title=f"kvserve bench — {wl.name}, {len(wl.requests)} requests"))
    for extra in (ttft_breakdown_table(runs), tenant_table(runs, targets, sender)):
        if extra is not None:
            console.print(extra)
    for run in runs:
        m = run.metrics
        if m.errors:
            console.print(f"[red]{run.policy}: {m.errors} errors {m.errors_by_kind}[/]")
        if (m.client_loop_lag_max_ms or 0.0) >= STARVED_MS:
            console.print(f"[yellow]{run.policy}: the bench's event loop ran up to {m.client_loop_lag_max_ms / 1000:.1f} s "
                          f"late (p99 {m.client_loop_lag_p99_ms:.0f} ms): it waited for a CPU, and its latencies include "
                          "that wait[/]")
        if run.late_arrivals:
            console.print(f"[yellow]{run.policy}: {run.late_arrivals} arrivals waited for --max-inflight[/]")
    for path in (json_out, requests_jsonl):
        if path:
            console.print(f"wrote {path}")
    plot_path = plot or (json_out.with_suffix(".ttft_cdf.png") if json_out else None)
    if plot_path:
        plot_ttft_cdf(runs, plot_path, title=f"TTFT CDF — {wl.name}")
        console.print(f"wrote {plot_path}")
    if timeline:
        timeline.parent.mkdir(parents=True, exist_ok=True)
        timeline.write_text(json.dumps({"runs": [timeline_json(r.timeline, r.policy) for r in runs]}, indent=1))
        for run in runs:
            png = timeline.with_suffix(".png" if len(runs) == 1 else f".{run.policy}.png")
            plot_timeline(run.timeline, png, title=f"{run.policy}: load, TTFT p90, replicas")
        console.print(f"wrote {timeline}")


def register(app: typer.Typer) -> None:
    from cli.bench_overhead import overhead

    from bench.router_micro import main as micro

    group = typer.Typer(add_completion=False)
    group.callback(invoke_without_command=True)(bench)
    group.command("micro")(micro)
    app.add_typer(group, name="bench")
    app.command("bench-overhead")(overhead)

