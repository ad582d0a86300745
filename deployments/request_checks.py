"""Request checks OpenAI makes and vLLM's protocol models do not, with OpenAI's wording.

vLLM's `ChatCompletionRequest` accepts any role (it allows custom roles) and reports a
bad message as a failure of every member of its message union (`...DeveloperMessageParam`
for a user message). We check the roles and the shape of each message first, naming the
field as OpenAI does (`messages[0].role`), then let vLLM's models validate the rest.
Pure: no Ray, no vLLM.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any

from deployments.errors import APIError

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
# pydantic loc entries that name a union member or a type, not a field of the request.
_TYPE_WORDS = {"str", "int", "float", "bool", "list", "dict", "none", "json-or-python", "function-after",
               "function-before", "function-plain", "function-wrap", "lax-or-strict", "tagged-union", "nullable"}


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _invalid_type(param: str, expected: str, value: Any) -> APIError:
    return APIError(400, f"Invalid type for '{param}': expected {expected}, but got {_kind(value)} instead.",
                    param, "invalid_type")


def _missing(param: str) -> APIError:
    return APIError(400, f"Missing required parameter: '{param}'.", param, "missing_required_parameter")


def check_messages(messages: Any, part_types: Collection[str] = ()) -> None:
    """Raise APIError (400) for the first message OpenAI would refuse. `part_types`: the content
    part types the server knows (vLLM's list); empty: not checked."""
    if messages is None:
        raise _missing("messages")
    if not isinstance(messages, list):
        raise _invalid_type("messages", "an array", messages)
    if not messages:
        raise APIError(400, "Invalid 'messages': empty array. Expected an array with minimum length 1.",
                       "messages", "empty_array")
    for i, msg in enumerate(messages):
        _check_message(f"messages[{i}]", msg, part_types)


def _check_message(at: str, msg: Any, part_types: Collection[str]) -> None:
    if not isinstance(msg, dict):
        raise _invalid_type(at, "an object", msg)
    if "role" not in msg:
        raise _missing(f"{at}.role")
    role = msg["role"]
    if role not in ROLES:
        raise _invalid_value(f"{at}.role", role, ROLES)
    calls = msg.get("tool_calls") or msg.get("function_call")
    if "content" not in msg or msg["content"] is None:
        if role != "assistant" or not calls:  # an assistant may call tools instead of speaking
            raise _missing(f"{at}.content")
    else:
        _check_content(f"{at}.content", msg["content"], part_types)
    if role == "tool" and not isinstance(msg.get("tool_call_id"), str):
        if "tool_call_id" not in msg:
            raise _missing(f"{at}.tool_call_id")
        raise _invalid_type(f"{at}.tool_call_id", "a string", msg["tool_call_id"])
    if role == "function" and not isinstance(msg.get("name"), str):
        raise _missing(f"{at}.name") if "name" not in msg else _invalid_type(f"{at}.name", "a string", msg["name"])
    if "name" in msg and not isinstance(msg["name"], str):
        raise _invalid_type(f"{at}.name", "a string", msg["name"])


def _invalid_value(param: str, value: Any, supported: Sequence[str]) -> APIError:
    listed = ", ".join(f"'{v}'" for v in supported[:-1]) + f" and '{supported[-1]}'" if len(supported) > 1 \
        else f"'{supported[0]}'"
    return APIError(400, f"Invalid value: {value!r}. Supported values are: {listed}.", param, "invalid_value")


def _check_content(at: str, content: Any, part_types: Collection[str]) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _invalid_type(at, "one of a string or array of objects", content)
    for j, part in enumerate(content):
        # vLLM also takes bare strings and type-less parts ({"image_url": ...}); its models check those.
        if isinstance(part, str):
            continue
        if not isinstance(part, dict):
            raise _invalid_type(f"{at}[{j}]", "an object", part)
        if "type" in part and part_types and part["type"] not in part_types:
            raise _invalid_value(f"{at}[{j}].type", part["type"], sorted(part_types))
        if part.get("type") == "text" and not isinstance(part.get("text"), str):
            if "text" not in part:
                raise _missing(f"{at}[{j}].text")
            raise _invalid_type(f"{at}[{j}].text", "a string", part["text"])


def field_path(loc: Iterable[Any]) -> str:
    """pydantic's loc -> OpenAI's field path: ('messages', 0, 'UserParam', 'content', 'str') ->
    'messages[0].content'. Union members and type tags are dropped."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        part = str(part)
        if part in _TYPE_WORDS or part[:1].isupper() or "[" in part or part == "body":
            continue
        out += f".{part}" if out else part
    return out


def describe_validation_errors(errors: Sequence[dict]) -> tuple[str, str | None]:
    """The first of pydantic's errors as (message, param). A union reports one error per member;
    the first names the field as well as any of them."""
    if not errors:
        return "invalid request", None
    first = errors[0]
    param = field_path(first.get("loc", ())) or None
    if param and param.startswith("["):  # relative to a part vLLM parsed on its own: no field to name
        param = None
    msg = str(first.get("msg", "invalid value"))
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    return (f"Invalid parameter '{param}': {msg}" if param else msg), param


def check_choices(n: Any, limit: int) -> None:
    if n is None:
        return
    if not isinstance(n, int) or isinstance(n, bool):
        raise _invalid_type("n", "an integer", n)
    if n < 1:
        raise APIError(400, f"Invalid 'n': integer below minimum value. Expected a value >= 1, but got {n} "
                       "instead.", "n", "integer_below_min_value")
    if n > limit:
        raise APIError(400, f"Invalid 'n': n={n} exceeds this server's limit of {limit} (server.max_n).",
                       "n", "integer_above_max_value")


def check_context(prompt_tokens: int, completion_tokens: int | None, max_model_len: int, prompt_param: str) -> None:
    """OpenAI refuses a prompt whose requested completion does not fit in the context (vLLM would
    silently shorten the completion instead)."""
    if completion_tokens is None or prompt_tokens + completion_tokens <= max_model_len:
        return
    where = "messages" if prompt_param == "messages" else "prompt"
    raise APIError(
        400, f"This model's maximum context length is {max_model_len} tokens. However, you requested "
             f"{prompt_tokens + completion_tokens} tokens ({prompt_tokens} in the {where}, {completion_tokens} "
             f"in the completion). Please reduce the length of the {where} or completion.",
        prompt_param, "context_length_exceeded")
