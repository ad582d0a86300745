"""The bad-input table: each request, the status it gets, the field the error names.

docs/API.md shows this table; tests/unit/test_api_docs.py keeps the two equal and
tests/integration/test_openai_fidelity.py sends every row to the live cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MODEL = "smollm2-135m-instruct"
USER = [{"role": "user", "content": "Say hi."}]
# `strict`: OpenAI's switch for arguments that follow the schema; vLLM enforces it with a grammar.
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}

CHAT, COMPLETIONS, TOKENIZE, DETOKENIZE = "/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"


@dataclass(frozen=True)
class Bad:
    problem: str  # the docs table's first column
    path: str
    body: Any = None  # JSON, or bytes sent as they are
    status: int = 400
    param: str | None = None  # the field error.param names (None: not checked)
    method: str = "POST"
    auth: str | None = "key"  # "key": a valid key; None: no Authorization header; else the header's value


def chat(**fields: Any) -> dict:
    return {"model": MODEL, "messages": USER, "max_tokens": 4, **fields}


def completion(**fields: Any) -> dict:
    return {"model": MODEL, "prompt": "Hello", "max_tokens": 4, **fields}


def user(content: Any) -> dict:
    return chat(messages=[{"role": "user", "content": content}])


BAD_INPUTS = [
    # -- transport, auth, routing ----------------------------------------------------------------
    Bad("no API key", CHAT, chat(), 401, auth=None),
    Bad("wrong API key", CHAT, chat(), 401, auth="Bearer sk-wrong"),
    Bad("not a Bearer key", CHAT, chat(), 401, auth="Basic abc"),
    Bad("malformed JSON", CHAT, b'{"model": ', 400),
    Bad("body is a JSON array, not an object", CHAT, [chat()], 400),
    Bad("body over `server.max_body_bytes`", COMPLETIONS, completion(prompt="x" * 1_100_000), 413),
    Bad("GET on a POST route", CHAT, None, 405, method="GET"),
    Bad("unknown route", "/v1/nope", chat(), 404),
    Bad("unknown model", CHAT, chat(model="gpt-17"), 404, "model"),
    Bad("`model` missing", CHAT, {"messages": USER}, 400, "model"),
    # -- messages ----------------------------------------------------------------------------------
    Bad("`messages` missing", CHAT, {"model": MODEL}, 400, "messages"),
    Bad("`messages` empty", CHAT, chat(messages=[]), 400, "messages"),
    Bad("`messages` not an array", CHAT, chat(messages="hi"), 400, "messages"),
    Bad("a message that is not an object", CHAT, chat(messages=["hi"]), 400, "messages[0]"),
    Bad("`role` missing", CHAT, chat(messages=[{"content": "hi"}]), 400, "messages[0].role"),
    Bad("unknown `role` (`wizard`)", CHAT, chat(messages=[{"role": "wizard", "content": "hi"}]), 400,
        "messages[0].role"),
    Bad("`content` a number", CHAT, user(42), 400, "messages[0].content"),
    Bad("user `content` null", CHAT, user(None), 400, "messages[0].content"),
    Bad("unknown content part type", CHAT, user([{"type": "hologram"}]), 400, "messages[0].content[0].type"),
    Bad("text part without `text`", CHAT, user([{"type": "text"}]), 400, "messages[0].content[0].text"),
    Bad("tool message without `tool_call_id`", CHAT, chat(messages=[*USER, {"role": "tool", "content": "sunny"}]),
        400, "messages[1].tool_call_id"),
    Bad("an image for a text-only model", CHAT,
        user([{"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/x.png"}}]), 400),
    # -- sampling and limits -------------------------------------------------------------------------
    Bad("`max_tokens` 0", CHAT, chat(max_tokens=0), 400, "max_tokens"),
    Bad("`max_tokens` negative", CHAT, chat(max_tokens=-5), 400, "max_tokens"),
    Bad("`max_tokens` over `server.max_tokens_limit`", CHAT, chat(max_tokens=10**9), 400, "max_tokens"),
    Bad("`max_tokens` a string", COMPLETIONS, completion(max_tokens="ten"), 400, "max_tokens"),
    Bad("`temperature` negative", CHAT, chat(temperature=-1), 400),
    Bad("`temperature` over 2", CHAT, chat(temperature=3), 400, "temperature"),
    Bad("`top_p` over 1", CHAT, chat(top_p=5), 400),
    Bad("`top_k` negative", COMPLETIONS, completion(top_k=-5), 400),
    Bad("`frequency_penalty` over 2", CHAT, chat(frequency_penalty=5), 400),
    Bad("`n` 0", CHAT, chat(n=0), 400, "n"),
    Bad("`n` over `server.max_n`", CHAT, chat(n=17), 400, "n"),
    Bad("`stop` a number", CHAT, chat(stop=5), 400, "stop"),
    Bad("`seed` a string", COMPLETIONS, completion(seed="x"), 400, "seed"),
    Bad("`logprobs` over the engine's 20", COMPLETIONS, completion(logprobs=100), 400),
    Bad("`logprobs` over the engine's 20, streamed", COMPLETIONS, completion(logprobs=100, stream=True), 400),
    Bad("`top_logprobs` without `logprobs`", CHAT, chat(top_logprobs=5), 400, "top_logprobs"),
    Bad("`stream_options` without `stream`", CHAT, chat(stream_options={"include_usage": True}), 400,
        "stream_options"),
    Bad("`response_format` of an unknown type", CHAT, chat(response_format={"type": "xml"}), 400,
        "response_format.type"),
    Bad("`response_format` json_schema without a schema", CHAT, chat(response_format={"type": "json_schema"}), 400,
        "response_format"),
    Bad("`logit_bias` on a token out of the vocabulary", COMPLETIONS, completion(logit_bias={"99999999": 5}), 400),
    Bad("`structured_outputs` regex that does not compile", COMPLETIONS,
        completion(structured_outputs={"regex": "("}), 400),
    Bad("`structured_outputs` given as a list", COMPLETIONS, completion(structured_outputs=[{"regex": "a"}]), 400),
    Bad("`structured_outputs` given as a list (chat)", CHAT, chat(structured_outputs=["json"]), 400),
    # -- prompts ----------------------------------------------------------------------------------------
    Bad("token id out of the vocabulary", COMPLETIONS, completion(prompt=[99999999]), 400, "prompt"),
    Bad("token id out of the vocabulary, streamed", COMPLETIONS, completion(prompt=[99999999], stream=True), 400,
        "prompt"),
    Bad("negative token id", COMPLETIONS, completion(prompt=[-1]), 400, "prompt[0]"),
    Bad("empty prompt", COMPLETIONS, completion(prompt=""), 400, "prompt"),
    Bad("`prompt` missing", COMPLETIONS, {"model": MODEL}, 400, "prompt"),
    Bad("several prompts in one request", COMPLETIONS, completion(prompt=["a", "b"]), 400, "prompt"),
    Bad("prompt longer than the context", COMPLETIONS, completion(prompt="hello " * 2500), 400),
    Bad("prompt + `max_tokens` over the context", COMPLETIONS, completion(prompt="hello " * 100, max_tokens=2000),
        400, "prompt"),
    Bad("messages + `max_completion_tokens` over the context", CHAT,
        chat(max_tokens=None, max_completion_tokens=2040), 400, "messages"),
    Bad("`suffix` on a model without fill-in-the-middle", COMPLETIONS, completion(suffix="end"), 400, "suffix"),
    # -- tools and templates ----------------------------------------------------------------------------
    Bad("`tool_choice` required without `tools`", CHAT, chat(tool_choice="required"), 400, "tool_choice"),
    Bad("`tool_choice` names a function not in `tools`", CHAT,
        chat(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "launch"}}), 400, "tool_choice"),
    Bad("a tool without `function`", CHAT, chat(tools=[{"type": "function"}]), 400, "tools[0].function"),
    Bad("`chat_template` in the request (untrusted)", CHAT, chat(chat_template="{{ messages }}"), 400),
    # -- tokenizer endpoints ----------------------------------------------------------------------------
    Bad("/tokenize without `prompt` or `messages`", TOKENIZE, {"model": MODEL}, 400, "prompt"),
    Bad("/tokenize of an unknown model", TOKENIZE, {"model": "gpt-17", "prompt": "hi"}, 404, "model"),
    Bad("/tokenize with an unknown `role`", TOKENIZE, {"messages": [{"role": "wizard", "content": "hi"}]}, 400,
        "messages[0].role"),
    Bad("/detokenize of a token out of the vocabulary", DETOKENIZE, {"tokens": [99999999]}, 400, "tokens"),
    Bad("/detokenize of a string", DETOKENIZE, {"tokens": "hi"}, 400, "tokens"),
]
