"""`kvserve config show --scenario X`: the effective vLLM engine arguments, each with where it came
from (the scenario preset, the config, a default) and why."""

from __future__ import annotations

from dataclasses import dataclass

from kvserve.config import KVServeConfig
from kvserve.scenarios import apply_preset

# vLLM flag -> the config field behind it (flags kvserve always sets have no field).
FLAG_FIELDS = {
    "--max-model-len": "model.max_model_len",
    "--dtype": "engine.dtype",
    "--block-size": "engine.block_size",
    "--max-num-seqs": "engine.max_num_seqs",
    "--max-num-batched-tokens": "engine.max_num_batched_tokens",
    "--long-prefill-token-threshold": "engine.long_prefill_token_threshold",
    "--tensor-parallel-size": "engine.tensor_parallel_size",
    "--kv-cache-dtype": "engine.kv_cache_dtype",
    "--enable-prefix-caching": "engine.enable_prefix_caching",
    "--no-enable-prefix-caching": "engine.enable_prefix_caching",
    "--enable-chunked-prefill": "engine.enable_chunked_prefill",
    "--no-enable-chunked-prefill": "engine.enable_chunked_prefill",
    "--enforce-eager": "engine.enforce_eager",
    "--quantization": "engine.quantization",
    "--speculative-config": "engine.speculative_decoding",
    "--gpu-memory-utilization": "engine.gpu_memory_utilization",
}


@dataclass
class Row:
    name: str  # a vLLM flag or a config field
    value: str
    source: str  # scenario / config / default
    why: str


def _split(args: list[str]) -> list[tuple[str, str]]:
    out, i = [], 0
    while i < len(args):
        flag = args[i]
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            out.append((flag, args[i + 1]))
            i += 2
        else:
            out.append((flag, "on"))
            i += 1
    return out


def _field_description(path: str) -> str:
    section, field = path.split(".")
    model = KVServeConfig.model_fields[section].annotation
    info = getattr(model, "model_fields", {}).get(field)
    return (info.description or "") if info else ""


def _explicit(raw: dict, path: str) -> bool:
    section, field = path.split(".")
    return isinstance(raw.get(section), dict) and field in raw[section]


def explain(raw: dict, engine_args: list[str], cfg: KVServeConfig) -> list[Row]:
    """One row per vLLM argument, then the preset's SLO/router/autoscaler fields."""
    chosen = {c.path: c for c in apply_preset(raw)[1]}
    scenario = cfg.engine.scenario
    rows, covered = [], set()
    for flag, value in _split(engine_args):
        if flag == "--model":
            value = cfg.model.source  # the resolved path is a machine detail
        path = FLAG_FIELDS.get(flag)
        covered.add(path)
        if path in chosen:
            rows.append(Row(flag, value, f"scenario {scenario}", chosen[path].reason))
        elif path and _explicit(raw, path):
            rows.append(Row(flag, value, "config", _field_description(path)))
        else:
            rows.append(Row(flag, value, "default", _field_description(path) if path else "set by kvserve"))
    for path, c in chosen.items():  # what the preset left off (no flag) and its non-engine fields
        if path not in covered:
            section, field = path.split(".")
            rows.append(Row(path, str(getattr(getattr(cfg, section), field)), f"scenario {scenario}", c.reason))
    return rows


def print_report(config_path, scenario: str, fmt: str = "table") -> int:
    """Print the report for `scenario` on the config at `config_path`; the exit status (2: bad input)."""
    import json

    from rich.console import Console
    from rich.table import Table

    from deployments.vllm_args import engine_cli_args
    from kvserve.config import ConfigError, deep_merge, raw_config
    from kvserve.scenarios import SCENARIOS

    err = Console(stderr=True)
    if scenario not in SCENARIOS:
        err.print(f"[red]unknown scenario {scenario!r}; one of {', '.join(SCENARIOS)}[/red]")
        return 2
    try:
        raw = deep_merge(raw_config(config_path), {"engine": {"scenario": scenario}})
        cfg = KVServeConfig.model_validate(raw)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        err.print(f"[red]{e}[/red]")
        return 2
    rows = explain(raw, engine_cli_args(cfg), cfg)
    if fmt == "json":
        print(json.dumps([r.__dict__ for r in rows], indent=1))
        return 0
    table = Table(title=f"scenario {scenario} on {cfg.engine.device}: vLLM arguments and why")
    for col in ("argument", "value", "from", "why"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r.name, r.value, r.source, r.why)
    Console(width=160).print(table)
    return 0
