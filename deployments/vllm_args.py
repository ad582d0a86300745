"""KVServeConfig -> vLLM's own CLI arguments, environment and parsed Namespace.

We go through vLLM's argument parser (not hand-built engine objects) so that its
defaults, validation and serving layer (`init_app_state`) behave exactly as in
`vllm serve`.
"""

from __future__ import annotations

import json
import os
from argparse import Namespace

from kvserve.config import KVServeConfig
from kvserve.model import resolve_model_path


def engine_cli_args(cfg: KVServeConfig, kv_events_endpoint: str | None = None) -> list[str]:
    e, m = cfg.engine, cfg.model
    args = [
        "--model", resolve_model_path(m),
        "--served-model-name", m.name,
        "--max-model-len", str(m.max_model_len),
        "--dtype", e.dtype,
        "--block-size", str(e.block_size),
        "--max-num-seqs", str(e.max_num_seqs),
        "--max-num-batched-tokens", str(max(e.max_num_batched_tokens, 16)),
        "--long-prefill-token-threshold", str(e.long_prefill_token_threshold),
        "--tensor-parallel-size", str(e.tensor_parallel_size),
        "--kv-cache-dtype", e.kv_cache_dtype,
        "--enable-prompt-tokens-details",  # usage.prompt_tokens_details.cached_tokens
        "--disable-uvicorn-access-log",
        # vLLM's RequestLogger writes prompts (at DEBUG); only the logging.prompts switch turns it on.
        "--enable-log-requests" if cfg.logging.prompts else "--no-enable-log-requests",
    ]
    if m.tokenizer:
        args += ["--tokenizer", resolve_model_path(m.tokenizer)]
    args.append("--enable-prefix-caching" if e.enable_prefix_caching else "--no-enable-prefix-caching")
    args.append("--enable-chunked-prefill" if e.enable_chunked_prefill else "--no-enable-chunked-prefill")
    if e.enforce_eager:
        args.append("--enforce-eager")
    if e.quantization:
        args += ["--quantization", e.quantization]
    if e.device == "gpu":
        args += ["--gpu-memory-utilization", str(e.gpu_memory_utilization)]
    if e.kv_cache_tokens:
        blocks = max(e.kv_cache_tokens // e.block_size, 1)
        args += ["--num-gpu-blocks-override", str(blocks)]
    if kv_events_endpoint:
        kv = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": kv_events_endpoint}
        args += ["--kv-events-config", json.dumps(kv)]
    for key, val in e.extra_args.items():
        flag = "--" + key.replace("_", "-")
        if val is True:
            args.append(flag)
        elif val is False or val is None:
            continue
        else:
            args += [flag, json.dumps(val) if isinstance(val, (dict, list)) else str(val)]
    return args


def engine_env(cfg: KVServeConfig) -> dict[str, str]:
    """Environment the engine process needs (set before vLLM is imported)."""
    env: dict[str, str] = {}
    if cfg.engine.device == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, int(round(cfg.engine.kv_cache_gib))))
    return env


def apply_engine_env(cfg: KVServeConfig, claim_cores: bool = False) -> None:
    """Set the engine env in this process. Only an engine process claims cores (not the ingress)."""
    env = engine_env(cfg)
    if cfg.engine.device == "cpu":
        bind = cfg.engine.omp_threads_bind
        if bind == "slot":
            from deployments.cpu_slots import omp_bind_value

            bind = omp_bind_value(bind, cfg.engine.cpus_per_replica) if claim_cores else "nobind"
        env["VLLM_CPU_OMP_THREADS_BIND"] = bind
    for k, v in env.items():
        os.environ[k] = v


def parse_vllm_args(argv: list[str]) -> Namespace:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
