"""deployments.stream_relay.coalesce_ready: chunks unchanged for a fast consumer, joined for a slow one."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deployments.stream_relay import coalesce_ready


async def _paced(chunks, gap_s=0.0, done=None):
    try:
        for c in chunks:
            await asyncio.sleep(gap_s)
            yield c
    finally:
        if done is not None:
            done.set()


def test_fast_consumer_sees_every_chunk_alone():
    async def main():
        return [c async for c in coalesce_ready(_paced(["a", "b", "c"], gap_s=0.01))]

    assert asyncio.run(main()) == ["a", "b", "c"]


def test_slow_consumer_gets_what_piled_up_joined_in_order():
    async def main():
        out = []
        async for c in coalesce_ready(_paced([f"{i};" for i in range(20)])):
            out.append(c)
            await asyncio.sleep(0.02)  # the source runs ahead meanwhile
        return out

    out = asyncio.run(main())
    assert "".join(out) == "".join(f"{i};" for i in range(20))
    assert out[0] == "0;"  # the first chunk is never held back
    assert len(out) < 20


@given(st.lists(st.text(min_size=1, max_size=5), max_size=30), st.integers(0, 3))
def test_nothing_lost_or_reordered(chunks, consumer_pause_ms):
    async def main():
        out = []
        async for c in coalesce_ready(_paced(chunks)):
            out.append(c)
            await asyncio.sleep(consumer_pause_ms / 1000)
        return out

    out = asyncio.run(main())
    assert "".join(out) == "".join(chunks)
    assert all(out)


def test_source_error_comes_after_the_chunks_before_it():
    async def failing():
        yield "a"
        yield "b"
        raise ValueError("engine died")

    async def main():
        got = []
        with pytest.raises(ValueError, match="engine died"):
            async for c in coalesce_ready(failing()):
                got.append(c)
        return got

    assert "".join(asyncio.run(main())) == "ab"


def test_closing_the_relay_stops_the_source():
    async def main():
        done = asyncio.Event()
        relay = coalesce_ready(_paced(["a"] * 1000, gap_s=0.005, done=done))
        assert await relay.__anext__() == "a"
        await relay.aclose()  # the caller went away
        await asyncio.wait_for(done.wait(), 1.0)
        return done.is_set()

    assert asyncio.run(main())
