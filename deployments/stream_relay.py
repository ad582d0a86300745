"""Relay a stream of SSE strings, joining those that are ready at the same time into one item.

Each item a replica yields costs a Ray streamed object (or a gRPC message) and a relay
step in the ingress and the proxy, whatever its size. A reader task pulls the source as
fast as it produces; the relay yields as soon as one chunk is there, plus every chunk that
piled up meanwhile (never waiting for more), so a fast consumer sees the stream unchanged
and a slow one gets fewer, larger items instead of a growing backlog.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

_END = object()


async def coalesce_ready(source: AsyncIterator[str]) -> AsyncIterator[str]:
    queue: asyncio.Queue = asyncio.Queue()

    async def read() -> None:
        try:
            async for chunk in source:
                queue.put_nowait(chunk)
        except BaseException as e:  # handed to the consumer, in order
            queue.put_nowait(e)
            return
        queue.put_nowait(_END)

    reader = asyncio.ensure_future(read())
    try:
        while True:
            items = [await queue.get()]
            while not queue.empty():
                items.append(queue.get_nowait())
            text = [i for i in items if isinstance(i, str)]
            if text:
                yield "".join(text)
            last = items[-1]
            if last is _END:
                return
            if isinstance(last, BaseException):
                raise last
    finally:
        if not reader.done():
            reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
