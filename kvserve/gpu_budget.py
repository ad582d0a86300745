"""How much KV cache a replica holding a share of one GPU can have (pure arithmetic, no I/O).

vLLM sizes its KV cache against the whole device: it profiles how much memory is free around
its own start, so two engines on one GPU each count the other's weights (or starve). A replica
with a share instead plans its own footprint:

    share x device memory x utilization  =  weights + activations + CUDA graphs + overhead + KV cache

and hands vLLM the KV term as `kv_cache_memory_bytes`. The non-KV terms are estimates, each on
the safe side (see the constants), so N replicas whose shares add up to <= 1 never plan more
than the device holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

GiB = 1 << 30

# A forward pass over a full step keeps a few of the widest tensors alive at once (MLP gate/up
# and its activation, qkv, residuals); the estimate counts them once and multiplies by this.
# For an 8B Llama at 8192 tokens it gives 1.5 GiB where vLLM measures ~1.2 GiB.
ACTIVATION_SAFETY = 1.5
# CUDA-graph pool when graphs are captured: vLLM reports 0.3-0.9 GiB for 1-8B models.
CUDA_GRAPH_BYTES = 1 * GiB
# Memory torch does not allocate: CUDA context, cuBLAS/NCCL workspaces, allocator fragmentation.
OVERHEAD_BYTES = 1 * GiB

_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2,
                "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "fp8_ds_mla": 1}


def dtype_bytes(dtype: str, checkpoint_dtype: str | None = None) -> int:
    """Bytes per weight/activation element for vLLM's `--dtype`. `auto` is the checkpoint's dtype,
    with fp32 checkpoints cast down to 16 bits, as vLLM does on GPU."""
    if dtype == "auto":
        return 2 if checkpoint_dtype in (None, "float32", "float") else _DTYPE_BYTES.get(checkpoint_dtype, 2)
    return _DTYPE_BYTES.get(dtype, 2)


def kv_dtype_bytes(kv_cache_dtype: str, model_dtype_bytes: int) -> int:
    return model_dtype_bytes if kv_cache_dtype == "auto" else _DTYPE_BYTES.get(kv_cache_dtype, model_dtype_bytes)


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that memory depends on (from its HF config.json)."""

    hidden_size: int
    num_layers: int
    intermediate_size: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool = False
    num_experts: int = 1  # MoE: experts per layer, each with its own MLP
    checkpoint_dtype: str | None = None

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> ModelShape:
        c = config.get("text_config") or config  # multimodal configs nest the language model's
        heads = int(c["num_attention_heads"])
        hidden = int(c["hidden_size"])
        experts = c.get("num_local_experts") or c.get("num_experts") or c.get("n_routed_experts") or 1
        return cls(
            hidden_size=hidden,
            num_layers=int(c["num_hidden_layers"]),
            intermediate_size=int(c.get("moe_intermediate_size") if experts > 1 and c.get("moe_intermediate_size")
                                  else c.get("intermediate_size") or 4 * hidden),
            vocab_size=int(c["vocab_size"]),
            num_heads=heads,
            num_kv_heads=int(c.get("num_key_value_heads") or heads),
            head_dim=int(c.get("head_dim") or hidden // heads),
            tie_word_embeddings=bool(c.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
            num_experts=int(experts),
            checkpoint_dtype=c.get("torch_dtype") or c.get("dtype") or config.get("torch_dtype"),
        )

    def param_count(self) -> int:
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = h * q + 2 * h * kv + q * h
        mlp = 3 * h * self.intermediate_size * self.num_experts  # gate, up, down
        router = h * self.num_experts if self.num_experts > 1 else 0
        per_layer = attention + mlp + router + 2 * h  # + the two norms
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + embeddings + h

    def kv_bytes_per_token(self, kv_bytes: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * kv_bytes  # K and V

    def activation_bytes(self, max_num_batched_tokens: int, max_num_seqs: int, dtype_bytes: int) -> int:
        """Peak of one engine step: a full step's widest tensors, plus the sampler's fp32 logits
        (and their softmax/sort copies) for every running sequence."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        per_token = (3 * self.intermediate_size + 4 * h + q + 2 * kv) * dtype_bytes
        step = ACTIVATION_SAFETY * max_num_batched_tokens * per_token
        sampler = 4 * max_num_seqs * self.vocab_size * 4
        return int(step) + sampler


class ShareTooSmall(ValueError):
    """The GPU share cannot hold the model and one full-length sequence's KV cache."""


@dataclass(frozen=True)
class KVBudget:
    device_bytes: int
    share: float
    utilization: float
    weights: int
    activations: int
    cuda_graphs: int
    overhead: int = OVERHEAD_BYTES

    @property
    def footprint(self) -> int:
        """All the memory this replica may use on the device."""
        return math.floor(self.device_bytes * self.share * self.utilization)

    @property
    def non_kv(self) -> int:
        return self.weights + self.activations + self.cuda_graphs + self.overhead

    @property
    def kv_bytes(self) -> int:
        return max(self.footprint - self.non_kv, 0)

    def describe(self) -> str:
        g = lambda b: f"{b / GiB:.2f} GiB"  # noqa: E731
        return (f"share {self.share:g} x {g(self.device_bytes)} x utilization {self.utilization:g} = "
                f"{g(self.footprint)}: "
                f"weights {g(self.weights)}, activations {g(self.activations)}, CUDA graphs {g(self.cuda_graphs)}, "
                f"overhead {g(self.overhead)}, KV cache {g(self.kv_bytes)}")


def kv_budget(device_bytes: int, share: float, utilization: float, weights: int, activations: int,
              cuda_graphs: int, min_kv_bytes: int = 0) -> KVBudget:
    """The KV cache a replica with `share` of a `device_bytes` GPU can have. Raises ShareTooSmall
    when that is below `min_kv_bytes` (one max-length sequence: vLLM refuses to start below it)."""
    if not 0 < share <= 1 or not 0 < utilization <= 1:
        raise ValueError(f"share ({share}) and utilization ({utilization}) must be in (0, 1]")
    budget = KVBudget(device_bytes, share, utilization, weights, activations, cuda_graphs)
    if budget.kv_bytes <= 0 or budget.kv_bytes < min_kv_bytes:
        raise ShareTooSmall(
            f"a GPU share leaves too little KV cache ({budget.describe()}; one max_model_len sequence needs "
            f"{min_kv_bytes / GiB:.2f} GiB): raise engine.gpus_per_replica or engine.gpu_memory_utilization, "
            "lower engine.max_num_batched_tokens or model.max_model_len, or set "
            "engine.extra_args.kv_cache_memory_bytes"
        )
    return budget
