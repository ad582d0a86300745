"""OpenAI's error shape on every route: {"error": {"message", "type", "param", "code"}}.

`type` is the string OpenAI's API sends (`invalid_request_error`, `rate_limit_error`,
`server_error`); `code` is a short string or null, never the HTTP status. The official
clients pick their exception class from the HTTP status and expose these fields as-is.
vLLM's own error bodies (`"type": "BadRequestError", "code": 400`) are converted here.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from deployments.vllm_compat import get

log = logging.getLogger("kvserve.errors")

# The code a status gets when the raiser names none.
_DEFAULT_CODES = {
    401: "invalid_api_key",
    405: "method_not_allowed",
    413: "request_too_large",
    429: "rate_limit_exceeded",
    503: "service_unavailable",
}


def error_type(status: int) -> str:
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    code = code if code is not None else _DEFAULT_CODES.get(status)
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param, self.code)

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.param, self.code)


def from_vllm(error: Any) -> APIError:
    """A vLLM ErrorResponse (or its JSON) -> APIError. vLLM's 501 (a feature this model or server
    lacks, e.g. images for a text model) is the client's request failing: 400."""
    if hasattr(error, "model_dump"):
        error = error.model_dump(mode="json")
    inner = error.get("error", error) if isinstance(error, dict) else {"message": str(error)}
    raw = inner.get("code")
    status = int(raw) if isinstance(raw, int) or (isinstance(raw, str) and raw.isdigit()) else 500
    if status == 501:
        status = 400
    message = _PARAM_SUFFIX.sub("", str(inner.get("message") or "invalid request"))
    return APIError(status, vllm_flags_as_config(message), inner.get("param"))


@contextmanager
def vllm_errors_as_api_errors() -> Iterator[None]:
    """What vLLM's protocol models and renderer raise -> APIError, with the statuses vLLM's own
    server gives them (its `create_error_response`): validation errors are 400, never 500."""
    try:
        yield
    except APIError:
        raise
    except ValidationError as e:
        from deployments.request_checks import describe_validation_errors  # it imports this module (APIError)

        message, param = describe_validation_errors(e.errors())
        raise APIError(400, message, param) from None
    except Exception as e:
        raise vllm_exception(e) from None


def validate_model(model_cls: Any, data: Any) -> Any:
    """`model_cls.model_validate(data)`. vLLM's protocol models run `before` validators that assume
    the documented types, and a field of the wrong shape (`structured_outputs` as a list) makes them
    raise AttributeError/TypeError/KeyError from inside pydantic, which wraps only ValueErrors: that
    is the body's fault, so a 400, not a 500."""
    try:
        return model_cls.model_validate(data)
    except (AttributeError, TypeError, KeyError, IndexError) as e:
        raise APIError(400, f"invalid request body: a field has the wrong type or shape ({type(e).__name__}: {e})"
                       ) from None


def vllm_exception(exc: Exception) -> APIError:
    err = from_vllm(get("create_error_response")(exc))
    if err.status >= 500:
        log.error("vLLM raised %s", type(exc).__name__, exc_info=exc)
    return err


def sse_error(chunk: Any) -> APIError | None:
    """The error in a vLLM stream event (`data: {"error": {...}}`), if it is one."""
    if not isinstance(chunk, str) or not chunk.startswith('data: {"error"'):
        return None
    try:
        return from_vllm(json.loads(chunk[len("data: "):]))
    except ValueError:
        return None


# vLLM appends "(parameter=x, value=y)" to its validation messages; `param` carries that already.
_PARAM_SUFFIX = re.compile(r" \(parameter=[^()]*\)$")
# vLLM's messages name its CLI flags; here they are config keys.
_FLAG_TO_KEY = {
    "--enable-auto-tool-choice": "engine.enable_auto_tool_choice",
    "--tool-call-parser": "engine.tool_call_parser",
    "--reasoning-parser": "engine.reasoning_parser",
    "--trust-request-chat-template": "engine.extra_args.trust_request_chat_template",
}


def vllm_flags_as_config(message: str) -> str:
    for flag, key in _FLAG_TO_KEY.items():
        message = message.replace(flag, key)
    return message


def install_error_handlers(app: FastAPI) -> None:
    """Route-level failures FastAPI/Starlette answer themselves (404 unknown route, 405 wrong
    method, 422 body validation, an unhandled exception) get the same OpenAI body."""

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = f"Invalid URL ({request.method} {request.url.path})"
        elif exc.status_code == 405:
            message = f"Method {request.method} is not allowed on {request.url.path}"
        else:
            message = str(exc.detail)
        return error_response(exc.status_code, message, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        from deployments.request_checks import describe_validation_errors  # it imports this module (APIError)

        message, param = describe_validation_errors(exc.errors())
        return error_response(400, message, param)

    @app.exception_handler(Exception)
    async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, f"internal error: {type(exc).__name__}")
