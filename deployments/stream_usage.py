"""Every stream asks the engine for its usage; the client sees the usage chunk only if it asked.

The final usage chunk is what tenant limits settle with and what the token metrics count, so a
stream without `stream_options.include_usage` gets it anyway and the ingress drops that chunk
before the client would see it (the stream is then what the client asked for).
"""

from __future__ import annotations

HIDE_USAGE = "hide_usage"  # _Work.extra key: the client did not ask for the usage chunk


def ask_usage(data: dict) -> tuple[dict, bool]:
    """(the request to serve, whether its usage chunk must be hidden from the client)."""
    opts = data.get("stream_options")
    if data.get("stream") is not True or not (opts is None or isinstance(opts, dict)):
        return data, False  # not a stream, or a malformed stream_options (vLLM's 400 names it)
    if opts and opts.get("include_usage"):
        return data, False
    return {**data, "stream_options": {**(opts or {}), "include_usage": True}}, True
