"""One access line per request, written by the ingress: tenant, status, tokens, latency.

No prompt or completion text: prompts are the tenants' data, and logs go further (aggregators,
tickets, backups) than the traffic they describe. `logging.prompts` adds the prompt, for debugging.
"""

from __future__ import annotations

import json
import logging
from typing import Any

ACCESS_LOGGER = "kvserve.access"
SERVE_LOGGER = "ray.serve"  # Serve's documented logger for a deployment's own lines


class _ToServeLog(logging.Handler):
    """Hands records to Serve's logger, whatever handlers it has now (a reconfigure replaces them)."""

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger(SERVE_LOGGER).handle(record)


def _in_serve_replica() -> bool:
    from ray import serve
    from ray.serve.exceptions import RayServeException

    try:
        serve.get_replica_context()
    except RayServeException:
        return False
    return True


def access_logger() -> logging.Logger:
    """`kvserve.access` at INFO. Inside a Serve replica it writes where Serve writes that replica's
    own lines (with Serve's request id; stderr by default); elsewhere Python's logging decides."""
    log = logging.getLogger(ACCESS_LOGGER)
    log.setLevel(logging.INFO)
    if _in_serve_replica() and not log.handlers:
        log.addHandler(_ToServeLog())
        log.propagate = False
    return log


def prompt_of(body: dict) -> Any:
    """What the client sent as its prompt: chat messages or the completion prompt."""
    return body.get("messages") if "messages" in body else body.get("prompt")


def stream_usage(chunk: Any) -> dict | None:
    """The `usage` of one SSE chunk (`data: {...}`), if it carries one (the last chunk does when the
    client asked for `stream_options.include_usage`)."""
    if isinstance(chunk, bytes):
        chunk = chunk.decode(errors="replace")
    if not isinstance(chunk, str) or '"usage"' not in chunk:
        return None
    for line in chunk.splitlines():
        if line.startswith("data: {"):
            try:
                usage = json.loads(line[len("data: "):]).get("usage")
            except ValueError:
                return None
            return usage if isinstance(usage, dict) else None
    return None


def access_line(*, tenant: str, kind: str, status: int, seconds: float, request_id: str | None = None,
                replica: str | None = None, prompt_tokens: int | None = None, usage: dict | None = None,
                prompt: Any = None) -> str:
    """`key=value` fields on one line; unknown values left out. `prompt` (JSON-quoted) only when given."""
    usage = usage or {}
    details = usage.get("prompt_tokens_details") or {}
    fields = {
        "request_id": request_id,
        "tenant": tenant,
        "kind": kind,
        "status": status,
        "replica": replica,
        "prompt_tokens": usage.get("prompt_tokens", prompt_tokens),
        "completion_tokens": usage.get("completion_tokens"),
        "cached_tokens": details.get("cached_tokens"),
        "latency_ms": round(seconds * 1000),
    }
    line = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
    if prompt is not None:
        line += " prompt=" + json.dumps(prompt, ensure_ascii=False)  # one line, whatever the text holds
    return line


class AccessLog:
    def __init__(self, prompts: bool = False) -> None:
        self.prompts = prompts
        self.log = access_logger()

    def request_done(self, tenant: str, kind: str, status: int, seconds: float, *, work: Any = None,
                     body: dict | None = None, replica: str | None = None, usage: dict | None = None) -> None:
        """`work`: the rendered request (ChatWork/CompletionWork), None if it failed before that;
        `body`: the request's JSON, for the prompt (work.body if not given)."""
        if body is None and work is not None:
            body = work.body
        self.log.info(access_line(
            tenant=tenant, kind=kind, status=status, seconds=seconds, replica=replica, usage=usage,
            request_id=getattr(work, "request_id", None), prompt_tokens=getattr(work, "num_prompt_tokens", None),
            prompt=prompt_of(body) if self.prompts and body is not None else None,
        ))
