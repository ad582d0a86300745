"""Scenario presets: `engine.scenario` turns a serving goal into vLLM arguments and SLO defaults.

Each preset is a list of choices, one per config field, with the reason beside it. A preset fills
only the fields the config leaves unset (explicit fields win), and it adapts to the device: what a
CPU cannot do (fp8 KV cache, fp8 weights) is left at the safe value, and the reason says so.

Pure data and dict manipulation: no file or network access, no other kvserve imports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Scenario = Literal["realtime-chat", "offline-batch", "long-document", "edge"]
SCENARIOS: tuple[str, ...] = ("realtime-chat", "offline-batch", "long-document", "edge")
Device = Literal["cpu", "gpu"]

# What vLLM's CPU backend cannot be relied on for, so the CPU presets leave it off and say so.
CPU_NO_FP8 = ("CPU: kept auto, vLLM's CPU fp8 KV cache needs x86 AVX-512 or AMX (set fp8 explicitly on such a "
              "host); on AVX2 it refuses to start")
CPU_NO_QUANT = ("CPU: none chosen, vLLM's CPU backend has no fp8 weight kernels (a pre-quantized checkpoint still "
                "loads its own method)")


@dataclass(frozen=True)
class Choice:
    path: str  # "engine.max_num_seqs", "slo.ttft_p90_ms", ...
    value: Any
    reason: str


def _pick(device: Device, gpu: Any, cpu: Any) -> Any:
    return gpu if device == "gpu" else cpu


def _chat(d: Device) -> list[Choice]:
    return [
        Choice("engine.max_num_seqs", _pick(d, 128, 16),
               "batch width: every running sequence adds to each decode step, so a narrower batch keeps ITL low; "
               "chat trades peak throughput for it"),
        Choice("engine.max_num_batched_tokens", _pick(d, 2048, 512),
               "small step budget: a long prompt prefills over several steps, interleaved with decodes, so running "
               "chats' ITL stays flat"),
        Choice("engine.enable_chunked_prefill", True, "long prompts must not stall the decodes of running chats"),
        Choice("engine.long_prefill_token_threshold", _pick(d, 512, 256),
               "one cold long prompt takes at most this many tokens a step; short and cached prompts go through: "
               "tail TTFT"),
        Choice("engine.enable_prefix_caching", True, "each chat turn resends the conversation: its prefix is not "
               "recomputed"),
        Choice("engine.kv_cache_dtype", "auto", "full-precision KV: chat batches fit, fp8 would trade accuracy for "
               "memory chat does not need"),
        Choice("engine.speculative_decoding", "off", "free-form chat rarely repeats its prompt: n-gram drafts would "
               "mostly be rejected work"),
        Choice("slo.ttft_p90_ms", _pick(d, 300.0, 1000.0), "interactive: the first token must come fast"),
        Choice("slo.itl_p90_ms", _pick(d, 50.0, 150.0), "faster than reading speed"),
        Choice("autoscaling.headroom", 0.7, "plan replicas to 70% of capacity: the spare absorbs bursts before a new "
               "replica is up"),
    ]


def _batch(d: Device) -> list[Choice]:
    return [
        Choice("engine.max_num_seqs", _pick(d, 512, 64),
               "widest batch: decode is bound by memory bandwidth, so each extra sequence rides the same weight "
               "reads almost free; throughput grows with width until KV memory or compute saturates"),
        Choice("engine.max_num_batched_tokens", _pick(d, 16384, 4096),
               "big steps: prefills finish in fewer steps; no one waits on a single step's latency"),
        Choice("engine.enable_chunked_prefill", True, "keeps decodes and prefills in the same steps: the batch stays "
               "full"),
        Choice("engine.long_prefill_token_threshold", 0, "no per-request cap: no request's latency matters on its own"),
        Choice("engine.enable_prefix_caching", True, "batch lines usually share a system prompt or few-shot header"),
        Choice("engine.kv_cache_dtype", _pick(d, "fp8", "auto"),
               "fp8 halves the KV bytes per token: twice the sequences fit, so the batch can be wider"
               if d == "gpu" else CPU_NO_FP8),
        Choice("engine.speculative_decoding", "off", "at large batch decode is compute-bound: drafts cost verification "
               "compute a full batch does not have spare"),
        Choice("slo.ttft_p90_ms", _pick(d, 30000.0, 60000.0), "throughput job: a loose TTFT target, so the autoscaler "
               "and router do not spend replicas on latency"),
        Choice("slo.itl_p90_ms", _pick(d, 500.0, 2000.0), "throughput job: a loose ITL target"),
        Choice("autoscaling.headroom", 0.95, "run replicas near capacity: queueing is acceptable"),
    ]


def _long_doc(d: Device) -> list[Choice]:
    return [
        Choice("model.max_model_len", _pick(d, 32768, 8192),
               "room for a whole document plus the answer (capped at the checkpoint's own context when it is smaller)"),
        Choice("engine.max_num_seqs", _pick(d, 64, 8), "each sequence holds a long context in KV: fewer fit at once"),
        Choice("engine.max_num_batched_tokens", _pick(d, 8192, 2048), "large steps prefill a document in few steps"),
        Choice("engine.enable_chunked_prefill", True, "a document prefills in chunks, so other requests keep decoding"),
        Choice("engine.long_prefill_token_threshold", _pick(d, 2048, 512),
               "a document takes at most this many tokens a step: follow-up questions (cached) are not stuck behind "
               "it"),
        Choice("engine.enable_prefix_caching", True, "follow-up questions on the same document reuse its KV: "
               "seconds of prefill saved per question"),
        Choice("engine.kv_cache_dtype", _pick(d, "fp8", "auto"),
               "long contexts are KV-bound: fp8 doubles the tokens that fit" if d == "gpu" else CPU_NO_FP8),
        Choice("engine.speculative_decoding", "ngram",
               "summaries and extractions copy phrases from the document: prompt-lookup (n-gram) drafts are often "
               "accepted, several tokens per step, no draft model needed (a draft_model, when given, replaces it)"),
        Choice("router.home_affinity", 2.0, "prefix affinity weighted up: re-prefilling a document elsewhere costs "
               "seconds, so its requests stay on the replica that holds it"),
        Choice("router.cache_miss_weight", 6.0, "an uncached document evicts as much cached context: charge it double"),
        Choice("slo.ttft_p90_ms", _pick(d, 5000.0, 20000.0), "a cold document's prefill alone takes seconds"),
    ]


def _edge(d: Device) -> list[Choice]:
    return [
        Choice("model.max_model_len", _pick(d, 4096, 2048), "bounded context keeps the KV reservation small"),
        Choice("engine.max_num_seqs", _pick(d, 16, 4), "one user or a few: a small batch in little memory"),
        Choice("engine.max_num_batched_tokens", _pick(d, 2048, 512), "small steps bound the activation peak"),
        Choice("engine.enable_chunked_prefill", True, "needed for a step budget smaller than the context"),
        Choice("engine.enable_prefix_caching", True, "free speed-up on repeated system prompts"),
        Choice("engine.kv_cache_dtype", _pick(d, "fp8", "auto"),
               "fp8 KV halves the cache's memory" if d == "gpu" else CPU_NO_FP8),
        Choice("engine.quantization", _pick(d, "fp8", None),
               "8-bit weights: half the memory and, decode being bound by memory bandwidth, faster decode; a "
               "pre-quantized checkpoint (awq/gptq/...) keeps its own method" if d == "gpu" else CPU_NO_QUANT),
        Choice("engine.gpu_memory_utilization", 0.8, "a small device is shared with other processes")
        if d == "gpu" else None,
        Choice("engine.speculative_decoding", "ngram",
               "at batch 1 decode leaves compute idle: n-gram drafts use it for several tokens a step"),
    ]


_PRESETS = {"realtime-chat": _chat, "offline-batch": _batch, "long-document": _long_doc, "edge": _edge}


def preset(scenario: str, device: Device) -> list[Choice]:
    """The preset's choices on this device (ValueError for an unknown scenario)."""
    if scenario not in _PRESETS:
        raise ValueError(f"unknown scenario {scenario!r}; one of {', '.join(SCENARIOS)}")
    return [c for c in _PRESETS[scenario](device) if c is not None]


def preset_value(scenario: str, device: Device, path: str) -> Any:
    """The value the scenario's preset gives `path` on this device (None if it sets none)."""
    return next((c.value for c in preset(scenario, device) if c.path == path), None)


def _get(data: dict, path: str) -> tuple[bool, Any]:
    node: Any = data
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return False, None
        node = node[key]
    return True, node


def apply_preset(data: dict) -> tuple[dict, list[Choice]]:
    """The raw config dict with the scenario's choices filled into unset fields, and those choices.

    Explicit fields (present in `data`) win; a dict without `engine.scenario` comes back unchanged."""
    has, scenario = _get(data, "engine.scenario")
    if not has or scenario is None:
        return data, []
    device = _get(data, "engine.device")[1] or "cpu"
    if scenario not in _PRESETS or device not in ("cpu", "gpu"):
        return data, []  # the config model's own validation names the bad value
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    applied = []
    for c in preset(scenario, device):
        section, field = c.path.split(".")
        if _get(out, c.path)[0]:
            continue
        out.setdefault(section, {})
        if not isinstance(out[section], dict):
            continue
        out[section][field] = c.value
        applied.append(c)
    return out, applied


def checkpoint_quantization(hf_config: dict) -> str | None:
    """The quantization method a checkpoint's config.json declares (awq, gptq, fp8, compressed-tensors, ...)."""
    q = hf_config.get("quantization_config") or hf_config.get("compression_config")
    if isinstance(q, dict):
        return q.get("quant_method") or q.get("format")
    return None
