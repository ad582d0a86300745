"""The OpenAI API as the official `openai` client sees it: n>1, tool calls, tokenizer endpoints,
and every bad input in the docs' table answered 4xx with OpenAI's error body."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.integration.bad_inputs import BAD_INPUTS, MODEL, USER, WEATHER, Bad
from tests.integration.conftest import KEYS

pytestmark = pytest.mark.integration

OPENAI_TYPES = {"invalid_request_error", "rate_limit_error", "server_error"}


def _openai_error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert err["message"] and err["type"] in OPENAI_TYPES
    assert err["code"] is None or isinstance(err["code"], str), err  # never the HTTP status
    return err


def _ok_request(cluster) -> None:
    r = cluster.openai().completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0)
    assert r.choices[0].text.strip()


# ---- n > 1 ----------------------------------------------------------------------------------------

def test_n2_returns_two_choices(cluster):
    client = cluster.openai()
    r = client.chat.completions.create(model=MODEL, messages=USER, n=2, max_tokens=8, temperature=1.0, seed=7)
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert all(c.message.content is not None and c.finish_reason for c in r.choices)
    assert 2 <= r.usage.completion_tokens <= 2 * 8  # both choices' tokens, the prompt counted once
    c = client.completions.create(model=MODEL, prompt="Once upon a time", n=2, max_tokens=6, temperature=1.0)
    assert sorted(ch.index for ch in c.choices) == [0, 1] and c.usage.completion_tokens == 12


def test_n2_streams_both_choices_to_the_end(cluster):
    stream = cluster.openai().chat.completions.create(
        model=MODEL, messages=USER, n=2, max_tokens=8, temperature=1.0, stream=True,
        stream_options={"include_usage": True})
    text = {0: "", 1: ""}
    finished = set()
    usage = None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished.add(choice.index)
    assert finished == {0, 1} and all(text.values())
    assert usage is not None and usage.completion_tokens > 0


# ---- errors through the official client ---------------------------------------------------------

def test_out_of_vocabulary_prompt_is_a_bad_request(cluster):
    with pytest.raises(openai.BadRequestError) as info:
        cluster.openai().completions.create(model=MODEL, prompt=[99999999], max_tokens=4)
    assert info.value.status_code == 400 and "vocabulary" in info.value.message
    assert info.value.code is None or isinstance(info.value.code, str)
    _ok_request(cluster)


def test_invalid_role_is_a_bad_request_naming_the_field(cluster):
    with pytest.raises(openai.BadRequestError) as info:
        cluster.openai().chat.completions.create(model=MODEL, messages=[{"role": "wizard", "content": "hi"}])
    assert info.value.param == "messages[0].role" and info.value.code == "invalid_value"
    assert "'wizard'" in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        cluster.openai().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": 42}])
    assert info.value.param == "messages[0].content" and "Param" not in info.value.message


def test_context_overflow_is_refused_like_openai(cluster):
    with pytest.raises(openai.BadRequestError) as info:
        cluster.openai().completions.create(model=MODEL, prompt="hello " * 100, max_tokens=2000)
    assert info.value.code == "context_length_exceeded"
    assert f"maximum context length is {cluster.cfg.model.max_model_len} tokens" in info.value.message


def test_wrong_method_and_unknown_route_get_openai_bodies(cluster):
    headers = {"Authorization": f"Bearer {KEYS['tenant-a']}"}
    r = httpx.get(cluster.url + "/v1/chat/completions", headers=headers, timeout=30)
    assert _openai_error(r, 405)["type"] == "invalid_request_error" and "POST" in r.headers["allow"]
    r = httpx.post(cluster.url + "/v1/nope", headers=headers, json={}, timeout=30)
    assert _openai_error(r, 404)["message"] == "Invalid URL (POST /v1/nope)"
    with pytest.raises(openai.NotFoundError):
        cluster.openai().models.retrieve("no-such-model")


# ---- tool calling ------------------------------------------------------------------------------------

def test_a_named_tool_choice_comes_back_as_a_tool_call(cluster):
    """The test cluster serves with `engine.tool_call_parser: hermes` and the shipped `chatml-tools`
    template. A 135M model will not reliably decide to call a tool, so the request names the
    function (`tool_choice`) and marks it `strict` (OpenAI's switch for schema-true arguments):
    vLLM then constrains the output with a grammar (the Hermes call envelope around the tool's
    JSON schema), which makes the call deterministic in shape (the values are the model's)."""
    r = cluster.openai().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the weather in Paris?"}], tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=60, temperature=0)
    (call,) = r.choices[0].message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    args = json.loads(call.function.arguments)
    assert set(args) == {"city"} and isinstance(args["city"], str)
    # The conversation continues with the tool's answer (the template replays the call).
    follow = cluster.openai().chat.completions.create(model=MODEL, max_tokens=10, temperature=0, tools=[WEATHER],
                                                      messages=[{"role": "user", "content": "Weather in Paris?"},
                                                                r.choices[0].message.model_dump(exclude_none=True),
                                                                {"role": "tool", "tool_call_id": call.id,
                                                                 "content": "sunny, 21 C"}])
    assert follow.choices[0].message.content


def test_tool_choice_required_returns_a_tool_call(cluster):
    r = cluster.openai().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Rome?"}], tools=[WEATHER],
        tool_choice="required", max_tokens=60, temperature=0)
    calls = r.choices[0].message.tool_calls
    assert calls and all(c.function.name == "get_weather" for c in calls)
    assert all(isinstance(json.loads(c.function.arguments), dict) for c in calls)


# ---- tokenizer endpoints -----------------------------------------------------------------------------

def test_tokenize_detokenize_round_trip(cluster):
    text = "The capital of France is Paris."
    with cluster.client() as c:
        tok = c.post("/tokenize", json={"model": MODEL, "prompt": text, "return_token_strs": True}).json()
        assert tok["count"] == len(tok["tokens"]) > 0 and len(tok["token_strs"]) == tok["count"]
        assert tok["max_model_len"] == cluster.cfg.model.max_model_len
        assert c.post("/detokenize", json={"model": MODEL, "tokens": tok["tokens"]}).json() == {"prompt": text}
        # A chat's count is what the model is billed for: the same template as a completion uses.
        chat = c.post("/tokenize", json={"model": MODEL, "messages": USER}).json()
    r = cluster.openai().chat.completions.create(model=MODEL, messages=USER, max_tokens=1)
    assert chat["count"] == r.usage.prompt_tokens
    r = httpx.post(cluster.url + "/tokenize", json={"prompt": text}, timeout=30)
    _openai_error(r, 401)


# ---- the docs' bad-input table -------------------------------------------------------------------------

def _send(cluster, bad: Bad) -> httpx.Response:
    headers = {}
    if bad.auth == "key":
        headers["Authorization"] = f"Bearer {KEYS['tenant-a']}"
    elif bad.auth is not None:
        headers["Authorization"] = bad.auth
    kw: dict = {}
    if isinstance(bad.body, bytes):
        kw = {"content": bad.body, "headers": {**headers, "content-type": "application/json"}}
    elif bad.body is not None:
        kw = {"json": bad.body, "headers": headers}
    else:
        kw = {"headers": headers}
    with httpx.Client(base_url=cluster.url, timeout=120) as c:
        return c.request(bad.method, bad.path, **kw)


@pytest.mark.parametrize("bad", BAD_INPUTS, ids=[b.problem for b in BAD_INPUTS])
def test_bad_input_gets_its_status_and_openai_error(cluster, bad):
    err = _openai_error(_send(cluster, bad), bad.status)
    if bad.param is not None:
        assert err["param"] == bad.param, err


def test_the_server_still_serves_after_the_bad_inputs(cluster):
    _ok_request(cluster)
