"""OpenAI-compatible HTTP ingress (FastAPI on Ray Serve).

Per request: size limit -> auth (tenant) -> JSON -> vLLM's protocol model ->
model/limits checks -> vLLM's renderer (chat template + tokenize, once) ->
block hashes for the router -> replica handle (streamed) -> HTTP response.
Every failure before the engine is a 4xx with an OpenAI-style body; overload
is a 503 with Retry-After; nothing here can take the server down.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve

from deployments.auth import TenantAuth
from deployments.errors import APIError, error_response
from deployments.protocol import BODY, ERROR, META, SSE, ChatWork, CompletionWork
from kvserve.config import KVServeConfig
from router.block_hash import chain_hashes
from router.hot_prefixes import HotPrefixTracker, family_key

log = logging.getLogger("kvserve.ingress")

REPLICA_HEADER = "x-kvserve-replica"
TENANT_HEADER = "x-kvserve-tenant"

app = FastAPI(title="kvserve", docs_url=None, redoc_url=None)


@serve.ingress(app)
class Ingress:
    """Serve ingress deployment class (made a deployment in deployments.app)."""

    async def __init__(self, llm_handle: Any, config: dict) -> None:  # type: ignore[misc]
        from deployments.metrics import IngressMetrics

        self.cfg = KVServeConfig.model_validate(config)
        self.llm = llm_handle
        self.auth = TenantAuth(self.cfg.tenants)
        self.metrics = IngressMetrics()
        self._renderer = None
        self._board = None
        self.hot = HotPrefixTracker(self.cfg.engine.block_size)
        self._hot_dirty = False
        if self.cfg.autoscaling.warm_prefixes:
            self._hot_task = asyncio.get_running_loop().create_task(self._post_hot_every(5.0))
        await self.renderer()  # load tokenizer + chat template now, not on the first request

    # -- setup ------------------------------------------------------------------------------

    async def renderer(self):
        """vLLM's OnlineRenderer (chat templates + tokenizer), built without an engine."""
        if self._renderer is None:
            from starlette.datastructures import State
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.entrypoints.launchers.render.app_state import init_render_app_state

            from deployments.vllm_args import apply_engine_env, engine_cli_args, parse_vllm_args

            apply_engine_env(self.cfg)
            args = parse_vllm_args(engine_cli_args(self.cfg))
            vllm_config = AsyncEngineArgs.from_cli_args(args).create_engine_config()
            state = State()
            await init_render_app_state(vllm_config, state, args)
            self._state = state
            self._renderer = state.online_renderer
        return self._renderer

    # -- request pipeline -----------------------------------------------------------------------

    async def _read_json(self, request: Request) -> dict:
        limit = self.cfg.server.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise APIError(413, f"request body is {declared} bytes; the limit is {limit} bytes")
        body = b""
        async for part in request.stream():
            body += part
            if len(body) > limit:
                raise APIError(413, f"request body exceeds the limit of {limit} bytes")
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise APIError(400, f"request body is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise APIError(400, "request body must be a JSON object")
        return data

    def _tenant(self, request: Request) -> str:
        tenant = self.auth.tenant_for(request.headers.get("authorization"))
        if tenant is None:
            raise APIError(401, "missing or invalid API key (send `Authorization: Bearer <key>`)")
        return tenant

    def _check_limits(self, data: dict) -> None:
        if data.get("model") != self.cfg.model.name:
            raise APIError(404, f"model {data.get('model')!r} does not exist; this server serves {self.cfg.model.name!r}", "model")
        for key in ("max_tokens", "max_completion_tokens"):
            val = data.get(key)
            if val is None:
                continue
            if not isinstance(val, int) or isinstance(val, bool) or val <= 0:
                raise APIError(400, f"{key} must be a positive integer, got {val!r}", key)
            if val > self.cfg.server.max_tokens_limit:
                raise APIError(400, f"{key}={val} exceeds this server's limit of {self.cfg.server.max_tokens_limit}", key)
        n = data.get("n", 1)
        if n is not None and n != 1:
            raise APIError(400, "only n=1 is supported", "n")

    async def _render(self, kind: str, data: dict, tenant: str) -> ChatWork | CompletionWork:
        from pydantic import ValidationError
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest
        from vllm.exceptions import VLLMClientError

        renderer = await self.renderer()
        model_cls = ChatCompletionRequest if kind == "chat" else CompletionRequest
        try:
            req = model_cls.model_validate(data)
            # Sampling-parameter validation (temperature, top_p, ...) without touching an engine.
            req.to_sampling_params(req.max_tokens or 16, {})
            result = await (renderer.render_chat(req) if kind == "chat" else renderer.render_completion(req))
        except ValidationError as e:
            first = e.errors()[0]
            raise APIError(400, f"invalid request: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
        except (ValueError, TypeError, VLLMClientError) as e:  # bad sampling params, prompt too long, ...
            raise APIError(400, str(e), getattr(e, "parameter", None)) from None
        if type(result).__name__ == "ErrorResponse":
            body = json.loads(result.model_dump_json())["error"]
            raise APIError(400, body.get("message", "invalid request"))
        if kind == "chat":
            conversation, engine_inputs = result
        else:
            conversation, engine_inputs = None, result
        if len(engine_inputs) != 1:
            raise APIError(400, "exactly one prompt per request is supported", "prompt")
        tokens = engine_inputs[0].get("prompt_token_ids") or []
        hashes = chain_hashes(tokens, self.cfg.engine.block_size)
        self._note_hot(tenant, hashes, tokens)
        rid = f"{kind}-{uuid.uuid4().hex[:16]}"
        common = dict(request_id=rid, body=data, engine_inputs=list(engine_inputs), block_hashes=hashes,
                      num_prompt_tokens=len(tokens), tenant=tenant, submitted_at=time.time())
        if kind == "chat":
            return ChatWork(conversation=list(conversation), messages=data.get("messages", []), **common)
        return CompletionWork(prompt=data.get("prompt", ""), **common)

    def _note_hot(self, tenant: str, hashes: list[int], tokens: list[int]) -> None:
        """Track hot prefixes (keyed by tenant + the prompt's second block) for scale-up warming."""
        if len(hashes) < 2 or not self.cfg.autoscaling.warm_prefixes:
            return
        self.hot.observe(family_key(tenant, hashes), tokens, time.monotonic())
        self._hot_dirty = True

    async def _post_hot_every(self, period_s: float) -> None:
        """Post the hot set to the stats board while it changes. On a timer, not on arrival: a
        replica that starts after a quiet spell must still see the last requests before it."""
        while True:
            await asyncio.sleep(period_s)
            if not self._hot_dirty:
                continue
            self._hot_dirty = False
            try:
                a = self.cfg.autoscaling  # families under the floor are not worth a replica's start-up time
                hot = self.hot.hottest(a.warm_prefixes * 4, time.monotonic(), a.warm_min_requests)
                self._stats_board().put_hot.remote(hot)
            except Exception:
                log.exception("posting hot prefixes failed")

    async def serve_openai(self, kind: str, request: Request):
        start = time.monotonic()
        tenant = "unknown"
        try:
            tenant = self._tenant(request)
            data = await self._read_json(request)
            self._check_limits(data)
            work = await self._render(kind, data, tenant)
        except APIError as e:
            self.metrics.request_done(tenant, kind, e.status, time.monotonic() - start)
            return e.response()
        return await self._dispatch(kind, work, start)

    async def _dispatch(self, kind: str, work: ChatWork | CompletionWork, start: float):
        from ray.serve.exceptions import BackPressureError

        tenant = work.tenant
        # gRPC, not Ray's object streaming: every SSE chunk is one streamed item, and over gRPC an
        # item costs the replica a third and this ingress under half of the CPU (bench.serving_path).
        gen = self.llm.options(stream=True, _by_reference=False).generate.remote(work)
        try:
            # The replica's first item (META) comes as soon as one has taken the request: the wait
            # for it (from the request's arrival here) is bounded, so an overload answers 503, not a hang.
            wait = self.cfg.server.max_queue_wait_s
            left = None if wait is None else max(wait - (time.monotonic() - start), 0.001)
            _, meta = await asyncio.wait_for(gen.__anext__(), left)
            kind_item, payload = await gen.__anext__()
        except BackPressureError:
            self.metrics.request_done(tenant, kind, 503, time.monotonic() - start)
            return error_response(503, "server overloaded: too many queued requests, retry later",
                                  headers={"Retry-After": "1"})
        except asyncio.TimeoutError:
            gen.cancel()  # leave the routers' queue
            self.metrics.request_done(tenant, kind, 503, time.monotonic() - start)
            return error_response(
                503, f"server overloaded: no replica could take the request within "
                     f"{self.cfg.server.max_queue_wait_s:g} s, retry later", headers={"Retry-After": "5"})
        except Exception as e:  # replica died mid-request, engine error, ...
            log.exception("request %s failed", work.request_id)
            self.metrics.request_done(tenant, kind, 500, time.monotonic() - start)
            return error_response(500, f"internal error: {type(e).__name__}")
        headers = {REPLICA_HEADER: meta["replica_id"], TENANT_HEADER: tenant}
        if kind_item == ERROR:
            status, body = payload
            self.metrics.request_done(tenant, kind, status, time.monotonic() - start)
            return JSONResponse(body, status_code=status, headers=headers)
        if kind_item == BODY:
            self.metrics.request_done(tenant, kind, 200, time.monotonic() - start, payload.get("usage"))
            return JSONResponse(payload, headers=headers)

        first_chunk = payload
        metrics = self.metrics

        async def stream():
            ok = False
            try:
                yield first_chunk
                async for item_kind, chunk in gen:
                    if item_kind == SSE:
                        yield chunk
                ok = True
            finally:
                if not ok:
                    gen.cancel()  # client went away: cancel the replica call -> engine abort
                metrics.request_done(tenant, kind, 200 if ok else 499, time.monotonic() - start)

        return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)

    # -- cluster views ----------------------------------------------------------------------------

    def _stats_board(self):
        if self._board is None:
            from deployments.stats_board import board

            self._board = board(self.cfg.app_name)
        return self._board

    async def replica_stats(self) -> list[dict]:
        stats = await self._stats_board().get.remote(max_age_s=max(3.0, 4 * self.cfg.router.stats_period_s))
        live = await self._live_replica_ids()
        if live is not None:
            stats = [s for s in stats if s["replica_id"] in live]
        return sorted(stats, key=lambda s: s["replica_id"])

    async def _live_replica_ids(self) -> set[str] | None:
        try:
            from ray.util.state import list_actors

            actors = list_actors(filters=[("state", "=", "ALIVE")], limit=10_000, raise_on_missing_output=False)
            return {a.name.rsplit("#", 1)[-1] for a in actors if a.name and "LLMReplica" in a.name}
        except Exception:
            return None

    async def ready(self) -> tuple[bool, dict]:
        from ray import serve

        st = serve.status().applications.get(self.cfg.app_name)
        if st is None:
            return False, {"status": "not deployed"}
        dep = st.deployments.get("LLMReplica")
        running = dep.replica_states.get("RUNNING", 0) if dep else 0
        ok = bool(dep) and dep.status == "HEALTHY" and running > 0
        return ok, {"status": "ready" if ok else "not ready", "deployment": dep.status if dep else None,
                    "running_replicas": running}

    # -- routes -------------------------------------------------------------------------------

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request):
        return await self.serve_openai("chat", request)

    @app.post("/v1/completions")
    async def completions(self, request: Request):
        return await self.serve_openai("completion", request)

    @app.get("/v1/models")
    async def models(self, request: Request):
        if self.auth.tenant_for(request.headers.get("authorization")) is None:
            return error_response(401, "missing or invalid API key (send `Authorization: Bearer <key>`)")
        return {"object": "list", "data": [{
            "id": self.cfg.model.name, "object": "model", "created": int(time.time()),
            "owned_by": "kvserve", "root": self.cfg.model.source, "max_model_len": self.cfg.model.max_model_len,
        }]}

    @app.get("/health")
    async def health(self):
        return {"status": "ok"}

    @app.get("/ready")
    async def ready_route(self):
        ok, body = await self.ready()
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/kvserve/stats")
    async def stats_route(self):
        stats = await self.replica_stats()
        return {"replicas": [{k: v for k, v in s.items() if k != "blocks"} for s in stats]}

    @app.post("/kvserve/debug/prefix")
    async def debug_prefix(self, request: Request):
        """Which replica holds how much of this request's prefix (from the engines' KV events)."""
        try:
            tenant = self._tenant(request)
            data = await self._read_json(request)
            kind = "chat" if "messages" in data else "completion"
            self._check_limits(data)
            work = await self._render(kind, data, tenant)
        except APIError as e:
            return e.response()
        matches = {}
        for s in await self.replica_stats():
            held = set(s.get("blocks") or ())
            n = 0
            for h in work.block_hashes:
                if h not in held:
                    break
                n += 1
            matches[s["replica_id"]] = n
        return {"num_prompt_tokens": work.num_prompt_tokens, "num_blocks": len(work.block_hashes),
                "block_size": self.cfg.engine.block_size, "matched_blocks": matches}

    @app.get("/kvserve/config")
    async def config_route(self):
        from kvserve.config import redacted

        cfg = self.cfg
        if not cfg.autoscaling.enabled:
            # We are bound without the replica count (a resize must not restart us), so report the
            # replicas serving now: tools that redeploy from this config (bench) must keep the size.
            live = len(await self.replica_stats())
            if live:
                cfg = cfg.model_copy(update={"num_replicas": live})
        return redacted(cfg)

    @app.get("/metrics")
    async def metrics_route(self):
        from fastapi.responses import Response

        body, content_type = self.metrics.render(await self.replica_stats())
        return Response(body, media_type=content_type)
