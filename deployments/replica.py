"""The vLLM replica: one AsyncLLM engine behind vLLM's own OpenAI serving layer.

The ingress has already validated, templated and tokenized the request; we hand
those engine inputs to vLLM's OpenAIServingChat/Completion (whose render step we
short-circuit), so the response format, usage (incl. cached_tokens) and errors
are vLLM's. Cancelling the caller's stream cancels our generator, and vLLM's
generate() aborts the request in the engine, freeing its KV blocks.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.datastructures import State

from autoscaling.window import SignalWindow
from deployments.errors import APIError, from_vllm, sse_error, vllm_exception
from deployments.kv_events import KVEventCollector, new_ipc_endpoint
from deployments.prefill_backlog import PrefillBacklog
from deployments.protocol import BODY, ERROR, META, RETRY, SSE, ChatWork, CompletionWork
from deployments.tier_stats import TierStats
from deployments.vllm_args import apply_engine_env, engine_cli_args, gpu_device_memory, parse_vllm_args
from deployments.vllm_compat import get, num_unfinished_requests, preflight, reset_prefix_cache
from kvserve.config import KVServeConfig

log = logging.getLogger("kvserve.replica")

# The pre-rendered (conversation, engine_inputs) of the request being served by this task.
_PRERENDERED: contextvars.ContextVar[Any] = contextvars.ContextVar("kvserve_prerendered", default=None)
# The kvserve request id of the request being served by this task (its prefill-backlog key).
_SERVING: contextvars.ContextVar[str | None] = contextvars.ContextVar("kvserve_serving", default=None)


# A stream whose engine died after its first token: the client has part of an answer; it must retry.
ENGINE_DIED_MID_STREAM = APIError(
    503, "the replica serving this stream lost its engine mid-response; the output is incomplete, retry the request",
    code="engine_dead")


def _payload(err: APIError) -> tuple[int, dict]:
    return err.status, err.body()


async def _drain(outputs: AsyncIterator[Any]) -> None:
    async for _ in outputs:
        pass


class LLMReplica:
    """Ray Serve deployment class (decorated in deployments.app)."""

    # Serve awaits an async constructor: the replica is only RUNNING once its engine is up.
    async def __init__(self, config: dict) -> None:  # type: ignore[misc]

        self.cfg = KVServeConfig.model_validate(config)
        apply_engine_env(self.cfg, claim_cores=True)
        self.replica_id = self._replica_id()
        endpoint = new_ipc_endpoint() if self.cfg.engine.enable_prefix_caching else None
        self.args = parse_vllm_args(engine_cli_args(self.cfg, kv_events_endpoint=endpoint,
                                                    device_memory_bytes=gpu_device_memory(self.cfg)))
        self.kv = KVEventCollector(endpoint, self.cfg.engine.block_size) if endpoint else None
        self.num_requests = 0
        self.aborted = 0
        self.backlog = PrefillBacklog()
        self.kv_capacity_tokens = 0
        self._ready = False
        self._init_task = None
        self._board = None
        self._last_post = 0.0
        self.cache_epoch: str | None = None  # set by reconfigure (deployments.app: the user_config)
        await self.ensure_started()

    @staticmethod
    def _replica_id() -> str:
        try:
            from ray import serve

            return serve.get_replica_context().replica_id.unique_id
        except Exception:
            return f"local-{os.getpid()}"

    async def _start(self) -> None:
        from deployments.engine_stats import COUNTERS, CounterStatLogger

        AsyncEngineArgs, AsyncLLM, init_app_state = get("AsyncEngineArgs"), get("AsyncLLM"), get("init_app_state")

        self.window = SignalWindow(look_back_s=self.cfg.autoscaling.look_back_s)
        self.tiers = TierStats(self.cfg)  # which tenants' SLO tiers sent requests lately (deployments.tier_stats)
        self.counters = COUNTERS
        COUNTERS.on_iteration = self._on_iteration
        engine_args = AsyncEngineArgs.from_cli_args(self.args)
        engine_args.disable_log_stats = False  # our stat logger needs the scheduler stats
        self.engine = AsyncLLM.from_engine_args(engine_args, stat_loggers=[CounterStatLogger])
        self._hook_first_output(self.engine)
        # The engine core reports its block count at start-up; the router packs prefix families by it.
        blocks = getattr(self.engine.vllm_config.cache_config, "num_gpu_blocks", None) or 0
        self.kv_capacity_tokens = int(blocks) * self.cfg.engine.block_size
        if self.kv:
            self.kv.start()
        state = State()
        await init_app_state(self.engine, state, self.args, supported_tasks=await self.engine.get_supported_tasks())
        self.chat = state.openai_serving_chat
        self.completion = state.openai_serving_completion
        self._install_prerendered(self.chat, "render_chat_request")
        self._install_prerendered(self.completion, "render_completion_request")
        await self._warm_hot_prefixes()
        self._ready = True
        self._watch_task = asyncio.ensure_future(self._watch_engine())
        log.info("replica %s ready (block_size=%s)", self.replica_id, self.cfg.engine.block_size)

    async def _warm_hot_prefixes(self) -> None:
        """Pre-fill the cluster's hottest prefixes before Serve routes traffic here (scale-up, restart)."""
        self.warmed_prefixes, self.warm_s = 0, 0.0
        n, budget = self.cfg.autoscaling.warm_prefixes, self.cfg.autoscaling.warm_timeout_s
        if not n or not self.kv:
            return
        start = time.monotonic()
        try:
            from deployments.stats_board import board

            SamplingParams = get("SamplingParams")

            # The ingress posts the warm set (router.hot_prefixes.HotPrefixTracker.warm_set): hottest
            # first, until they carry this replica's share of the hot traffic.
            hot = await board(self.cfg.app_name).get_hot.remote()
            for family in hot[:n]:
                left = budget - (time.monotonic() - start)
                if left <= 0:
                    break
                req_id = f"warm-{self.replica_id}-{self.warmed_prefixes}"
                prompt = {"prompt_token_ids": list(family.tokens)}
                if family.salt:  # the tenant's cache_salt, or the warmed blocks would be ones it never hits
                    prompt["cache_salt"] = family.salt
                try:  # the budget bounds start-up: a prefill that would pass it is cancelled (engine abort)
                    await asyncio.wait_for(_drain(self.engine.generate(prompt, SamplingParams(max_tokens=1), req_id)),
                                           left)
                except asyncio.TimeoutError:
                    break
                self.warmed_prefixes += 1
        except Exception:  # warming is an optimisation; never block start-up on it
            log.exception("prefix warm-up failed")
        self.warm_s = time.monotonic() - start
        if self.warmed_prefixes:
            log.info("warmed %d hot prefixes in %.1fs", self.warmed_prefixes, self.warm_s)

    @property
    def engine_dead(self) -> bool:
        """vLLM flags its engine dead the moment the engine-core process exits (its monitor thread)."""
        return getattr(self, "_ready", False) and bool(getattr(self.engine, "errored", False))

    async def _watch_engine(self) -> None:
        """Engine-death watch: from the engine's death on, this replica's routing stats say so (the
        router stops sending it requests at the next report), its health check fails (Serve replaces
        it) and requests that reach it anyway go back to the ingress unstarted (RETRY)."""
        period = self.cfg.router.stats_period_s
        while not self.engine_dead:
            await asyncio.sleep(period)
        log.error("replica %s: engine process died; failing health checks until Serve replaces this replica",
                  self.replica_id)

    @staticmethod
    def _install_prerendered(serving: Any, method: str) -> None:
        original = getattr(serving, method)

        async def render(request: Any) -> Any:
            pre = _PRERENDERED.get()
            if pre is None:
                return await original(request)
            err = await serving._check_model(request)
            if err is None:
                preflight(serving, request.n or 1)  # engine alive, admission: as vLLM's own render step
            return err if err is not None else pre

        setattr(serving, method, render)

    def _hook_first_output(self, engine: Any) -> None:
        """Clear a request's prefill backlog at the engine's first output, streaming or not."""
        original, backlog = engine.generate, self.backlog

        async def relay(outputs: Any, key: str | None) -> Any:
            try:
                async for out in outputs:
                    if key is not None:
                        backlog.done(key)
                        key = None  # once: later outputs are decode tokens
                    yield out
            finally:
                await outputs.aclose()  # closing us aborts the engine request, as closing vLLM's would

        # The key is read when vLLM calls generate(), in the request's own task context.
        engine.generate = lambda *a, **kw: relay(original(*a, **kw), _SERVING.get())

    def _on_iteration(self, ttfts: list[float], itls: list[float], finished_tokens: list[int]) -> None:
        now = time.monotonic()
        for t in ttfts:
            self.window.on_first_token(t * 1000.0, now)
        for t in itls:
            self.window.on_token_gap(t * 1000.0, now)
        for n in finished_tokens:
            self.window.on_completion(n, now)

    async def ensure_started(self) -> None:
        if self._init_task is None:
            self._init_task = asyncio.ensure_future(self._start())
        await asyncio.shield(self._init_task)

    # -- Serve hooks ---------------------------------------------------------------------------

    async def reconfigure(self, user_config: dict) -> None:
        """Serve calls this with the deployment's user_config at start and on every change. A new
        `cache_epoch` empties the prefix cache: `kvserve bench` starts each policy on empty caches
        without restarting engines (a GPU engine takes minutes to start)."""
        epoch = str((user_config or {}).get("cache_epoch", ""))
        if self.cache_epoch is not None and epoch != self.cache_epoch:
            await self._reset_prefix_cache()
        self.cache_epoch = epoch

    async def _reset_prefix_cache(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not await reset_prefix_cache(self.engine):  # requests still running hold blocks
            if time.monotonic() > deadline:
                raise RuntimeError(f"replica {self.replica_id}: prefix cache still in use after {timeout_s:.0f} s")
            await asyncio.sleep(0.5)
        if self.kv:
            self.kv.clear()
        log.info("replica %s: prefix cache emptied", self.replica_id)

    async def check_health(self) -> None:
        await self.ensure_started()
        await self.engine.check_health()

    async def record_routing_stats(self) -> dict[str, Any]:
        if not self._ready:
            return {"ready": False}
        if self.engine_dead:
            return {"ready": False, "engine_dead": True, "ts": time.time()}
        await self._post_stats()
        c = self.counters
        version, blocks = self.kv.snapshot() if self.kv else (0, [])
        return {
            "ready": True,
            "ts": time.time(),
            "block_size": self.cfg.engine.block_size,
            "blocks": blocks,
            "blocks_version": version,
            "waiting": c.waiting,
            "running": c.running,
            "queued_prefill_tokens": self.backlog.tokens,
            "kv_usage": c.kv_usage,
            "kv_capacity_tokens": self.kv_capacity_tokens,
        }

    async def record_autoscaling_stats(self) -> dict[str, float]:
        if not self._ready:
            return {}
        c = self.counters
        hit = c.prefix_cache_hits / c.prefix_cache_queries if c.prefix_cache_queries else None
        self.window.set_engine_state(c.waiting, c.running, c.kv_usage, hit)
        return {**self.window.to_stats_dict(), **self.tiers.stats()}

    async def _post_stats(self) -> None:
        now = time.monotonic()
        if now - self._last_post < 1.0:
            return
        self._last_post = now
        try:
            from deployments.stats_board import board

            if self._board is None:
                self._board = board(self.cfg.app_name)
            stats = await self.stats()
            stats["blocks"] = self.kv.snapshot()[1] if self.kv else []  # for /kvserve/debug/prefix
            self._board.put.remote(self.replica_id, stats)
        except Exception:  # stats are best-effort; serving must not depend on them
            log.exception("posting stats failed")
            self._board = None

    # -- requests ------------------------------------------------------------------------------

    async def stats(self) -> dict[str, Any]:
        await self.ensure_started()
        c = self.counters.as_dict()
        c.pop("on_iteration", None)
        return {
            "replica_id": self.replica_id,
            "posted_at": time.time(),  # wall clock: a reader can wait for counters newer than what it did
            "cache_epoch": self.cache_epoch,
            "num_requests": self.num_requests,
            "aborted": self.aborted,
            "unfinished": num_unfinished_requests(self.engine),
            "cached_blocks": len(self.kv.blocks) if self.kv else 0,
            "warmed_prefixes": self.warmed_prefixes,
            "warm_s": round(self.warm_s, 2),
            "kv_events": self.kv.events_seen if self.kv else 0,
            "queued_prefill_tokens": self.backlog.tokens,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            **c,
            "window": self.window.to_stats_dict(),
        }

    async def generate(self, work: ChatWork | CompletionWork) -> AsyncIterator[tuple[str, Any]]:
        await self.ensure_started()
        self.num_requests += 1
        # Counted when it reached the router (clocks of one cluster: skew of a few ms at most,
        # clamped), so a queue flushed onto this replica reads as the load it was, not a burst.
        waited = max(time.time() - work.submitted_at, 0.0) if work.submitted_at else 0.0
        self.window.on_arrival(work.num_prompt_tokens, waited_s=waited)
        self.tiers.saw(work.tenant)
        cached = self.kv.prefix_blocks(work.block_hashes) if self.kv else 0
        self.backlog.arrived(work.request_id, work.num_prompt_tokens, cached, self.cfg.engine.block_size)
        _SERVING.set(work.request_id)
        served = self._serve(work)
        try:
            yield META, {"replica_id": self.replica_id}
            if self.engine_dead:
                yield RETRY, {"reason": "engine_dead"}
                return
            async for item in served:
                yield item
        finally:
            self.backlog.done(work.request_id)  # errors and aborts too, not just the first output
            await served.aclose()  # a caller that went away aborts the engine request now, not at GC

    async def _create(self, work: ChatWork | CompletionWork) -> Any:
        """vLLM's serving layer on the request the ingress validated and rendered."""
        if isinstance(work, ChatWork):
            request = work.request or get("ChatCompletionRequest").model_validate(work.body)
            _PRERENDERED.set((work.conversation, work.engine_inputs))
            return await self.chat.create_chat_completion(request, None)
        request = work.request or get("CompletionRequest").model_validate(work.body)
        _PRERENDERED.set(work.engine_inputs)
        return await self.completion.create_completion(request, None)

    async def _serve(self, work: ChatWork | CompletionWork) -> AsyncIterator[tuple[str, Any]]:
        try:
            result = await self._create(work)
        except Exception as e:  # vLLM raises (not returns) what the engine's input checks refuse
            dead = self.engine_dead or type(e).__name__ == "EngineDeadError"
            yield (RETRY, {"reason": "engine_dead"}) if dead else (ERROR, _payload(vllm_exception(e)))
            return
        if hasattr(result, "__aiter__"):
            finished = False
            first = True
            try:
                async for chunk in result:
                    err = sse_error(chunk)
                    if err is not None and first:
                        # Failed before any output: no status sent yet, so the caller gets a real one.
                        finished = True
                        await result.aclose()
                        yield (RETRY, {"reason": "engine_dead"}) if self.engine_dead else (ERROR, _payload(err))
                        return
                    first = False
                    if err is not None and self.engine_dead:
                        err = ENGINE_DIED_MID_STREAM
                    yield SSE, chunk if err is None else f"data: {json.dumps(err.body())}\n\n"
                finished = True
            except Exception as e:  # the engine died under the stream
                if not (self.engine_dead or type(e).__name__ == "EngineDeadError"):
                    raise
                finished = True
                # Before any output: unstarted, the ingress re-sends it; after: an error event ends it.
                yield (RETRY, {"reason": "engine_dead"}) if first else (
                    SSE, f"data: {json.dumps(ENGINE_DIED_MID_STREAM.body())}\n\n")
            finally:
                if not finished:
                    # Caller went away: closing vLLM's generator aborts the request in the engine.
                    self.aborted += 1
                    await result.aclose()
        elif type(result).__name__ == "ErrorResponse":
            yield (RETRY, {"reason": "engine_dead"}) if self.engine_dead else (ERROR, _payload(from_vllm(result)))
        else:
            yield BODY, json.loads(result.model_dump_json(exclude_none=False))

    def __del__(self) -> None:
        try:
            if getattr(self, "kv", None):
                self.kv.stop()
            if getattr(self, "engine", None):
                self.engine.shutdown()
        except Exception:
            pass
