"""OpenAI Batch API files: the input JSONL's lines, checked, and the output/error line records.

Input line:  {"custom_id": "...", "method": "POST", "url": "/v1/chat/completions", "body": {...}}
Output line: {"id": "batch_req_...", "custom_id": "...", "response": {"status_code", "request_id", "body"},
              "error": null}
A line that cannot be run (bad JSON, wrong url, ...) becomes its own error record; problems that make
the whole batch meaningless (duplicate custom_id, an unknown model, no lines) are a 400 at creation.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from deployments.errors import APIError

ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}


@dataclass
class InputLine:
    idx: int  # 0-based line number among the file's non-blank lines
    custom_id: str | None
    body: dict | None  # None: the line is an error
    error: dict | None = None  # {"code", "message"} for a line that cannot run


def _bad(idx: int, custom_id: str | None, code: str, message: str) -> InputLine:
    return InputLine(idx, custom_id, None, {"code": code, "message": f"line {idx + 1}: {message}"})


def parse_line(idx: int, raw: str, endpoint: str) -> InputLine:
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return _bad(idx, None, "invalid_json", f"not valid JSON ({e})")
    if not isinstance(obj, dict):
        return _bad(idx, None, "invalid_request", "a line must be a JSON object")
    cid = obj.get("custom_id")
    if not isinstance(cid, str) or not cid:
        return _bad(idx, None, "missing_custom_id", "custom_id must be a non-empty string")
    if obj.get("method", "POST") != "POST":
        return _bad(idx, cid, "invalid_method", f"method must be POST, got {obj.get('method')!r}")
    if obj.get("url") != endpoint:
        return _bad(idx, cid, "invalid_url", f"url {obj.get('url')!r} differs from the batch's endpoint {endpoint}")
    body = obj.get("body")
    if not isinstance(body, dict):
        return _bad(idx, cid, "invalid_body", "body must be a JSON object")
    if body.get("stream"):
        return _bad(idx, cid, "invalid_body", "stream is not supported in a batch")
    return InputLine(idx, cid, body)


def parse_file(content: bytes, endpoint: str, model: str, max_lines: int) -> list[InputLine]:
    """Every non-blank line of the input file; APIError 400 when the batch as a whole is invalid."""
    if endpoint not in ENDPOINTS:
        raise APIError(400, f"endpoint {endpoint!r} is not supported; one of {', '.join(ENDPOINTS)}", "endpoint")
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        raise APIError(400, "the input file is not UTF-8 text", "input_file_id") from None
    raws = [r for r in text.splitlines() if r.strip()]
    if not raws:
        raise APIError(400, "the input file has no requests", "input_file_id")
    if len(raws) > max_lines:
        raise APIError(400, f"the input file has {len(raws)} requests; the limit is {max_lines}", "input_file_id")
    lines = [parse_line(i, r, endpoint) for i, r in enumerate(raws)]
    seen: dict[str, int] = {}
    for line in lines:
        if line.custom_id is None:
            continue
        if line.custom_id in seen:
            raise APIError(400, f"custom_id {line.custom_id!r} is duplicated (lines {seen[line.custom_id] + 1} and "
                                f"{line.idx + 1}); each request needs its own", "input_file_id", "duplicate_custom_id")
        seen[line.custom_id] = line.idx
        if line.body is not None and line.body.get("model") != model:
            raise APIError(400, f"line {line.idx + 1} (custom_id {line.custom_id!r}) asks for model "
                                f"{line.body.get('model')!r}; this server serves {model!r}", "input_file_id",
                           "model_not_found")
    return lines


def result_record(custom_id: str | None, status: int, body: Any) -> dict:
    """An output (2xx) or error-file record for a request that ran."""
    return {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": custom_id,
            "response": {"status_code": status, "request_id": f"req_{uuid.uuid4().hex[:24]}", "body": body},
            "error": None}


def error_record(custom_id: str | None, error: dict) -> dict:
    """An error-file record for a line that never ran."""
    return {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": custom_id, "response": None, "error": error}


def to_jsonl(records: list[dict]) -> bytes:
    return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode()
