"""What the ingress hands a replica: a request already validated, templated and tokenized.

The classes expose `.messages` (chat) or `.prompt` (completion) because Ray's
PrefixCacheAffinityRouter reads exactly those attributes to do its text matching;
our own router reads `.block_hashes`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Work:
    request_id: str
    body: dict[str, Any]  # the OpenAI request body as sent
    engine_inputs: list[dict[str, Any]]  # vLLM's rendered prompts (token ids included)
    block_hashes: list[int]  # chained hashes of the prompt's full KV blocks
    num_prompt_tokens: int
    # vLLM's request model, validated and adjusted by the renderer (a tool parser may have added a
    # grammar): the replica serves this one. None: the replica validates `body` itself.
    request: Any = None
    tenant: str = "default"
    extra: dict[str, Any] = field(default_factory=dict)
    # Wall-clock time the ingress handed it to the router (0: unknown). A replica subtracts it
    # from its own clock to learn how long the request waited for room on some replica.
    submitted_at: float = 0.0
    # Tokens the request may generate: max_tokens x n (0: unbounded), for the router's KV accounting.
    expected_output_tokens: int = 0
    # Replicas this request must not go to again: their engine died, or the replica was lost, before
    # the request produced output (the ingress re-sends it; kvserve's router skips these).
    avoid_replicas: list[str] = field(default_factory=list)


@dataclass
class ChatWork(_Work):
    conversation: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class CompletionWork(_Work):
    prompt: Any = ""


# Items a replica's generate() yields, in order: one META, then SSE chunks or one BODY or one ERROR,
# or one RETRY: this replica cannot serve (its engine is dead) and the request has not started.
META, SSE, BODY, ERROR, RETRY = "meta", "sse", "body", "error", "retry"
