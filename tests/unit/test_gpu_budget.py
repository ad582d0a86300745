"""The KV budget of a replica on a GPU share (kvserve.gpu_budget, kvserve.model_footprint)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvserve.config import KVServeConfig
from kvserve.gpu_budget import GiB, KVBudget, ModelShape, ShareTooSmall, dtype_bytes, kv_budget
from kvserve.model_footprint import kv_bytes_for_tokens, replica_kv_budget, safetensors_weight_bytes

MODEL8B = Path(__file__).resolve().parents[2] / ".." / "shared" / "gpu" / "model8b"
H100_80GB = 81559 * 2**20  # total memory as NVML reports it for an H100 80GB HBM3


def _cfg(replicas: int, **engine) -> KVServeConfig:
    return KVServeConfig.model_validate({
        "model": {"source": str(MODEL8B), "max_model_len": 4096},
        "engine": {"device": "gpu", "gpus_per_replica": 1 / replicas, "max_num_seqs": 64, **engine},
    })


def test_8b_shape_from_its_config():
    shape = ModelShape.from_hf_config(json.loads((MODEL8B / "config.json").read_text()))
    # 32 x (attention 41.9M + MLP 176.2M + norms) + untied embeddings 2 x 49152 x 4096 + final norm
    assert shape.param_count() == 7_382_241_280
    assert shape.kv_bytes_per_token(2) == 128 * 1024  # 2 x 32 layers x 8 KV heads x 128 x bf16


@pytest.mark.parametrize("replicas, lo_gib, hi_gib", [(2, 18.0, 19.0), (4, 0.5, 0.75)])
def test_8b_on_an_h100_shared_by_2_and_4_replicas(replicas, lo_gib, hi_gib):
    budgets = [replica_kv_budget(_cfg(replicas), H100_80GB, MODEL8B) for _ in range(replicas)]
    b = budgets[0]
    assert b.weights == 7_382_241_280 * 2  # no weight files (dummy load): the config's shape in bf16
    assert b.cuda_graphs > 0  # CUDA graphs are on by default on GPU
    assert lo_gib * GiB < b.kv_bytes < hi_gib * GiB
    assert b.kv_bytes >= 4096 * 128 * 1024  # one max_model_len sequence: vLLM's start-up minimum
    assert sum(x.footprint for x in budgets) <= 0.9 * H100_80GB


def test_the_4_replica_bench_settings_leave_each_replica_about_19k_tokens():
    b = replica_kv_budget(_cfg(4, gpu_memory_utilization=0.95, max_num_batched_tokens=4096), H100_80GB, MODEL8B)
    assert 18_000 < b.kv_bytes // (128 * 1024) < 21_000
    assert 4 * b.footprint <= 0.95 * H100_80GB


def test_a_share_that_cannot_hold_the_weights_says_what_to_change():
    with pytest.raises(ShareTooSmall, match="gpus_per_replica.*kv_cache_memory_bytes"):
        replica_kv_budget(_cfg(8), H100_80GB, MODEL8B)  # 8.96 GiB < 13.75 GiB of weights


def test_eager_mode_and_smaller_steps_leave_more_kv():
    base = replica_kv_budget(_cfg(2), H100_80GB, MODEL8B)
    assert replica_kv_budget(_cfg(2, enforce_eager=True), H100_80GB, MODEL8B).kv_bytes == base.kv_bytes + GiB
    assert replica_kv_budget(_cfg(2, max_num_batched_tokens=2048), H100_80GB, MODEL8B).kv_bytes > base.kv_bytes


def test_kv_bytes_for_explicit_tokens_counts_whole_blocks():
    assert kv_bytes_for_tokens(_cfg(2), MODEL8B, 24_000) == 24_000 // 16 * 16 * 128 * 1024
    assert kv_bytes_for_tokens(_cfg(2, tensor_parallel_size=2, gpus_per_replica=1), MODEL8B, 1600) == 1600 * 64 * 1024


@pytest.mark.parametrize("dtype, checkpoint, expected", [
    ("auto", "bfloat16", 2), ("auto", "float32", 2), ("auto", None, 2), ("float32", "bfloat16", 4),
    ("bfloat16", "float32", 2), ("half", None, 2),
])
def test_dtype_bytes_follow_vllm_auto_casting(dtype, checkpoint, expected):
    assert dtype_bytes(dtype, checkpoint) == expected


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    sizes = {"BF16": 2, "F32": 4, "I32": 4, "U8": 1}
    for name, (dt, shape) in tensors.items():
        n = sizes[dt]
        for d in shape:
            n *= d
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


def test_safetensors_floats_count_at_the_served_dtype_and_packed_ints_as_stored(tmp_path):
    _write_safetensors(tmp_path / "model-00001.safetensors", {"w": ("BF16", [64, 32]), "scale": ("F32", [64])})
    _write_safetensors(tmp_path / "model-00002.safetensors", {"qweight": ("I32", [16, 32]), "zeros": ("U8", [8])})
    served_bf16 = (64 * 32 + 64) * 2 + 16 * 32 * 4 + 8
    assert safetensors_weight_bytes(tmp_path, 2) == served_bf16
    assert safetensors_weight_bytes(tmp_path, 4) == (64 * 32 + 64) * 4 + 16 * 32 * 4 + 8
    assert safetensors_weight_bytes(tmp_path / "none", 2) is None


def test_weight_files_win_over_the_config_estimate(tmp_path):
    (tmp_path / "config.json").write_text((MODEL8B / "config.json").read_text())
    _write_safetensors(tmp_path / "model.safetensors", {"w": ("BF16", [1024, 1024])})
    b = replica_kv_budget(_cfg(2), H100_80GB, tmp_path)
    assert b.weights == 1024 * 1024 * 2


# -- properties of the arithmetic ----------------------------------------------------------------------

_gib = st.integers(min_value=0, max_value=64).map(lambda g: g * GiB)


@settings(max_examples=300, deadline=None)
@given(device=st.integers(16, 192).map(lambda g: g * GiB), n=st.integers(1, 8),
       util=st.floats(0.05, 1.0), weights=_gib, activations=_gib, graphs=st.sampled_from([0, GiB]))
def test_replicas_sharing_a_device_never_plan_more_than_it_has(device, n, util, weights, activations, graphs):
    budgets = [KVBudget(device, 1 / n, util, weights, activations, graphs) for _ in range(n)]
    assert sum(b.kv_bytes for b in budgets) <= device
    assert all(b.kv_bytes == 0 or b.kv_bytes + b.non_kv <= b.footprint for b in budgets)
    assert sum(b.footprint for b in budgets) <= device


@settings(max_examples=300, deadline=None)
@given(device=st.integers(16, 192).map(lambda g: g * GiB), a=st.floats(0.01, 1.0), b=st.floats(0.01, 1.0),
       util=st.floats(0.05, 1.0), weights=_gib, activations=_gib)
def test_a_larger_share_never_gets_less_kv(device, a, b, util, weights, activations):
    small, large = sorted((a, b))
    kv = lambda s: KVBudget(device, s, util, weights, activations, GiB).kv_bytes  # noqa: E731
    assert kv(small) <= kv(large)


@settings(max_examples=200, deadline=None)
@given(device=st.integers(16, 192).map(lambda g: g * GiB), share=st.floats(0.01, 1.0), weights=_gib,
       min_kv=_gib)
def test_kv_budget_either_meets_the_minimum_or_refuses(device, share, weights, min_kv):
    try:
        budget = kv_budget(device, share, 0.9, weights, GiB, GiB, min_kv_bytes=min_kv)
    except ShareTooSmall:
        return
    assert budget.kv_bytes >= max(min_kv, 1)


@pytest.mark.parametrize(("device", "gpus", "tp", "expected"), [("gpu", 0.25, 1, 4), ("gpu", 0.3, 1, 3), ("gpu", 0.5, 1, 2),
                                                             ("gpu", 0, 2, 1), ("gpu", 1, 1, 1), ("cpu", 0, 1, 1)])
def test_engines_per_device_is_how_many_replicas_ray_packs_on_a_gpu(device, gpus, tp, expected):
    from kvserve.config import EngineConfig

    assert EngineConfig(device=device, gpus_per_replica=gpus, tensor_parallel_size=tp).engines_per_device == expected
