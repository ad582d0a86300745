"""A stand-in for vLLM's AsyncLLM + completion serving: streams SSE chunks on a batched step clock.

One engine steps every `step_s` (wall clock) and gives every running request one token per
step, as a decode batch does. A request's stream wakes on its tokens and yields one
vLLM-shaped completion chunk; tokens that arrived while it was not looking are merged into
that chunk, as vLLM's `RequestOutputCollector` merges deltas for a slow consumer. `work_s`
burns CPU per token in the output step (vLLM's detokenizing and output processing), in the
event loop that also runs the streams, as vLLM's output handler does.

Used by `bench.serving_path` to measure the serving path without a model.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator


def prompt_tokens(body: dict) -> int:
    """A completion body's prompt length as the fake engine counts it: token ids, else words."""
    prompt = body.get("prompt") or ""
    return len(prompt) if isinstance(prompt, list) else len(prompt.split())


class _Collector:
    def __init__(self, max_tokens: int) -> None:
        self.left = max_tokens
        self.pending = 0
        self.ready = asyncio.Event()


class FakeEngine:
    def __init__(self, step_s: float, work_s: float = 0.0, model: str = "fake") -> None:
        self.step_s, self.work_s, self.model = step_s, work_s, model
        self._running: set[_Collector] = set()
        self._task: asyncio.Task | None = None
        self.steps = 0

    def _ensure_stepping(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._step_loop())

    async def _step_loop(self) -> None:
        t0, done = time.perf_counter(), 0
        while self._running:
            delay = t0 + (done + 1) * self.step_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            # Every step the engine made since we last looked (it does not wait for a late loop).
            new = max(int((time.perf_counter() - t0) / self.step_s) - done, 1)
            done += new
            self.steps += new
            for c in list(self._running):
                got = min(new, c.left)
                c.left -= got
                c.pending += got
                if self.work_s:
                    _burn(self.work_s * got)
                c.ready.set()
                if c.left == 0:
                    self._running.discard(c)

    async def stream(self, prompt_tokens: int, max_tokens: int, entered: float | None = None) -> AsyncIterator[str]:
        """SSE chunks of one streaming completion: tokens, a usage chunk, [DONE].

        `entered`: the wall-clock time the request reached the server's handler; the first chunk
        carries it and its own send time (`kvserve_probe`) so a client can split its TTFT."""
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        c = _Collector(max_tokens)
        self._running.add(c)
        self._ensure_stepping()
        sent = 0
        try:
            while sent < max_tokens:
                await c.ready.wait()
                c.ready.clear()
                n, c.pending = c.pending, 0
                sent += n
                finish = "length" if sent >= max_tokens else None
                choice = {"index": 0, "text": " tok" * n, "logprobs": None, "finish_reason": finish,
                          "stop_reason": None}
                chunk = {"id": rid, "object": "text_completion", "created": created, "model": self.model,
                         "choices": [choice]}
                if entered is not None and sent == n:
                    chunk["kvserve_probe"] = {"entered": entered, "first_sent": time.time()}
                yield "data: " + json.dumps(chunk) + "\n\n"
            usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + sent,
                     "completion_tokens": sent, "prompt_tokens_details": {"cached_tokens": 0}}
            yield "data: " + json.dumps({"id": rid, "object": "text_completion", "created": created,
                                         "model": self.model, "choices": [], "usage": usage}) + "\n\n"
            yield "data: [DONE]\n\n"
        finally:
            self._running.discard(c)


def _burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
