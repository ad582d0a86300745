"""A replica's memory plan on a GPU share: reads the model's config.json and safetensors headers
(no weights, no torch) and feeds kvserve.gpu_budget.

Weights: the safetensors headers give every tensor's shape and dtype, so float tensors are counted
at the served dtype and quantized ones at their stored size. Without weight files (a `dummy`
load, a hub id not downloaded yet) they are estimated from config.json's shape.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from kvserve.config import KVServeConfig
from kvserve.gpu_budget import CUDA_GRAPH_BYTES, KVBudget, ModelShape, dtype_bytes, kv_budget, kv_dtype_bytes

_FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}
_SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "U32": 4, "I16": 2,
                      "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def local_model_dir(path_or_id: str) -> Path | None:
    """The folder holding the model's config.json: the path itself, or the Hugging Face cache's
    snapshot of a hub id (fetching only config.json, which vLLM fetches at start anyway)."""
    path = Path(path_or_id)
    if (path / "config.json").is_file():
        return path
    try:
        from huggingface_hub import hf_hub_download, snapshot_download

        try:
            return Path(snapshot_download(path_or_id, local_files_only=True))
        except Exception:
            return Path(hf_hub_download(path_or_id, "config.json")).parent
    except Exception:
        return None


def read_shape(model_dir: Path) -> ModelShape:
    return ModelShape.from_hf_config(json.loads((model_dir / "config.json").read_text()))


def safetensors_weight_bytes(model_dir: Path, served_dtype_bytes: int) -> int | None:
    """Bytes the checkpoint's tensors take once loaded; None without .safetensors files."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for f in files:
        with f.open("rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, t in header.items():
            if name == "__metadata__":
                continue
            numel = math.prod(t["shape"])
            if t["dtype"] in _FLOAT_DTYPES:
                total += numel * served_dtype_bytes
            else:
                total += numel * _SAFETENSORS_BYTES.get(t["dtype"], 4)
    return total


def replica_kv_budget(cfg: KVServeConfig, device_bytes: int, model_dir: Path) -> KVBudget:
    """The KV cache one GPU of a replica can hold, for `cfg.engine.gpu_share` of a `device_bytes` GPU."""
    e = cfg.engine
    shape = read_shape(model_dir)
    nbytes = dtype_bytes(e.dtype, shape.checkpoint_dtype)
    tp = e.tensor_parallel_size
    weights = safetensors_weight_bytes(model_dir, nbytes)
    if weights is None:
        weights = shape.param_count() * nbytes
    kv_per_token = shape.kv_bytes_per_token(kv_dtype_bytes(e.kv_cache_dtype, nbytes)) // tp
    return kv_budget(
        device_bytes=device_bytes,
        share=e.gpu_share,
        utilization=e.gpu_memory_utilization,
        weights=math.ceil(weights / tp),
        activations=shape.activation_bytes(e.max_num_batched_tokens, e.max_num_seqs, nbytes),
        cuda_graphs=0 if e.enforce_eager else CUDA_GRAPH_BYTES,
        min_kv_bytes=cfg.model.max_model_len * kv_per_token,
    )


def kv_bytes_for_tokens(cfg: KVServeConfig, model_dir: Path, tokens: int) -> int:
    """KV-cache bytes per GPU for `tokens` tokens (whole blocks), the way vLLM counts them."""
    e = cfg.engine
    shape = read_shape(model_dir)
    per_token = shape.kv_bytes_per_token(kv_dtype_bytes(e.kv_cache_dtype, dtype_bytes(e.dtype, shape.checkpoint_dtype)))
    blocks = max(tokens // e.block_size, 1)
    return blocks * e.block_size * per_token // e.tensor_parallel_size
