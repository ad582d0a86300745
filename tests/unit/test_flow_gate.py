"""deployments.flow_gate: the ingress's slots and fair queue, on a real event loop (no Ray)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import pytest

from deployments.flow_gate import FlowGate, Overloaded
from kvserve.config import KVServeConfig


@dataclass
class Work:
    tenant: str
    num_prompt_tokens: int = 64
    block_hashes: list = field(default_factory=list)
    expected_output_tokens: int = 16


def gate(**flow) -> FlowGate:
    cfg = KVServeConfig.model_validate({"num_replicas": 1, "flow": {"enabled": True, "slots_per_replica": 1, **flow}})

    async def one() -> int:
        return 1

    async def none() -> list:
        return []

    return FlowGate(cfg, one, none)


def test_a_victim_overtakes_a_flood_and_slots_are_handed_on() -> None:
    async def main() -> list[str]:
        g = gate()
        first = await g.acquire(Work("flood"), True, None)
        order: list[str] = []

        async def one(tenant: str) -> None:
            slot = await g.acquire(Work(tenant), True, None)
            order.append(tenant)
            await asyncio.sleep(0)
            slot.release(16)

        tasks = [asyncio.create_task(one("flood")) for _ in range(5)]
        await asyncio.sleep(0)
        tasks.append(asyncio.create_task(one("victim")))
        await asyncio.sleep(0)
        assert len(g.queue) == 6 and g.inflight == 1
        first.release(16)
        await asyncio.gather(*tasks)
        assert g.inflight == 0 and len(g.queue) == 0
        return order

    order = asyncio.run(main())
    assert order.index("victim") <= 1  # behind at most the flood's first queued request, not all five


def test_bounds_answer_503_with_retry_after() -> None:
    async def main() -> None:
        g = gate(max_queued_per_tenant=1, max_queued=2)
        held = await g.acquire(Work("a"), True, None)
        waiting = asyncio.create_task(g.acquire(Work("a"), True, None))
        await asyncio.sleep(0)
        with pytest.raises(Overloaded) as full:  # per-tenant bound
            await g.acquire(Work("a"), True, None)
        assert full.value.status == 503 and full.value.retry_after_s >= 1
        assert full.value.response().headers["retry-after"] == str(full.value.retry_after_s)
        t0 = time.monotonic()
        with pytest.raises(Overloaded, match="no replica had room"):  # bounded wait
            await g.acquire(Work("b"), True, time.monotonic() + 0.05)
        assert time.monotonic() - t0 < 5
        held.release()
        (await waiting).release()
        assert g.inflight == 0

    asyncio.run(main())


def test_a_client_leaving_while_queued_frees_nothing_it_did_not_hold() -> None:
    async def main() -> None:
        g = gate()
        held = await g.acquire(Work("a"), True, None)
        waiting = asyncio.create_task(g.acquire(Work("b"), True, None))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert len(g.queue) == 0 and g.inflight == 1
        held.release()
        held.release()  # idempotent
        assert g.inflight == 0

    asyncio.run(main())


def test_batch_lines_wait_behind_every_class() -> None:
    async def main() -> list[str]:
        g = gate()
        held = await g.acquire(Work("x"), True, None)
        order: list[str] = []

        async def one(tenant: str, interactive: bool) -> None:
            s = await g.acquire(Work(tenant), interactive, None)
            order.append(tenant)
            s.release()

        batch = asyncio.create_task(one("batch-owner", False))
        await asyncio.sleep(0)
        chat = asyncio.create_task(one("chat", True))
        await asyncio.sleep(0)
        held.release()
        await asyncio.gather(batch, chat)
        return order

    assert asyncio.run(main()) == ["chat", "batch-owner"]
