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
from collections.abc import Collection
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError
from ray.util.state import list_actors
from starlette.datastructures import State

from deployments import serve_state
from deployments.access_log import AccessLog, stream_usage
from deployments.auth import TenantAuth
from deployments.batch_routes import BatchRoutes, batch_router
from deployments.flow_gate import Overloaded, flow_gate_for
from deployments.cold_start import ColdStart
from deployments.errors import (APIError, error_body, error_response, from_vllm, install_error_handlers,
                                 validate_model, vllm_errors_as_api_errors)
from deployments.ingress_limits import IngressLimits
from deployments.lazy_fields import materialize_request
from deployments.limit_board import limit_board
from deployments.metrics import IngressMetrics
from deployments.protocol import BODY, ERROR, META, RETRY, SSE, ChatWork, CompletionWork
from deployments.request_checks import check_choices, check_context, check_messages
from deployments.stats_board import board
from deployments.stream_usage import HIDE_USAGE, ask_usage
from deployments.tenant_classes import tenant_classes
from deployments.tenant_salt import request_salt
from deployments.vllm_args import apply_engine_env, engine_cli_args, parse_vllm_args
from deployments.vllm_compat import get, init_renderer, validate_token_ids
from kvserve.config import KVServeConfig, redacted
from router.block_hash import chain_hashes, salted_root
from router.hot_prefixes import HotPrefixTracker, family_key

log = logging.getLogger("kvserve.ingress")

REPLICA_HEADER = "x-kvserve-replica"
TENANT_HEADER = "x-kvserve-tenant"
REPLICA_LOST_MID_STREAM = ("the replica serving this stream was lost mid-response; the output is incomplete, "
                           "retry the request")

app = FastAPI(title="kvserve", docs_url=None, redoc_url=None)
install_error_handlers(app)  # 404/405/422/unhandled: OpenAI's error body too
app.include_router(batch_router)  # /v1/files, /v1/batches (deployments.batch_routes)


def _content_part_types() -> Collection[str]:
    return get("MM_PARSER_MAP").keys()


@serve.ingress(app)
class Ingress(BatchRoutes):
    """Serve ingress deployment class (made a deployment in deployments.app)."""

    async def __init__(self, llm_handle: Any, config: dict) -> None:  # type: ignore[misc]

        from deployments.openapi import install as install_openapi

        self.cfg = KVServeConfig.model_validate(config)
        install_openapi(app, self.cfg)  # /openapi.json with vLLM's request models and our limits
        self.llm = llm_handle
        self.auth = TenantAuth(self.cfg.tenants)
        classes = tenant_classes(self.cfg.tenants)
        self.metrics = IngressMetrics(classes)
        self.limits = IngressLimits(self.cfg.tenants.classes, classes, lambda: limit_board(self.cfg.app_name),
                                    self.cfg.model.max_model_len)
        self.cold = ColdStart(self.cfg, self._running_replicas, self.metrics.registry)  # scale from zero
        self.access = AccessLog(prompts=self.cfg.logging.prompts)
        self._renderer = None
        self._board = None
        self.hot = HotPrefixTracker(self.cfg.engine.block_size)
        self._hot_dirty = False
        if self.cfg.autoscaling.warm_prefixes:
            self._hot_task = asyncio.get_running_loop().create_task(self._post_hot_every(5.0))
        self.flow = flow_gate_for(self.cfg, self._stats_board)  # None: flow control off (Serve's FIFO)
        await self.renderer()  # load tokenizer + chat template now, not on the first request
        self.start_batch()  # the Batch API's store and its lowest-priority worker

    # -- setup ------------------------------------------------------------------------------

    async def renderer(self):
        """vLLM's OnlineRenderer (chat templates + tokenizer), built without an engine."""
        if self._renderer is None:
            apply_engine_env(self.cfg)
            args = parse_vllm_args(engine_cli_args(self.cfg))
            vllm_config = get("AsyncEngineArgs").from_cli_args(args).create_engine_config()
            state = State()
            self._renderer = await init_renderer(vllm_config, state, args)
            self._state = state
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

    def _check_model(self, data: dict, required: bool = True) -> None:
        model = data.get("model")
        if model is None and not required:
            return
        if model is None:
            raise APIError(400, "Missing required parameter: 'model'.", "model", "missing_required_parameter")
        if model != self.cfg.model.name:
            raise APIError(404, f"The model {model!r} does not exist; this server serves {self.cfg.model.name!r}.",
                           "model", "model_not_found")

    def _check_limits(self, kind: str, data: dict) -> None:
        self._check_model(data)
        for key in ("max_tokens", "max_completion_tokens"):
            val = data.get(key)
            if val is None:
                continue
            if not isinstance(val, int) or isinstance(val, bool) or val <= 0:
                raise APIError(400, f"{key} must be a positive integer, got {val!r}", key)
            if val > self.cfg.server.max_tokens_limit:
                raise APIError(400, f"{key}={val} exceeds this server's limit of {self.cfg.server.max_tokens_limit}", key)
        check_choices(data.get("n"), self.cfg.server.max_n)
        if kind == "chat":
            check_messages(data.get("messages"), _content_part_types())

    async def _render(self, kind: str, data: dict, tenant: str) -> ChatWork | CompletionWork:
        renderer = await self.renderer()
        model_cls = get("ChatCompletionRequest" if kind == "chat" else "CompletionRequest")
        salt = request_salt(tenant, data.get("cache_salt"), self.cfg.tenants.cache_isolation)
        if salt != data.get("cache_salt"):
            data = {**data, "cache_salt": salt}
        data, hide_usage = ask_usage(data)  # limits and metrics settle with every stream's usage
        with vllm_errors_as_api_errors():
            req = validate_model(model_cls, data)
            materialize_request(req)  # lazily validated iterables -> lists (picklable, re-readable)
            # Sampling-parameter validation (temperature, top_p, ...) without touching an engine.
            req.to_sampling_params(req.max_tokens or 16, {})
            # Renders, and lets the tool/reasoning parser adjust `req` (e.g. a tool-call grammar).
            result = await (renderer.render_chat(req) if kind == "chat" else renderer.render_completion(req))
        if type(result).__name__ == "ErrorResponse":
            raise from_vllm(result)
        if kind == "chat":
            conversation, engine_inputs = result
        else:
            conversation, engine_inputs = None, result
        if len(engine_inputs) != 1:
            raise APIError(400, "exactly one prompt per request is supported", "prompt")
        tokens = engine_inputs[0].get("prompt_token_ids") or []
        prompt_param = "messages" if kind == "chat" else "prompt"
        if not tokens:
            raise APIError(400, "The prompt is empty: it must contain at least one token.", prompt_param)
        with vllm_errors_as_api_errors():  # vLLM's own out-of-vocabulary check, before any engine sees them
            validate_token_ids(renderer, tokens, prompt_param)
        completion_tokens = (req.max_completion_tokens or req.max_tokens) if kind == "chat" else req.max_tokens
        check_context(len(tokens), completion_tokens, self.cfg.model.max_model_len, prompt_param)
        hashes = chain_hashes(tokens, self.cfg.engine.block_size, salted_root(salt))
        self._note_hot(tenant, hashes, tokens, salt)
        rid = f"{kind}-{uuid.uuid4().hex[:16]}"
        common = dict(request_id=rid, body=data, request=req, engine_inputs=list(engine_inputs), block_hashes=hashes,
                      num_prompt_tokens=len(tokens), tenant=tenant, submitted_at=time.time(),
                      expected_output_tokens=(completion_tokens or 0) * (req.n or 1))
        if hide_usage:
            common["extra"] = {HIDE_USAGE: True}
        if kind == "chat":
            return ChatWork(conversation=list(conversation), messages=data.get("messages", []), **common)
        return CompletionWork(prompt=data.get("prompt", ""), **common)

    def _note_hot(self, tenant: str, hashes: list[int], tokens: list[int], salt: str | None) -> None:
        """Track hot prefixes (per family: tenant + the prompt's second block) for scale-up warming."""
        if len(hashes) < 2 or not self.cfg.autoscaling.warm_prefixes:
            return
        self.hot.observe(family_key(tenant, hashes), tokens, time.monotonic(), salt, block_hashes=hashes)
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
                a = self.cfg.autoscaling  # prefixes under the floor are not worth a replica's start-up time
                try:
                    serving = await self._running_replicas()
                except Exception:
                    serving = 1
                # The set one more replica than serve now pre-fills: its share of the hot traffic.
                hot = self.hot.warm_set(time.monotonic(), serving + 1, a.warm_min_requests, a.warm_prefixes)
                self._stats_board().put_hot.remote(hot)
            except Exception:
                log.exception("posting hot prefixes failed")

    def _finished(self, tenant: str, kind: str, status: int, start: float, usage: dict | None = None, *,
                  work: ChatWork | CompletionWork | None = None, body: dict | None = None,
                  replica: str | None = None) -> None:
        """A request is answered: count it (metrics) and write its access line."""
        seconds = time.monotonic() - start
        self.metrics.request_done(tenant, kind, status, seconds, usage)
        if work is not None and getattr(self, "limits", None):
            self.limits.finish(work.request_id, status, usage)
        self.access.request_done(tenant, kind, status, seconds, work=work, body=body, replica=replica, usage=usage)

    async def serve_openai(self, kind: str, request: Request):
        start = time.monotonic()
        tenant, data = "unknown", None
        try:
            tenant = self._tenant(request)
            data = await self._read_json(request)
            self._check_limits(kind, data)
            work = await self._render(kind, data, tenant)
            admitted = await self.limits.admit(work.request_id, tenant, work.num_prompt_tokens,
                                               work.expected_output_tokens)
        except APIError as e:  # a tenant limit's 429 too (with Retry-After and x-ratelimit-* headers)
            self._finished(tenant, kind, e.status, start, body=data)
            return e.response()
        response = await self._dispatch(kind, work, start)
        if admitted is not None:
            response.headers.update(admitted.headers)  # OpenAI's x-ratelimit-*, on every answer
        return response

    async def _first_items(self, work: ChatWork | CompletionWork, start: float,
                           on_taken: Any = None) -> tuple[Any, dict, str, Any]:
        """Send the request to a replica; (its stream, META, first item kind, payload). A request
        that produced nothing yet on a replica that lost its engine (RETRY) or died (Ray's actor
        errors) is re-sent elsewhere, up to `server.replica_retries` times: it never started, so the
        client cannot see it twice."""
        retries = self.cfg.server.replica_retries
        cs = getattr(self, "cold", None)  # (absent from the test doubles of this method)
        cold = bool(cs) and await cs.no_replica_serving()  # scaled to zero: wait for the first replica's start
        while True:
            # gRPC, not Ray's object streaming: every SSE chunk is one streamed item, and over gRPC an
            # item costs the replica a third and this ingress under half of the CPU (bench.serving_path).
            gen = self.llm.options(stream=True, _by_reference=False).generate.remote(work)
            meta: dict = {}
            try:
                # The replica's first item (META) comes as soon as one has taken the request: the wait
                # for it (from the request's arrival here) is bounded, so an overload answers 503, not a hang.
                wait = cs.wait_s(cold) if cs else self.cfg.server.max_queue_wait_s
                left = None if wait is None else max(wait - (time.monotonic() - start), 0.001)
                if cold:
                    cs.held.inc()
                try:
                    _, meta = await asyncio.wait_for(gen.__anext__(), left)
                finally:
                    if cold:
                        cs.held.dec()
                self.metrics.taken(work.tenant, time.monotonic() - start)
                if on_taken:
                    on_taken()  # a replica has it: batch lines may run beside it
                kind_item, payload = await gen.__anext__()
            except asyncio.TimeoutError:
                gen.cancel()  # leave the routers' queue
                if cold:
                    raise APIError(503, f"no replica started within {wait:g} s (scaled to zero: the first "
                                        "replica is starting); retry later", code="cold_start_timeout") from None
                raise
            except RayActorError as e:
                if retries <= 0:
                    raise APIError(503, f"the replica serving this request was lost ({type(e).__name__}); retry "
                                        "the request", code="replica_lost") from e
                reason = type(e).__name__
            else:
                if kind_item != RETRY:
                    if cold:
                        cs.first_token(start)
                    return gen, meta, kind_item, payload
                if retries <= 0:
                    raise APIError(503, "every replica tried for this request had lost its engine; retry the "
                                        "request", code="engine_dead")
                reason = payload.get("reason", "retry")
            retries -= 1
            if meta.get("replica_id"):
                work.avoid_replicas.append(meta["replica_id"])
            log.warning("request %s: replica %s lost before any output (%s); re-sending it", work.request_id,
                        meta.get("replica_id", "?"), reason)

    async def _dispatch(self, kind: str, work: ChatWork | CompletionWork, start: float, interactive: bool = True):
        """`interactive`: an HTTP request, which batch lines yield to (deployments.batch_worker.PriorityGate)."""
        tenant = work.tenant
        gate = getattr(self, "batch_gate", None) if interactive else None
        token, streamed, slot = (gate.interactive_started() if gate else 0), False, None
        try:
            try:
                flow = getattr(self, "flow", None)
                if flow:  # replicas saturated: wait in the fair queue (503 past its bounds)
                    wait = self.cfg.server.max_queue_wait_s
                    slot = await flow.acquire(work, interactive, None if wait is None else start + wait)
                gen, meta, kind_item, payload = await self._first_items(
                    work, start, (lambda: gate.interactive_taken(token)) if gate else None)
            except Overloaded as e:  # the fair queue's bounds (deployments.flow_gate)
                self._finished(tenant, kind, 503, start, work=work)
                return e.response()
            except APIError as e:  # lost replicas, retries spent
                log.error("request %s failed: %s", work.request_id, e.message)
                self._finished(tenant, kind, e.status, start, work=work)
                return error_response(e.status, e.message, code=e.code, headers={"Retry-After": "1"})
            except BackPressureError:
                self._finished(tenant, kind, 503, start, work=work)
                return error_response(503, "server overloaded: too many queued requests, retry later",
                                      headers={"Retry-After": "1"})
            except asyncio.TimeoutError:
                self._finished(tenant, kind, 503, start, work=work)
                return error_response(
                    503, f"server overloaded: no replica could take the request within "
                         f"{self.cfg.server.max_queue_wait_s:g} s, retry later", headers={"Retry-After": "5"})
            except Exception as e:  # engine error, ...
                log.exception("request %s failed", work.request_id)
                self._finished(tenant, kind, 500, start, work=work)
                return error_response(500, f"internal error: {type(e).__name__}")
            replica = meta["replica_id"]
            headers = {REPLICA_HEADER: replica, TENANT_HEADER: tenant}
            if kind_item == ERROR:  # the replica's error, already in OpenAI's shape
                status, body = payload
                self._finished(tenant, kind, status, start, work=work, replica=replica)
                return JSONResponse(body, status_code=status, headers=headers)
            if kind_item == BODY:
                self._finished(tenant, kind, 200, start, payload.get("usage"), work=work, replica=replica)
                if slot:
                    slot.release((payload.get("usage") or {}).get("completion_tokens"))
                return JSONResponse(payload, headers=headers)

            first_chunk = payload
            finished = self._finished
            timer = self.metrics.stream_timer(tenant, start)
            timer.chunk()
            hide_usage = work.extra.get(HIDE_USAGE, False)

            async def stream():
                ok, status, usage = False, 499, stream_usage(first_chunk)
                try:
                    yield first_chunk
                    try:
                        async for item_kind, chunk in gen:
                            if item_kind == SSE:
                                chunk_usage = stream_usage(chunk)  # the last chunk has it (deployments.stream_usage)
                                if chunk_usage:
                                    usage = chunk_usage
                                    if hide_usage:
                                        continue
                                elif not (isinstance(chunk, str) and chunk.startswith("data: [DONE]")):
                                    timer.chunk()
                                yield chunk
                    except Exception as e:  # the replica was lost mid-stream: the client gets an error event
                        log.error("request %s: replica %s lost mid-stream (%s)", work.request_id, replica,
                                  type(e).__name__)
                        status = 503
                        yield f"data: {json.dumps(error_body(503, REPLICA_LOST_MID_STREAM, code='replica_lost'))}\n\n"
                        return
                    ok, status = True, 200
                finally:
                    if not ok:
                        gen.cancel()  # client went away: cancel the replica call -> engine abort
                    finished(tenant, kind, status, start, usage, work=work, replica=replica)
                    if slot:
                        slot.release((usage or {}).get("completion_tokens"))
                    if gate:
                        gate.interactive_done(token)

            streamed = True
            return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)
        finally:
            if slot and not streamed:  # a stream releases its own slot
                slot.release()
            if gate:
                gate.interactive_taken(token)
                if not streamed:  # a stream reports its own end
                    gate.interactive_done(token)

    async def tokenization(self, op: str, request: Request):
        """/tokenize and /detokenize: vLLM's own protocol models and ServingTokenization, on the
        tokenizer and chat template the ingress already holds (no replica involved)."""
        DetokenizeRequest, TokenizeChatRequest, TokenizeCompletionRequest = (
            get(n) for n in ("DetokenizeRequest", "TokenizeChatRequest", "TokenizeCompletionRequest"))

        try:
            self._tenant(request)
            data = await self._read_json(request)
            self._check_model(data, required=False)
            serving = self._state.serving_tokenization
            if op == "detokenize":
                with vllm_errors_as_api_errors():
                    req = validate_model(DetokenizeRequest, data)
                    validate_token_ids(serving, req.tokens, "tokens")
                    result = await serving.create_detokenize(req, request)
            else:
                if "messages" in data:
                    check_messages(data["messages"], _content_part_types())
                model_cls = TokenizeChatRequest if "messages" in data else TokenizeCompletionRequest
                with vllm_errors_as_api_errors():
                    req = validate_model(model_cls, data)
                    result = await serving.create_tokenize(req, request)
            if type(result).__name__ == "ErrorResponse":
                raise from_vllm(result)
        except APIError as e:
            return e.response()
        return JSONResponse(result.model_dump(mode="json"))

    # -- cluster views ----------------------------------------------------------------------------

    def _stats_board(self):
        if self._board is None:
            self._board = board(self.cfg.app_name)
        return self._board

    async def replica_stats(self) -> list[dict]:
        stats = await self._stats_board().get.remote(max_age_s=max(3.0, 4 * self.cfg.router.stats_period_s))
        live = await self._live_replica_ids()
        if live is not None:
            stats = [s for s in stats if s["replica_id"] in live]
        return sorted(stats, key=lambda s: s["replica_id"])

    async def _running_replicas(self) -> int:
        return (await serve_state.deployment_state(self.cfg.app_name)).running_replicas

    async def _live_replica_ids(self) -> set[str] | None:
        try:
            actors = list_actors(filters=[("state", "=", "ALIVE")], limit=10_000, raise_on_missing_output=False)
            return {a.name.rsplit("#", 1)[-1] for a in actors if a.name and "LLMReplica" in a.name}
        except Exception:
            return None

    async def ready(self) -> tuple[bool, dict]:
        state = await serve_state.deployment_state(self.cfg.app_name)
        return state.ready, state.as_dict()

    # -- routes -------------------------------------------------------------------------------

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request):
        return await self.serve_openai("chat", request)

    @app.post("/v1/completions")
    async def completions(self, request: Request):
        return await self.serve_openai("completion", request)

    @app.post("/tokenize")
    async def tokenize(self, request: Request):
        return await self.tokenization("tokenize", request)

    @app.post("/detokenize")
    async def detokenize(self, request: Request):
        return await self.tokenization("detokenize", request)

    @app.get("/v1/models")
    async def models(self, request: Request):
        if self.auth.tenant_for(request.headers.get("authorization")) is None:
            return error_response(401, "missing or invalid API key (send `Authorization: Bearer <key>`)")

        # Listed once a replica of it can answer (not only once all do: /ready is that).
        serving = (await serve_state.deployment_state(self.cfg.app_name)).running_replicas > 0
        return {"object": "list", "data": [{
            "id": self.cfg.model.name, "object": "model", "created": int(time.time()),
            "owned_by": "kvserve", "root": self.cfg.model.source, "max_model_len": self.cfg.model.max_model_len,
        }] if serving else []}

    @app.get("/health")
    async def health(self):
        return {"status": "ok"}

    @app.get("/ready")
    async def ready_route(self):
        ok, body = await self.ready()
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/kvserve/stats")
    async def stats_route(self):
        from router.liveness import DROPS

        stats = await self.replica_stats()
        # `router_drops`: when this process's router first stopped choosing a replica, and why.
        return {"replicas": [{k: v for k, v in s.items() if k != "blocks"} for s in stats],
                "router_drops": DROPS.first}

    @app.post("/kvserve/debug/prefix")
    async def debug_prefix(self, request: Request):
        """Which replica holds how much of this request's prefix (from the engines' KV events)."""
        try:
            tenant = self._tenant(request)
            data = await self._read_json(request)
            kind = "chat" if "messages" in data else "completion"
            self._check_limits(kind, data)
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
        cfg = self.cfg
        if not cfg.autoscaling.enabled:
            # We are bound without the replica count (a resize must not restart us): Serve's target
            # is the configured count. Tools that redeploy from this config (bench) keep the size.
            state = await serve_state.deployment_state(cfg.app_name)
            if state.target_replicas < 1:
                return error_response(503, "the engine deployment is not deployed yet; retry later",
                                      headers={"Retry-After": "5"})
            cfg = cfg.model_copy(update={"num_replicas": state.target_replicas})
        return redacted(cfg)

    @app.get("/metrics")
    async def metrics_route(self):
        body, content_type = self.metrics.render(await self.replica_stats())
        return Response(body, media_type=content_type)
