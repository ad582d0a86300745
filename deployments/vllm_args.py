"""KVServeConfig -> vLLM's own CLI arguments, environment and parsed Namespace.

We go through vLLM's argument parser (not hand-built engine objects) so that its
defaults, validation and serving layer (`init_app_state`) behave exactly as in
`vllm serve`.
"""

from __future__ import annotations

import json
import logging
import os
from argparse import Namespace
from pathlib import Path

import kvserve
from deployments import vllm_compat
from deployments.cpu_slots import omp_bind_value
from kvserve import model_footprint
from kvserve.config import EngineConfig, KVServeConfig
from kvserve.model import resolve_model_path

log = logging.getLogger("kvserve.vllm_args")
TEMPLATES_DIR = Path(kvserve.__file__).resolve().parent / "templates"  # chat templates shipped with kvserve



def engine_cli_args(cfg: KVServeConfig, kv_events_endpoint: str | None = None,
                    device_memory_bytes: int | None = None) -> list[str]:
    """`device_memory_bytes`: the GPU's total memory, for a replica on a GPU share (see share_kv_cache_bytes)."""
    e, m = cfg.engine, cfg.model
    max_len, quantization = checkpoint_fit(cfg)
    args = [
        "--model", resolve_model_path(m),
        "--served-model-name", m.name,
        "--max-model-len", str(max_len),
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
    if quantization:
        args += ["--quantization", quantization]
    spec = speculative_config(e)
    if spec:
        args += ["--speculative-config", json.dumps(spec)]
    if e.device == "gpu":
        args += ["--gpu-memory-utilization", vllm_gpu_memory_utilization(e)]
    if e.kv_cache_tokens:
        blocks = max(e.kv_cache_tokens // e.block_size, 1)
        args += ["--num-gpu-blocks-override", str(blocks)]
    if e.chat_template:
        args += ["--chat-template", resolve_chat_template(e.chat_template)]
    if e.tool_call_parser:
        args += ["--tool-call-parser", e.tool_call_parser]
    if e.enable_auto_tool_choice:
        args.append("--enable-auto-tool-choice")
    if e.reasoning_parser:
        args += ["--reasoning-parser", e.reasoning_parser]
    if kv_events_endpoint:
        kv = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": kv_events_endpoint}
        args += ["--kv-events-config", json.dumps(kv)]
    kv_bytes = share_kv_cache_bytes(cfg, device_memory_bytes)
    if kv_bytes is not None:
        args += ["--kv-cache-memory-bytes", str(kv_bytes)]
    for key, val in e.extra_args.items():
        flag = "--" + key.replace("_", "-")
        if val is True:
            args.append(flag)
        elif val is False or val is None:
            continue
        else:
            args += [flag, json.dumps(val) if isinstance(val, (dict, list)) else str(val)]
    return args


def speculative_config(e: EngineConfig) -> dict | None:
    """vLLM's speculative_config: a draft (or EAGLE) model when given, else n-gram prompt lookup."""
    if e.speculative_decoding == "off":
        return None
    if e.draft_model:  # vLLM tells a draft model from an EAGLE head by the checkpoint's name and config
        return {"model": resolve_model_path(e.draft_model), "num_speculative_tokens": e.num_speculative_tokens}
    return {"method": "ngram", "num_speculative_tokens": e.num_speculative_tokens,
            "prompt_lookup_min": 2, "prompt_lookup_max": 5}


def checkpoint_fit(cfg: KVServeConfig) -> tuple[int, str | None]:
    """(max_model_len, quantization) for vLLM: a scenario preset's values, fitted to the checkpoint.

    A preset's context is capped at the checkpoint's own (vLLM refuses a longer one), and its fp8
    weight quantization gives way to a pre-quantized checkpoint's method (vLLM refuses the mix).
    Explicit values and configs without a scenario pass through untouched."""
    from kvserve.scenarios import checkpoint_quantization, preset_value

    e, m = cfg.engine, cfg.model
    max_len, quant = m.max_model_len, e.quantization
    if not e.scenario:
        return max_len, quant
    from_len = max_len == preset_value(e.scenario, e.device, "model.max_model_len")
    from_quant = quant is not None and quant == preset_value(e.scenario, e.device, "engine.quantization")
    if not (from_len or from_quant):
        return max_len, quant
    hf = _checkpoint_config(m)
    if hf is None:
        return max_len, quant
    own = hf.get("max_position_embeddings")
    if from_len and isinstance(own, int) and own < max_len:
        log.info("scenario %s: context %d capped at the checkpoint's %d", e.scenario, max_len, own)
        max_len = own
    method = checkpoint_quantization(hf)
    if from_quant and method:
        log.info("scenario %s: the checkpoint is pre-quantized (%s): vLLM loads its own", e.scenario, method)
        quant = None
    return max_len, quant


def _checkpoint_config(m) -> dict | None:
    from kvserve.model_footprint import local_model_dir

    model_dir = local_model_dir(resolve_model_path(m))
    if model_dir is None:
        return None
    try:
        return json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None


def vllm_gpu_memory_utilization(e: EngineConfig) -> str:
    """vLLM's gpu_memory_utilization is a fraction of the whole device, and at start it refuses to
    run unless that much is free: a replica on a share asks for its share of it."""
    share = e.gpu_share
    return str(e.gpu_memory_utilization if share >= 1 else round(share * e.gpu_memory_utilization, 4))


def needs_device_memory(cfg: KVServeConfig) -> bool:
    e = cfg.engine
    return e.device == "gpu" and e.gpu_share < 1 and "kv_cache_memory_bytes" not in e.extra_args


def gpu_device_memory(cfg: KVServeConfig) -> int | None:
    """This process's GPU's total memory when the config's KV budget depends on it, else None."""
    if not needs_device_memory(cfg):
        return None

    return vllm_compat.device_total_memory()


def share_kv_cache_bytes(cfg: KVServeConfig, device_memory_bytes: int | None) -> int | None:
    """vLLM's kv_cache_memory_bytes for a replica on a GPU share (None: leave it to vLLM).

    vLLM sizes its cache by profiling free memory on the whole device, where other replicas'
    weights look like its own use. On a share we size it: the share's KV budget, or exactly
    engine.kv_cache_tokens when set (its block-count override wins either way); an explicit
    extra_args.kv_cache_memory_bytes is passed through untouched."""
    if device_memory_bytes is None or not needs_device_memory(cfg):
        return None

    model_dir = model_footprint.local_model_dir(resolve_model_path(cfg.model))
    if model_dir is None:
        log.warning("no config.json for %s: vLLM sizes the KV cache itself, counting other replicas on this "
                    "GPU; set engine.extra_args.kv_cache_memory_bytes", cfg.model.source)
        return None
    if cfg.engine.kv_cache_tokens:
        return model_footprint.kv_bytes_for_tokens(cfg, model_dir, cfg.engine.kv_cache_tokens)
    budget = model_footprint.replica_kv_budget(cfg, device_memory_bytes, model_dir)
    log.info("KV cache from the GPU share: %s", budget.describe())
    return budget.kv_bytes


def resolve_chat_template(value: str) -> str:
    """A template shipped with kvserve by name (`chatml-tools`), else the file or inline template as given."""
    shipped = TEMPLATES_DIR / f"{value}.jinja"
    return str(shipped) if "/" not in value and shipped.is_file() else value


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
            bind = omp_bind_value(bind, cfg.engine.cpus_per_replica) if claim_cores else "nobind"
        env["VLLM_CPU_OMP_THREADS_BIND"] = bind
    for k, v in env.items():
        os.environ[k] = v


def parse_vllm_args(argv: list[str]) -> Namespace:
    return vllm_compat.parse_args(argv)
