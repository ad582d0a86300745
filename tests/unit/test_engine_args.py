"""Device-dependent engine defaults and the vLLM arguments a replica gets (deployments.vllm_args)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import deployments.vllm_args as va
import kvserve.model_footprint as footprint
from cli.commands import show
from kvserve.config import KVServeConfig, load_config
from kvserve.gpu_budget import GiB

REPO = Path(__file__).resolve().parents[2]
MODEL8B = REPO / ".." / "shared" / "gpu" / "model8b"
H100_80GB = 81559 * 2**20

# deployments.vllm_args.engine_cli_args(KVServeConfig()) before GPU defaults and shares existed.
CPU_DEFAULT_ARGS = [
    "--model", "MODEL", "--served-model-name", "smollm2-135m-instruct", "--max-model-len", "2048",
    "--dtype", "float32", "--block-size", "32", "--max-num-seqs", "32", "--max-num-batched-tokens", "2048",
    "--long-prefill-token-threshold", "0", "--tensor-parallel-size", "1", "--kv-cache-dtype", "auto",
    "--enable-prompt-tokens-details", "--disable-uvicorn-access-log", "--no-enable-log-requests",
    "--enable-prefix-caching",
    "--enable-chunked-prefill", "--enforce-eager",
]


@pytest.fixture(autouse=True)
def _model_paths(monkeypatch):
    """Model sources resolve to a placeholder; the GPU configs' /tmp/model8b is the kit's model8b here."""
    embedded = KVServeConfig().model.source
    monkeypatch.setattr(va, "resolve_model_path", lambda m: "MODEL" if m.source == embedded else m.source)
    monkeypatch.setattr(footprint, "local_model_dir", lambda p: MODEL8B if p == "/tmp/model8b" else None)


def _gpu(**engine) -> KVServeConfig:
    return KVServeConfig.model_validate({"model": {"source": "/tmp/model8b", "max_model_len": 4096},
                                         "engine": {"device": "gpu", **engine}})


def _flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


# -- defaults --------------------------------------------------------------------------------------------


def test_cpu_defaults_and_args_are_unchanged():
    e = KVServeConfig().engine
    assert (e.dtype, e.enforce_eager, e.max_num_batched_tokens, e.block_size) == ("float32", True, 2048, 32)
    assert va.engine_cli_args(KVServeConfig()) == CPU_DEFAULT_ARGS
    assert va.engine_cli_args(KVServeConfig(), device_memory_bytes=H100_80GB) == CPU_DEFAULT_ARGS
    assert va.engine_env(KVServeConfig()) == {"VLLM_CPU_KVCACHE_SPACE": "1"}


def test_gpu_defaults_fill_only_unset_fields():
    e = _gpu().engine
    assert (e.dtype, e.enforce_eager, e.max_num_batched_tokens, e.block_size) == ("auto", False, 8192, 16)
    assert e.gpus_per_replica == 1.0
    explicit = _gpu(dtype="bfloat16", enforce_eager=True, max_num_batched_tokens=4096, block_size=32).engine
    assert (explicit.dtype, explicit.enforce_eager, explicit.max_num_batched_tokens, explicit.block_size) == (
        "bfloat16", True, 4096, 32)
    cpu = KVServeConfig.model_validate({"engine": {"dtype": "bfloat16", "enforce_eager": False}}).engine
    assert (cpu.dtype, cpu.enforce_eager, cpu.max_num_batched_tokens) == ("bfloat16", False, 2048)


def test_config_show_prints_the_device_defaults(tmp_path, capsys):
    path = tmp_path / "gpu.yaml"
    path.write_text("engine:\n  device: gpu\ntenants:\n  open_mode: true\n")
    show(config=path, fmt="json")
    engine = json.loads(capsys.readouterr().out)["engine"]
    assert {k: engine[k] for k in ("dtype", "enforce_eager", "max_num_batched_tokens", "block_size")} == {
        "dtype": "auto", "enforce_eager": False, "max_num_batched_tokens": 8192, "block_size": 16}


# -- GPU shares ------------------------------------------------------------------------------------------


def test_a_whole_gpu_is_left_to_vllm():
    args = va.engine_cli_args(_gpu(), device_memory_bytes=H100_80GB)
    assert _flag(args, "--gpu-memory-utilization") == "0.9"
    assert "--kv-cache-memory-bytes" not in args and "--enforce-eager" not in args
    assert (_flag(args, "--dtype"), _flag(args, "--max-num-batched-tokens"), _flag(args, "--block-size")) == (
        "auto", "8192", "16")
    assert not va.needs_device_memory(_gpu())


def test_a_share_sizes_its_kv_cache_and_asks_vllm_for_its_share_of_the_device(caplog):
    cfg = _gpu(gpus_per_replica=0.5)
    assert va.needs_device_memory(cfg)
    with caplog.at_level(logging.INFO, logger="kvserve.vllm_args"):
        args = va.engine_cli_args(cfg, device_memory_bytes=H100_80GB)
    assert _flag(args, "--gpu-memory-utilization") == "0.45"  # vLLM's start check: free >= 0.45 x device
    kv = int(_flag(args, "--kv-cache-memory-bytes"))
    assert kv == footprint.replica_kv_budget(cfg, H100_80GB, MODEL8B).kv_bytes
    assert 18 * GiB < kv < 19 * GiB
    assert "KV cache from the GPU share" in caplog.text


def test_without_device_memory_a_share_still_gets_its_utilization():
    args = va.engine_cli_args(_gpu(gpus_per_replica=0.25))  # the ingress: renders, runs no engine
    assert _flag(args, "--gpu-memory-utilization") == "0.225"
    assert "--kv-cache-memory-bytes" not in args


def test_explicit_kv_cache_memory_bytes_wins():
    cfg = _gpu(gpus_per_replica=0.5, extra_args={"kv_cache_memory_bytes": 8 * GiB})
    assert not va.needs_device_memory(cfg)
    args = va.engine_cli_args(cfg, device_memory_bytes=H100_80GB)
    assert args.count("--kv-cache-memory-bytes") == 1 and _flag(args, "--kv-cache-memory-bytes") == str(8 * GiB)


def test_explicit_kv_cache_tokens_win():
    args = va.engine_cli_args(_gpu(gpus_per_replica=0.5, kv_cache_tokens=24_000), device_memory_bytes=H100_80GB)
    assert _flag(args, "--num-gpu-blocks-override") == "1500"
    assert _flag(args, "--kv-cache-memory-bytes") == str(1500 * 16 * 128 * 1024)


def test_an_unknown_model_falls_back_to_vllm_with_a_warning(caplog):
    cfg = KVServeConfig.model_validate({"model": {"source": "org/not-here"},
                                        "engine": {"device": "gpu", "gpus_per_replica": 0.5}})
    with caplog.at_level(logging.WARNING, logger="kvserve.vllm_args"):
        args = va.engine_cli_args(cfg, device_memory_bytes=H100_80GB)
    assert "--kv-cache-memory-bytes" not in args
    assert "kv_cache_memory_bytes" in caplog.text


def test_device_memory_is_read_only_when_a_share_needs_it(monkeypatch):
    import deployments.vllm_compat as compat

    monkeypatch.setattr(compat, "device_total_memory", lambda: H100_80GB)
    assert va.gpu_device_memory(_gpu(gpus_per_replica=0.5)) == H100_80GB
    monkeypatch.setattr(compat, "device_total_memory", lambda: pytest.fail("read without need"))
    assert va.gpu_device_memory(_gpu()) is None
    assert va.gpu_device_memory(KVServeConfig()) is None


# -- the GPU bench configs -------------------------------------------------------------------------------

BENCH = REPO / "bench" / "configs"


@pytest.mark.parametrize("name, share, util", [
    ("gpu-8b-1replica.yaml", 1.0, "0.9"), ("gpu-8b-2replicas.yaml", 0.5, "0.45"),
    ("gpu-8b-4replicas.yaml", 0.25, "0.2375"),
])
def test_gpu_bench_configs_give_the_expected_vllm_args(name, share, util):
    cfg = load_config(BENCH / name, environ={})
    assert cfg.engine.gpus_per_replica == share and cfg.num_replicas == round(1 / share)
    assert "kv_cache_memory_bytes" not in cfg.engine.extra_args
    args = va.engine_cli_args(cfg, device_memory_bytes=H100_80GB)
    batched = "4096" if share == 0.25 else "8192"
    kv = [] if share == 1 else ["--kv-cache-memory-bytes",
                                str(footprint.replica_kv_budget(cfg, H100_80GB, MODEL8B).kv_bytes)]
    assert args == [
        "--model", "/tmp/model8b", "--served-model-name", "llama8b-dummy", "--max-model-len", "4096",
        "--dtype", "auto", "--block-size", "16", "--max-num-seqs", "64", "--max-num-batched-tokens", batched,
        "--long-prefill-token-threshold", "0", "--tensor-parallel-size", "1", "--kv-cache-dtype", "auto",
        "--enable-prompt-tokens-details", "--disable-uvicorn-access-log", "--no-enable-log-requests",
        "--enable-prefix-caching", "--enable-chunked-prefill", "--gpu-memory-utilization", util, *kv,
        "--load-format", "dummy", "--chat-template", "/tmp/model8b/chat_template.jinja",
    ]
    if kv:
        per_replica_tokens = int(kv[1]) // (128 * 1024)
        assert per_replica_tokens >= 4096  # at least one max_model_len sequence
        assert round(1 / share) * int(float(util) * H100_80GB) <= H100_80GB


def test_vllm_parses_the_share_args():
    """The installed vLLM's own parser takes every flag we emit for a share (0.24 has them too)."""
    cfg = load_config(BENCH / "gpu-8b-2replicas.yaml", environ={})
    ns = va.parse_vllm_args(va.engine_cli_args(cfg, kv_events_endpoint="ipc:///tmp/kv.sock",
                                               device_memory_bytes=H100_80GB))
    assert ns.gpu_memory_utilization == 0.45
    assert ns.kv_cache_memory_bytes == footprint.replica_kv_budget(cfg, H100_80GB, MODEL8B).kv_bytes
    assert (ns.dtype, ns.enforce_eager, ns.block_size, ns.load_format) == ("auto", False, 16, "dummy")
