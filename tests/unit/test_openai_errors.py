"""OpenAI's error shape: status -> type/code, vLLM's errors converted, and FastAPI's own errors wrapped."""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from deployments.errors import (
    APIError,
    error_body,
    from_vllm,
    install_error_handlers,
    sse_error,
    vllm_errors_as_api_errors,
)

OPENAI_TYPES = {"invalid_request_error", "rate_limit_error", "server_error"}


def _assert_openai_shape(body: dict, status: int) -> dict:
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert err["type"] in OPENAI_TYPES
    assert err["code"] is None or isinstance(err["code"], str)  # never the HTTP status
    assert (err["type"] == "server_error") == (status >= 500)
    return err


@given(st.integers(400, 599), st.text(min_size=1), st.none() | st.text(), st.none() | st.text(min_size=1))
def test_every_status_gets_an_openai_body(status, message, param, code):
    err = _assert_openai_shape(error_body(status, message, param, code), status)
    assert err["message"] == message and err["param"] == param
    if code is not None:
        assert err["code"] == code


@pytest.mark.parametrize("status,type_,code", [
    (400, "invalid_request_error", None),
    (401, "invalid_request_error", "invalid_api_key"),
    (404, "invalid_request_error", None),
    (405, "invalid_request_error", "method_not_allowed"),
    (413, "invalid_request_error", "request_too_large"),
    (429, "rate_limit_error", "rate_limit_exceeded"),
    (500, "server_error", None),
    (503, "server_error", "service_unavailable"),
])
def test_types_and_default_codes_are_openais(status, type_, code):
    assert error_body(status, "m")["error"] == {"message": "m", "type": type_, "param": None, "code": code}


def _vllm_error(exc: Exception):
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response

    return create_error_response(exc)


def test_vllm_validation_errors_become_400_naming_the_parameter():
    from vllm.exceptions import VLLMValidationError

    err = from_vllm(_vllm_error(VLLMValidationError("Token id 99999999 is out of vocabulary", parameter="prompt")))
    assert (err.status, err.param) == (400, "prompt")
    # vLLM's "(parameter=prompt)" suffix is dropped: `param` says it.
    assert _assert_openai_shape(err.body(), 400)["message"] == "Token id 99999999 is out of vocabulary"


@pytest.mark.parametrize("exc,status", [
    (ValueError("bad"), 400),
    (TypeError("bad"), 400),
    (NotImplementedError("images are not supported by this model"), 400),  # vLLM says 501
    (RuntimeError("engine exploded"), 500),
])
def test_vllm_statuses_are_kept_except_not_implemented(exc, status):
    err = from_vllm(_vllm_error(exc))
    assert err.status == status
    _assert_openai_shape(err.body(), status)


def test_vllm_flag_names_become_config_keys():
    err = from_vllm({"error": {"message": '"auto" tool choice requires --enable-auto-tool-choice and '
                                          "--tool-call-parser to be set", "type": "BadRequestError", "code": 400}})
    assert "engine.enable_auto_tool_choice" in err.message and "engine.tool_call_parser" in err.message
    assert "--" not in err.message


def test_a_stream_error_event_is_recognised_and_converted():
    chunk = "data: " + json.dumps({"error": {"message": "boom", "type": "BadRequestError", "param": None,
                                             "code": 400}}) + "\n\n"
    err = sse_error(chunk)
    assert err is not None and err.status == 400 and err.body()["error"]["type"] == "invalid_request_error"
    assert sse_error('data: {"id": "cmpl-1", "choices": []}\n\n') is None
    assert sse_error("data: [DONE]\n\n") is None


def test_protocol_validation_errors_name_the_field():
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    with pytest.raises(APIError) as info, vllm_errors_as_api_errors():
        CompletionRequest.model_validate({"model": "m", "prompt": "hi", "temperature": "hot"})
    assert info.value.status == 400 and info.value.param == "temperature"
    assert "temperature" in info.value.message


class _Body(BaseModel):
    x: int


def _client() -> TestClient:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/v1/thing")
    async def thing(body: _Body):
        return {"x": body.x}

    @app.post("/v1/boom")
    async def boom():
        raise RuntimeError("secret detail")

    return TestClient(app, raise_server_exceptions=False)


def test_unknown_route_wrong_method_and_body_validation_get_openai_bodies():
    client = _client()
    r = client.get("/v1/nope")
    assert r.status_code == 404 and _assert_openai_shape(r.json(), 404)["message"] == "Invalid URL (GET /v1/nope)"
    r = client.get("/v1/thing")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert _assert_openai_shape(r.json(), 405)["code"] == "method_not_allowed"
    r = client.post("/v1/thing", json={"x": "not a number"})
    assert r.status_code == 400 and _assert_openai_shape(r.json(), 400)["param"] == "x"
    assert client.post("/v1/thing", json={"x": 3}).json() == {"x": 3}


def test_an_unhandled_error_is_a_500_that_does_not_leak_its_message():
    r = _client().post("/v1/boom")
    assert r.status_code == 500
    assert "secret" not in _assert_openai_shape(r.json(), 500)["message"]
