"""Scenario presets (kvserve/scenarios.py): what each fills in, that explicit fields win, the device
adaptation, the checkpoint fit in deployments.vllm_args, and `kvserve config show --scenario`."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import deployments.vllm_args as va
import kvserve.model_footprint as footprint
from cli.app import app
from kvserve.config import ConfigError, KVServeConfig, load_config
from cli.scenario_report import explain
from kvserve.scenarios import SCENARIOS, apply_preset, checkpoint_quantization, preset

DEVICES = ("cpu", "gpu")


def _cfg(scenario: str, device: str = "cpu", **sections) -> KVServeConfig:
    engine = {"device": device, "scenario": scenario, **sections.pop("engine", {})}
    return KVServeConfig.model_validate({"engine": engine, **sections})


def _value(cfg: KVServeConfig, path: str):
    section, field = path.split(".")
    return getattr(getattr(cfg, section), field)


def _flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_choice_reaches_the_config_with_a_reason(scenario, device):
    cfg = _cfg(scenario, device)
    choices = preset(scenario, device)
    assert {c.path.split(".")[0] for c in choices} >= {"engine"}
    for c in choices:
        assert _value(cfg, c.path) == c.value, c.path
        assert len(c.reason) > 20, c.path
    # The Serve app re-validates the dumped config in every replica: nothing changes on the way.
    assert KVServeConfig.model_validate(cfg.model_dump(mode="json")) == cfg


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_cpu_preset_never_asks_for_what_the_cpu_cannot_do(scenario):
    cfg = _cfg(scenario, "cpu")
    assert cfg.engine.kv_cache_dtype == "auto" and cfg.engine.quantization is None
    fp8 = [c for c in preset(scenario, "cpu") if c.path == "engine.kv_cache_dtype"]
    assert all("CPU" in c.reason for c in fp8 if scenario != "realtime-chat")


def test_the_presets_differ_where_their_goals_do():
    chat, batch = _cfg("realtime-chat", "gpu"), _cfg("offline-batch", "gpu")
    assert batch.engine.max_num_seqs > chat.engine.max_num_seqs
    assert batch.slo.ttft_p90_ms > chat.slo.ttft_p90_ms
    assert batch.engine.kv_cache_dtype == "fp8" and chat.engine.kv_cache_dtype == "auto"
    doc = _cfg("long-document", "gpu")
    assert doc.router.home_affinity > KVServeConfig().router.home_affinity
    assert doc.engine.enable_chunked_prefill and doc.engine.long_prefill_token_threshold > 0
    assert doc.engine.speculative_decoding == "ngram"
    assert _cfg("edge", "gpu").engine.quantization == "fp8"
    # The router's spill bound follows the preset's TTFT target.
    assert chat.router.spill_ttft_ms == chat.slo.ttft_p90_ms


PATHS = sorted({c.path for s in SCENARIOS for d in DEVICES for c in preset(s, d)})
_EXPLICIT = {"engine.max_num_seqs": 3, "engine.max_num_batched_tokens": 4096, "engine.enable_chunked_prefill": True,
             "engine.long_prefill_token_threshold": 77, "engine.enable_prefix_caching": False,
             "engine.kv_cache_dtype": "auto", "engine.speculative_decoding": "off", "engine.quantization": None,
             "engine.gpu_memory_utilization": 0.5, "model.max_model_len": 1024, "slo.ttft_p90_ms": 1234.0,
             "slo.itl_p90_ms": 99.0, "router.home_affinity": 0.5, "router.cache_miss_weight": 1.5,
             "autoscaling.headroom": 0.5}


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(SCENARIOS), st.sampled_from(DEVICES), st.sets(st.sampled_from(PATHS)))
def test_explicit_fields_always_win(scenario, device, explicit):
    assert set(PATHS) <= set(_EXPLICIT)
    data: dict = {"engine": {"scenario": scenario, "device": device}}
    for path in explicit:
        section, field = path.split(".")
        data.setdefault(section, {})[field] = _EXPLICIT[path]
    cfg = KVServeConfig.model_validate(data)
    _, applied = apply_preset(data)
    for c in preset(scenario, device):
        want = _EXPLICIT[c.path] if c.path in explicit else c.value
        assert _value(cfg, c.path) == want, c.path
        assert (c in applied) == (c.path not in explicit)


def test_no_scenario_leaves_the_config_alone():
    data = {"engine": {"max_num_seqs": 5}}
    assert apply_preset(data) == (data, [])
    assert KVServeConfig.model_validate(data) == KVServeConfig(engine={"max_num_seqs": 5})


def test_an_unknown_scenario_is_a_config_error_naming_the_field():
    with pytest.raises(ConfigError, match="engine.scenario"):
        load_config(overrides={"engine": {"scenario": "gaming"}}, environ={})


# -- vLLM arguments --------------------------------------------------------------------------------------


@pytest.fixture
def checkpoint(tmp_path, monkeypatch):
    """A local model folder whose config.json each test writes."""
    monkeypatch.setattr(footprint, "local_model_dir", lambda p: tmp_path if p == str(tmp_path) else None)

    def write(**hf) -> str:
        (tmp_path / "config.json").write_text(json.dumps(hf))
        return str(tmp_path)

    return write


def test_ngram_and_draft_speculative_configs():
    doc = _cfg("long-document", model={"source": "org/some-model"})
    spec = json.loads(_flag(va.engine_cli_args(doc), "--speculative-config"))
    assert spec["method"] == "ngram" and spec["num_speculative_tokens"] == 4
    draft = _cfg("long-document", model={"source": "org/some-model"}, engine={"draft_model": "org/eagle-head"})
    assert json.loads(_flag(va.engine_cli_args(draft), "--speculative-config"))["model"] == "org/eagle-head"
    assert "--speculative-config" not in va.engine_cli_args(_cfg("offline-batch", model={"source": "org/m"}))
    with pytest.raises(ValueError, match="draft_model"):
        KVServeConfig.model_validate({"engine": {"speculative_decoding": "draft"}})


def test_a_preset_context_is_capped_at_the_checkpoints(checkpoint):
    path = checkpoint(max_position_embeddings=4096)
    args = va.engine_cli_args(_cfg("long-document", "gpu", model={"source": path}))
    assert _flag(args, "--max-model-len") == "4096"
    # An explicit context is the user's: passed as given (vLLM names the problem).
    explicit = _cfg("long-document", "gpu", model={"source": path, "max_model_len": 30000})
    assert _flag(va.engine_cli_args(explicit), "--max-model-len") == "30000"


def test_a_pre_quantized_checkpoint_keeps_its_method(checkpoint):
    awq = checkpoint(max_position_embeddings=8192, quantization_config={"quant_method": "awq", "bits": 4})
    assert checkpoint_quantization(json.loads((footprint.local_model_dir(awq) / "config.json").read_text())) == "awq"
    assert "--quantization" not in va.engine_cli_args(_cfg("edge", "gpu", model={"source": awq}))
    plain = checkpoint(max_position_embeddings=8192)
    assert _flag(va.engine_cli_args(_cfg("edge", "gpu", model={"source": plain})), "--quantization") == "fp8"


def test_vllm_parses_every_preset():
    for scenario in SCENARIOS:
        cfg = _cfg(scenario, "cpu", model={"source": "org/some-model"})
        ns = va.parse_vllm_args(va.engine_cli_args(cfg))
        assert ns.max_num_seqs == cfg.engine.max_num_seqs
        assert ns.max_num_batched_tokens == cfg.engine.max_num_batched_tokens


# -- config show --scenario ------------------------------------------------------------------------------


def test_explain_names_the_source_of_each_argument():
    raw = {"engine": {"scenario": "offline-batch", "max_num_seqs": 7}, "model": {"source": "org/m"}}
    cfg = KVServeConfig.model_validate(raw)
    rows = {r.name: r for r in explain(raw, va.engine_cli_args(cfg), cfg)}
    assert rows["--max-num-seqs"].source == "config" and rows["--max-num-seqs"].value == "7"
    assert rows["--max-num-batched-tokens"].source == "scenario offline-batch"
    assert "CPU" in rows["--kv-cache-dtype"].why
    assert rows["slo.ttft_p90_ms"].value == "60000.0"
    assert rows["engine.speculative_decoding"].value == "off"  # left off: no flag, still explained
    assert rows["--model"].value == "org/m"


def test_config_show_scenario_cli(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  source: org/m\nengine:\n  max_num_seqs: 9\n")
    out = CliRunner().invoke(app, ["config", "show", "--config", str(path), "--scenario", "realtime-chat",
                                   "--format", "json"])
    assert out.exit_code == 0, out.output
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert rows["--max-num-seqs"]["value"] == "9" and rows["--max-num-seqs"]["source"] == "config"
    assert rows["--long-prefill-token-threshold"]["value"] == "256"
    bad = CliRunner().invoke(app, ["config", "show", "--scenario", "gaming"])
    assert bad.exit_code == 2 and "unknown scenario" in bad.output
