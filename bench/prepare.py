"""Everything a bench run needs before the first request: cluster config, tokenizer, workload, load."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.tokens import SafeVocab, TokenizerLike
from bench.workloads import Workload, multi_tenant, trace
from kvserve.arrivals import parse_load_shape, parse_skew, poisson_arrivals
from kvserve.model import resolve_model_path

POLICIES = ("round_robin", "pow2", "ray_prefix", "kvserve")


@dataclass
class LoadSpec:
    concurrency: int | None = None
    rate: float | None = None
    load_shape: str | None = None
    step_seconds: float | None = None

    def describe(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if v is not None}


def parse_policies(spec: str | None) -> list[str | None]:
    """`pow2,kvserve` -> ["pow2", "kvserve"]; None -> [None] (the policy deployed now)."""
    if not spec:
        return [None]
    names = [p.strip() for p in spec.split(",") if p.strip()]
    bad = [p for p in names if p not in POLICIES]
    if bad or not names:
        raise ValueError(f"unknown policy {bad}; choose from {', '.join(POLICIES)}")
    if len(set(names)) != len(names):
        raise ValueError("each policy may appear once in --policies")
    return list(names)


def load_tokenizer(model_cfg: Any, override: str | None = None) -> TokenizerLike:
    """The served model's tokenizer (prepared local dir for the embedded default model)."""
    from transformers import AutoTokenizer


    path = override or model_cfg.tokenizer or resolve_model_path(model_cfg)
    return AutoTokenizer.from_pretrained(path)


def apply_load(workload: Workload, load: LoadSpec, seed: int) -> Workload:
    """Closed loop needs nothing; an open loop gets seeded Poisson (optionally stepped) arrivals.

    A trace keeps its own timestamps unless a rate is given.
    """
    if load.concurrency is not None and load.rate is not None:
        raise ValueError("give either --concurrency or --rate, not both")
    if load.concurrency is not None:
        if load.concurrency < 1:
            raise ValueError("--concurrency must be >= 1")
        return workload
    if load.rate is None:
        if workload.name == "trace":
            return workload
        raise ValueError("multi-tenant needs --concurrency C or --rate R")
    shape = parse_load_shape(load.load_shape)
    arrivals = poisson_arrivals(load.rate, seed, len(workload.requests), shape, load.step_seconds)
    return workload.with_arrivals(arrivals)


def build_workload(
    kind: str,
    tok: TokenizerLike,
    *,
    seed: int,
    tenants: int,
    tenant_skew: str,
    system_tokens: int,
    question_tokens: int,
    output_tokens: int,
    requests: int,
    trace_file: str | None,
    length_scale: float,
    time_scale: float,
    max_requests: int | None,
    max_model_len: int | None,
) -> tuple[Workload, SafeVocab]:
    vocab = SafeVocab(tok)
    if kind == "multi-tenant":
        wl = multi_tenant(
            vocab,
            tenants=tenants,
            system_tokens=system_tokens,
            question_tokens=question_tokens,
            output_tokens=output_tokens,
            requests=requests,
            zipf_s=parse_skew(tenant_skew),
            seed=seed,
        )
    elif kind == "trace":
        if not trace_file:
            raise ValueError("--workload trace needs --trace-file FILE")
        wl = trace(
            vocab,
            trace_file,
            length_scale=length_scale,
            time_scale=time_scale,
            max_requests=max_requests,
            max_output_tokens=output_tokens,
            max_model_len=max_model_len,
            seed=seed,
        )
    else:
        raise ValueError(f"--workload must be multi-tenant or trace, got {kind!r}")
    return wl, vocab


def warmup_requests(vocab: SafeVocab, n: int, output_tokens: int, seed: int) -> Workload:
    """Short requests unrelated to the workload's prompts (own seed space): wake engines, seed no cache."""
    return multi_tenant(
        vocab, tenants=1, system_tokens=0, question_tokens=32, output_tokens=output_tokens,
        requests=max(1, n), seed=-1 - seed,
    )
