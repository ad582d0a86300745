"""`kvserve bench --sweep scenario`: each preset on the workload it is for, beside the preset it beats.

Four workloads, each with its owner preset, a contrast preset and the one metric the owner's reason
is about (kvserve/scenarios.py):

  chat           realtime-chat vs offline-batch  chats, some pasting 600 tokens: small steps keep the
                                                 chats' token gaps short
  offline-batch  offline-batch vs realtime-chat  64 in flight: the wide batch and big steps give tok/s
  long-document  long-document vs offline-batch  chats beside 1,800-token documents: chunked prefill
                                                 with a per-step cap keeps the chats' token gaps short
  edge           edge vs realtime-chat           one user, an output that repeats its prompt: n-gram
                                                 drafts emit several tokens a step

Each preset is deployed once (cold engines) and runs every workload it owns or contrasts. TPOT (time
per output token after the first) is the decode-speed metric, not the gap between stream chunks:
with speculative decoding one chunk carries several tokens.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from bench.metrics import percentile
from bench.runner import ReplayOptions, replay
from bench.workloads import BenchRequest, multi_tenant


@dataclass(frozen=True)
class ScenarioWorkload:
    name: str
    owner: str  # the preset this workload is for
    contrast: str  # the preset it is compared against
    metric: str  # the row key that decides
    higher_is_better: bool
    concurrency: int
    why: str  # the owner's reason, as the table states it


WORKLOADS: tuple[ScenarioWorkload, ...] = (
    ScenarioWorkload("chat", "realtime-chat", "offline-batch", "short_gap_p99_ms", False, 4,
                     "512-token steps, 256 tokens of one prompt a step: a pasted text prefills between the "
                     "chats' decode steps instead of in one long step"),
    ScenarioWorkload("offline-batch", "offline-batch", "realtime-chat", "output_tok_per_s", True, 64,
                     "batch width 64 and 4,096-token steps: more sequences share each step"),
    ScenarioWorkload("long-document", "long-document", "offline-batch", "short_gap_p99_ms", False, 3,
                     "a document prefills at most 512 tokens a step, so the chats beside it keep decoding"),
    ScenarioWorkload("edge", "edge", "realtime-chat", "tpot_p50_ms", False, 1,
                     "n-gram drafts from the prompt: a copying output gets several tokens a step"),
)
PRESET_ORDER = ("realtime-chat", "offline-batch", "long-document", "edge")
SHORT_TOKENS = 160  # prompts at most this long are the "chats" whose token gaps count


def plan(workloads: Sequence[ScenarioWorkload] = WORKLOADS) -> list[tuple[str, list[str]]]:
    """(preset, workloads it runs) in deploy order: every preset once, each workload under its owner and
    its contrast."""
    out = []
    for preset in PRESET_ORDER:
        names = [w.name for w in workloads if preset in (w.owner, w.contrast)]
        if names:
            out.append((preset, names))
    return out


def _chats_beside(vocab: Any, rng: random.Random, n: int, every: int, long_tokens: int) -> tuple[list, list[int]]:
    """`n` 128-token chats answered in 48 tokens, every `every`-th replaced by a `long_tokens` prompt answered in 8."""
    longs = [i % every == every - 1 for i in range(n)]
    return [vocab.sample(rng, long_tokens if lng else 128) for lng in longs], [8 if lng else 48 for lng in longs]


def _repeating(vocab, rng: random.Random, period: int, repeats: int) -> list[int]:
    return vocab.sample(rng, period) * repeats


def build_requests(name: str, vocab, seed: int) -> list[BenchRequest]:
    """The workload's requests (sent as token ids: the repeated and mixed prompts need not re-tokenize)."""
    def reqs(ids_list: Sequence[Sequence[int]], out_tokens: Sequence[int]) -> list[BenchRequest]:
        return [BenchRequest(i, tuple(ids), "", o, tenant=f"{name}-{i % 4}")
                for i, (ids, o) in enumerate(zip(ids_list, out_tokens))]

    rng = random.Random(f"{seed}:{name}")
    if name == "chat":  # 128-token chats; every fourth message pastes 600 tokens of text
        return reqs(*_chats_beside(vocab, rng, 20, every=4, long_tokens=600))
    if name == "offline-batch":  # unique 128-token prompts, 32 output tokens
        wl = multi_tenant(vocab, tenants=1, system_tokens=0, question_tokens=128, output_tokens=32, requests=128,
                          seed=seed)
        return reqs([r.prompt_ids for r in wl.requests], [32] * 128)
    if name == "long-document":  # every third request a fresh 1,800-token document, the rest 128-token chats
        return reqs(*_chats_beside(vocab, rng, 15, every=3, long_tokens=1800))
    if name == "edge":  # a 48-token passage repeated 4 times; the output goes on repeating it
        return reqs([_repeating(vocab, rng, 48, 4) for _ in range(6)], [64] * 6)
    raise ValueError(f"unknown scenario workload {name!r}")


def summarize_run(results: Sequence[Any], prompt_tokens: dict[int, int]) -> dict:
    """The row's metrics from the per-request results (bench.client.RequestResult); `prompt_tokens`:
    each request's prompt length by idx."""
    ok = [r for r in results if r.ok and r.ttft_s is not None and r.e2e_s is not None]
    tpot = [(r.e2e_s - r.ttft_s) / (r.output_tokens - 1) * 1000.0 for r in ok if r.output_tokens > 1]
    short = [r for r in ok if prompt_tokens[r.idx] <= SHORT_TOKENS]
    elapsed_s = _elapsed(results)
    short_gaps = [g * 1000.0 for r in short for g in r.itl_s]
    tokens = sum(r.output_tokens for r in ok)
    return {
        "requests": len(results), "errors": len(results) - len(ok),
        "ttft_p50_ms": percentile([r.ttft_s * 1000.0 for r in ok], 50),
        "ttft_p90_ms": percentile([r.ttft_s * 1000.0 for r in ok], 90),
        "tpot_p50_ms": percentile(tpot, 50), "tpot_p90_ms": percentile(tpot, 90),
        "short_gap_p99_ms": percentile(short_gaps, 99), "short_gap_max_ms": max(short_gaps, default=None),
        "output_tok_per_s": tokens / elapsed_s if elapsed_s > 0 else None,
    }


def verdicts(rows: Sequence[dict], workloads: Sequence[ScenarioWorkload] = WORKLOADS) -> list[dict]:
    """Per workload: its owner's and contrast's decisive metric, their ratio and whether the owner won."""
    by = {(r["workload"], r["preset"]): r for r in rows}
    out = []
    for w in workloads:
        own, other = by.get((w.name, w.owner)), by.get((w.name, w.contrast))
        a = own.get(w.metric) if own else None
        b = other.get(w.metric) if other else None
        ratio = (a / b if w.higher_is_better else b / a) if a and b else None
        out.append({"workload": w.name, "owner": w.owner, "contrast": w.contrast, "metric": w.metric,
                    "owner_value": a, "contrast_value": b, "owner_advantage": ratio,
                    "owner_wins": ratio is not None and ratio > 1.0 and not (own["errors"] or 0), "why": w.why})
    return out


Deploy = Callable[[str], None]  # deploy the preset, wait until it serves


def run_scenario_sweep(opts: ReplayOptions, vocab, deploy: Deploy, *, seed: int,
                       on_row: Callable[[dict], None] | None = None,
                       workloads: Sequence[ScenarioWorkload] = WORKLOADS) -> list[dict]:
    by_name = {w.name: w for w in workloads}
    rows = []
    for preset, names in plan(workloads):
        deploy(preset)
        for name in names:
            w = by_name[name]
            reqs = build_requests(name, vocab, seed)
            warm = build_requests(name, vocab, seed + 1)[:1]  # compiles this shape's kernels, excluded
            o = dataclasses.replace(opts, concurrency=w.concurrency, use_token_ids=True)
            run = asyncio.run(replay(o, reqs, policy=f"{preset}/{name}", warmup=warm))
            row = {"workload": name, "preset": preset, "role": "owner" if preset == w.owner else "contrast",
                   "concurrency": w.concurrency,
                   **summarize_run(run.results, {r.idx: r.prompt_tokens for r in reqs})}
            rows.append(row)
            if on_row:
                on_row(row)
    return rows


def _elapsed(results: Sequence[Any]) -> float:
    """First send to last answer (the warm-up before it excluded)."""
    starts = [r.start for r in results]
    ends = [r.start + r.elapsed_s for r in results if r.elapsed_s is not None]
    return (max(ends) - min(starts)) if starts and ends else 0.0
