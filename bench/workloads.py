"""Bench workloads: seeded lists of requests with exact token lengths.

`multi-tenant`: T tenants, each with its own S-token system prompt, unique Q-token
questions, O output tokens. `trace`: a Mooncake JSONL trace whose 512-token
blocks get deterministic content per block id (same id -> same tokens), scaled
down to fit a small model.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvserve.arrivals import popularity_weights
from bench.tokens import SafeVocab, encode_plain

MOONCAKE_BLOCK_TOKENS = 512


@dataclass(frozen=True)
class BenchRequest:
    idx: int
    prompt_ids: tuple[int, ...]
    prompt_text: str
    max_tokens: int
    tenant: str | None = None
    arrival_s: float | None = None  # open-loop arrival offset; None = closed loop

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)


@dataclass
class Workload:
    name: str
    requests: list[BenchRequest]
    params: dict[str, Any] = field(default_factory=dict)

    def with_arrivals(self, arrivals: list[float]) -> Workload:
        """Attach open-loop arrival offsets; extra requests beyond the schedule are dropped."""
        reqs = [
            BenchRequest(r.idx, r.prompt_ids, r.prompt_text, r.max_tokens, r.tenant, a)
            for r, a in zip(self.requests, arrivals)
        ]
        return Workload(self.name, reqs, dict(self.params))


def _check_roundtrip(vocab: SafeVocab, ids: list[int], what: str) -> str:
    text = vocab.text(ids)
    back = encode_plain(vocab.tok, text)
    if back != ids:
        raise ValueError(f"{what}: text does not re-tokenize to the same {len(ids)} ids (got {len(back)})")
    return text


def multi_tenant(
    vocab: SafeVocab,
    *,
    tenants: int,
    system_tokens: int,
    question_tokens: int,
    output_tokens: int,
    requests: int,
    zipf_s: float | None = None,
    seed: int = 0,
) -> Workload:
    """Requests of T tenants; tenant i's prompts all start with the same S-token system prompt."""
    if tenants < 1 or requests < 1 or question_tokens < 1 or output_tokens < 1 or system_tokens < 0:
        raise ValueError("tenants, requests, question_tokens, output_tokens must be >= 1")
    systems = [vocab.sample(random.Random(f"{seed}:system:{t}"), system_tokens) for t in range(tenants)]
    weights = popularity_weights(tenants, zipf_s)
    pick = random.Random(f"{seed}:tenants")
    qrng = random.Random(f"{seed}:questions")
    seen: set[tuple[int, ...]] = set()
    out: list[BenchRequest] = []
    for i in range(requests):
        t = pick.choices(range(tenants), weights)[0]
        for _ in range(100):  # unique questions: no request is a free cache hit on another
            q = tuple(vocab.sample(qrng, question_tokens))
            if q not in seen:
                break
        else:
            raise ValueError("could not draw unique questions; raise question_tokens")
        seen.add(q)
        ids = systems[t] + list(q)
        text = _check_roundtrip(vocab, ids, f"request {i}")
        out.append(BenchRequest(i, tuple(ids), text, output_tokens, tenant=f"tenant-{t}"))
    params = {
        "workload": "multi-tenant",
        "tenants": tenants,
        "tenant_skew": "uniform" if zipf_s is None else f"zipf:{zipf_s:g}",
        "system_tokens": system_tokens,
        "question_tokens": question_tokens,
        "output_tokens": output_tokens,
        "requests": requests,
        "seed": seed,
    }
    return Workload("multi-tenant", out, params)


def read_trace(path: str | Path, max_requests: int | None = None) -> list[dict]:
    rows: list[dict] = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            rows.append(json.loads(line))
            if max_requests is not None and len(rows) >= max_requests:
                break
    return rows


class BlockTokens:
    """Deterministic token content per trace block id (same id -> same tokens, any process)."""

    def __init__(self, vocab: SafeVocab, block_tokens: int, seed: int) -> None:
        self.vocab, self.block_tokens, self.seed = vocab, block_tokens, seed
        self._cache: dict[int, list[int]] = {}

    def __call__(self, block_id: int) -> list[int]:
        got = self._cache.get(block_id)
        if got is None:
            got = self.vocab.sample(random.Random(f"{self.seed}:block:{block_id}"), self.block_tokens)
            self._cache[block_id] = got
        return got


def trace(
    vocab: SafeVocab,
    path: str | Path,
    *,
    length_scale: float = 1.0,
    time_scale: float = 1.0,
    max_requests: int | None = None,
    max_output_tokens: int | None = None,
    max_model_len: int | None = None,
    seed: int = 0,
) -> Workload:
    """A Mooncake trace as requests with open-loop arrivals at timestamp × time_scale."""
    if length_scale <= 0 or time_scale < 0:
        raise ValueError("length_scale must be > 0 and time_scale >= 0")
    rows = read_trace(path, max_requests)
    block_len = max(1, round(MOONCAKE_BLOCK_TOKENS * length_scale))
    blocks = BlockTokens(vocab, block_len, seed)
    t0 = rows[0]["timestamp"] if rows else 0
    truncated = 0
    out: list[BenchRequest] = []
    for i, row in enumerate(rows):
        n_out = max(1, int(row["output_length"]))
        if max_output_tokens is not None:
            n_out = min(n_out, max_output_tokens)
        n_in = max(1, round(int(row["input_length"]) * length_scale))
        if max_model_len is not None and n_in + n_out > max_model_len:
            n_in, truncated = max(1, max_model_len - n_out), truncated + 1
        ids: list[int] = []
        for bid in row["hash_ids"][: math.ceil(n_in / block_len)]:
            ids.extend(blocks(int(bid)))
        if len(ids) < n_in:  # trace rows whose length overruns their blocks: unique filler
            ids.extend(vocab.sample(random.Random(f"{seed}:fill:{i}"), n_in - len(ids)))
        ids = ids[:n_in]
        text = _check_roundtrip(vocab, ids, f"trace row {i}")
        arrival = (row["timestamp"] - t0) / 1000.0 * time_scale
        out.append(BenchRequest(i, tuple(ids), text, n_out, arrival_s=arrival))
    params = {
        "workload": "trace",
        "trace_file": Path(path).name,
        "length_scale": length_scale,
        "time_scale": time_scale,
        "block_tokens": block_len,
        "requests": len(out),
        "max_output_tokens": max_output_tokens,
        "truncated_to_context": truncated,
        "seed": seed,
    }
    return Workload("trace", out, params)
