"""The served OpenAPI schema (`GET /openapi.json`): the ingress's routes take raw requests (they
read the body themselves, to answer bad input with OpenAI's errors), so FastAPI would document no
bodies. Here the OpenAI routes get vLLM's own pydantic protocol models as their request bodies,
and every route OpenAI's error body, so clients and fuzzers (tests/integration/test_fuzz.py) see
what the server really accepts."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

# route -> vLLM protocol model names (several: any of them)
REQUEST_MODELS = {
    "/v1/chat/completions": ("ChatCompletionRequest",),
    "/v1/completions": ("CompletionRequest",),
    "/tokenize": ("TokenizeCompletionRequest", "TokenizeChatRequest"),
    "/detokenize": ("DetokenizeRequest",),
}
ERROR_STATUSES = {"400": "Bad request", "401": "Missing or invalid API key", "404": "Unknown model or route",
                  "413": "Body too large", "503": "Overloaded or no replica (retry later)"}
ERROR_SCHEMA = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["message", "type"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
}
REF = "#/components/schemas/{model}"


def _model_schema(names: tuple[str, ...], components: dict[str, Any]) -> dict[str, Any]:
    from deployments.vllm_compat import get

    refs = []
    for name in names:
        schema = TypeAdapter(get(name)).json_schema(ref_template=REF, mode="validation")
        components.update(schema.pop("$defs", {}))
        components[name] = schema
        refs.append({"$ref": REF.format(model=name)})
    return refs[0] if len(refs) == 1 else {"anyOf": refs}


def build_openapi(app: Any, *, model: str | None = None, max_tokens_limit: int | None = None,
                  max_n: int | None = None) -> dict[str, Any]:
    """FastAPI's schema of `app`, with vLLM's request models as the OpenAI routes' bodies, the served
    model as `model`'s only value (required: an unknown one is a 404) and the server's own limits
    (max_tokens, n) as those fields' maxima."""
    from fastapi.openapi.utils import get_openapi

    spec = get_openapi(title="kvserve", version="1", routes=app.routes,
                       description="OpenAI-compatible LLM serving (Ray Serve + vLLM)")
    components = spec.setdefault("components", {}).setdefault("schemas", {})
    components["Error"] = ERROR_SCHEMA
    errors = {code: {"description": text, "content": {"application/json": {"schema": {"$ref": REF.format(
        model="Error")}}}} for code, text in ERROR_STATUSES.items()}
    for path, ops in spec.get("paths", {}).items():
        for method, op in ops.items():
            op.setdefault("responses", {}).update(errors if method == "post" else {"401": errors["401"]})
            op["responses"].pop("422", None)  # bad bodies are 400s here, in OpenAI's shape
            if method == "post" and path in REQUEST_MODELS:
                op["requestBody"] = {"required": True, "content": {"application/json": {
                    "schema": _model_schema(REQUEST_MODELS[path], components)}}}
    spec["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    spec["security"] = [{"bearer": []}]
    _apply_limits(components, max_tokens_limit, max_n)
    if model is not None:
        for name in ("ChatCompletionRequest", "CompletionRequest"):
            schema = components[name]
            schema["properties"]["model"] = {"type": "string", "enum": [model], "title": "Model"}
            schema["required"] = sorted({*schema.get("required", []), "model"})
    return spec


def _apply_limits(components: dict[str, Any], max_tokens_limit: int | None, max_n: int | None) -> None:
    """The server refuses more than its limits with 400; the schema says so."""
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        props = components.get(name, {}).get("properties", {})
        for key, limit in (("max_tokens", max_tokens_limit), ("max_completion_tokens", max_tokens_limit),
                           ("n", max_n)):
            if limit is not None and key in props:
                props[key] = _with_maximum(props[key], limit)


def _with_maximum(schema: dict[str, Any], limit: int) -> dict[str, Any]:
    if schema.get("type") == "integer":
        return {**schema, "maximum": limit, "minimum": max(schema.get("minimum", 1), 1)}
    if "anyOf" in schema:
        return {**schema, "anyOf": [_with_maximum(s, limit) for s in schema["anyOf"]]}
    return schema


def install(app: Any, cfg: Any) -> None:
    """Serve this schema at the app's openapi_url (built once, on first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app, model=cfg.model.name, max_tokens_limit=cfg.server.max_tokens_limit,
                                               max_n=cfg.server.max_n)
        return app.openapi_schema

    app.openapi = openapi
