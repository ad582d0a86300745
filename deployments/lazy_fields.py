"""pydantic validates `Iterable[...]` fields lazily: OpenAI's message types (which vLLM's request
models use) declare `content` parts and `tool_calls` so, and a validated request then holds
one-shot iterators. Those cannot be pickled to a replica (a 500) and are empty once the renderer
has read them. The ingress turns them into lists right after validation, validating every item
then (a bad item is a 400 there)."""

from __future__ import annotations

from typing import Any


def materialized(value: Any) -> Any:
    """`value` with every iterator inside (dicts, lists, tuples) replaced by a list of its items."""
    if isinstance(value, dict):
        return {k: materialized(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [materialized(v) for v in value]
    if isinstance(value, (str, bytes)) or not hasattr(value, "__next__"):
        return value
    return [materialized(v) for v in value]


def materialize_request(request: Any) -> None:
    """In place, on a validated pydantic request: each field that holds an iterator somewhere."""
    for name in type(request).model_fields:
        value = getattr(request, name, None)
        if isinstance(value, (list, dict)) or hasattr(value, "__next__"):
            fixed = materialized(value)
            if fixed is not value:
                object.__setattr__(request, name, fixed)
