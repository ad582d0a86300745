"""`kvserve profile`: measure one live engine and write the profile the simulator, the router's
cost model and the autoscaler's capacity model all read (kvserve.perf_model.EngineProfile).

Measures, on the configured engine (same vLLM args as a replica):
  prefill: TTFT vs prompt tokens and cached fraction (prefix warmed first), median of N
  decode:  inter-token latency vs running batch size at two context lengths
  kv_cache_tokens: the engine's KV capacity
"""

from __future__ import annotations

import asyncio
import platform
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import date

from deployments.vllm_args import apply_engine_env, engine_cli_args, gpu_device_memory, parse_vllm_args
from deployments.vllm_compat import get, vllm_version
from kvserve.config import KVServeConfig
from kvserve.perf_model import fit_cached_token_ms


def _tokens(n: int, seed: int) -> list[int]:
    # Ordinary vocabulary ids (well inside the vocab), distinct per seed so prefixes never collide.
    return [1000 + (seed * 7919 + i * 104729) % 20000 for i in range(n)]


async def _one(engine, prompt: list[int], max_tokens: int, ignore_eos: bool = True) -> tuple[float, float, int]:
    """(ttft_s, e2e_s, output_tokens) of one request."""
    params = get("SamplingParams")(max_tokens=max_tokens, temperature=0.0, ignore_eos=ignore_eos)
    start = time.perf_counter()
    ttft = None
    out = 0
    async for o in engine.generate({"prompt_token_ids": prompt}, params, uuid.uuid4().hex):
        if ttft is None:
            ttft = time.perf_counter() - start
        out = len(o.outputs[0].token_ids)
    return ttft or 0.0, time.perf_counter() - start, out


async def _profile(cfg: KVServeConfig, prompt_sizes: list[int], fractions: list[float], batches: list[int],
                   contexts: list[int], reps: int, say: Callable[[str], None]) -> dict:
    AsyncEngineArgs, AsyncLLM = get("AsyncEngineArgs"), get("AsyncLLM")

    apply_engine_env(cfg, claim_cores=True)
    args = parse_vllm_args(engine_cli_args(cfg, device_memory_bytes=gpu_device_memory(cfg)))
    t0 = time.perf_counter()
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs.from_cli_args(args))
    await _one(engine, _tokens(64, 999), 2)  # warm-up
    start_s = time.perf_counter() - t0
    cc = engine.vllm_config.cache_config
    kv_tokens = int(cc.num_gpu_blocks * cc.block_size)
    seed = 0
    prefill = []
    for n in prompt_sizes:
        for frac in fractions:
            samples = []
            for _ in range(reps):
                seed += 1
                prompt = _tokens(n, seed)
                cached = int(n * frac) // cc.block_size * cc.block_size
                if cached:
                    await _one(engine, prompt[:cached], 1)  # puts the prefix in the cache
                ttft, _, _ = await _one(engine, prompt, 1)
                samples.append(ttft * 1000)
            prefill.append({"prompt_tokens": n, "cached_fraction": frac, "ttft_ms": round(statistics.median(samples), 3)})
            say(f"prefill {n} tokens, {frac:.0%} cached: {prefill[-1]['ttft_ms']:.1f} ms")
    decode = []
    gen = 32
    for ctx in contexts:
        for b in batches:
            seed += 1
            shared = _tokens(ctx - 8, seed)
            await _one(engine, shared + _tokens(8, seed + 50_000), 1)  # cache the context once
            prompts = [shared + _tokens(8, seed * 1000 + i) for i in range(b)]
            results = await asyncio.gather(*(_one(engine, p, gen) for p in prompts))
            itls = [(e2e - ttft) / max(out - 1, 1) * 1000 for ttft, e2e, out in results]
            itl = statistics.median(itls)
            decode.append({"context_tokens": ctx, "batch": b, "itl_ms": round(itl, 3),
                           "decode_tok_per_s": round(b * 1000 / itl, 1)})
            say(f"decode ctx {ctx}, batch {b}: {itl:.1f} ms/token")
    engine.shutdown()
    return {
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "engine": _vllm_version(),
        "model": cfg.model.source,
        "settings": {"dtype": cfg.engine.dtype, "device": cfg.engine.device, "enforce_eager": cfg.engine.enforce_eager,
                     "max_num_seqs": cfg.engine.max_num_seqs, "max_num_batched_tokens": cfg.engine.max_num_batched_tokens,
                     "cpus_per_replica": cfg.engine.cpus_per_replica, "reps": reps},
        "date": date.today().isoformat(),
        "engine_start_s": round(start_s, 1),
        "block_size": int(cc.block_size),
        "kv_cache_tokens": kv_tokens,
        "prefill": prefill,
        "prefill_ms_per_cached_token": round(fit_cached_token_ms(prefill), 5),
        "decode": decode,
    }


def _vllm_version() -> str:
    return f"vllm {vllm_version()}"


def run_profile(cfg: KVServeConfig, prompt_sizes: list[int], fractions: list[float], batches: list[int],
                contexts: list[int], reps: int = 3, say: Callable[[str], None] = print) -> dict:
    return asyncio.run(_profile(cfg, prompt_sizes, fractions, batches, contexts, reps, say))
