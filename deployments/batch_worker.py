"""Runs batch lines at the lowest priority: the store's pending lines, a few at a time, yielding
to interactive traffic, each result written to the store once.

Priority (PriorityGate): batch lines run at most `max_concurrency` at once while no interactive
request is in flight, `concurrency_under_load` while some are, and none start while an interactive
request is still waiting for a replica. A line answered 429/5xx is retried (overload, a replica
lost) up to `max_attempts`; a 4xx is the line's answer and goes to the error file.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from deployments.batch_jsonl import ENDPOINTS, result_record
from deployments.batch_store import BatchStore

log = logging.getLogger("kvserve.batch")

RunLine = Callable[[str, dict, str], Awaitable[tuple[int, dict]]]  # (kind, body, tenant) -> (status, body)
RETRYABLE = {429, 500, 502, 503, 504}


class PriorityGate:
    """Interactive requests report themselves; batch lines wait here for a slot."""

    def __init__(self, max_concurrency: int, under_load: int) -> None:
        self.max_concurrency, self.under_load = max_concurrency, under_load
        self.interactive_inflight = 0  # dispatched, not yet answered
        self.interactive_waiting = 0  # dispatched, no replica has taken it yet
        self.batch_inflight = 0
        self._changed = asyncio.Event()

    def _notify(self) -> None:
        self._changed.set()

    def limit(self) -> int:
        if self.interactive_waiting:
            return 0
        return self.under_load if self.interactive_inflight else self.max_concurrency

    def interactive_started(self) -> None:
        self.interactive_inflight += 1
        self.interactive_waiting += 1

    def interactive_taken(self) -> None:
        self.interactive_waiting = max(self.interactive_waiting - 1, 0)
        self._notify()

    def interactive_done(self) -> None:
        self.interactive_inflight = max(self.interactive_inflight - 1, 0)
        self._notify()

    async def acquire(self) -> None:
        while self.batch_inflight >= self.limit():
            self._changed.clear()
            await self._changed.wait()
        self.batch_inflight += 1

    def release(self) -> None:
        self.batch_inflight -= 1
        self._notify()


class BatchWorker:
    def __init__(self, store: BatchStore, run_line: RunLine, gate: PriorityGate, max_attempts: int = 3,
                 retry_delay_s: float = 1.0) -> None:
        self.store, self.run_line, self.gate = store, run_line, gate
        self.max_attempts, self.retry_delay_s = max_attempts, retry_delay_s
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run_forever())

    def wake(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run_forever(self) -> None:
        while True:
            self._wake.clear()
            for bid in self.store.unfinished():  # oldest first; after a restart, where it left off
                try:
                    await self.run_batch(bid)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("batch %s: worker error; retrying", bid)
                    await asyncio.sleep(self.retry_delay_s)
            if not self.store.unfinished():
                await self._wake.wait()

    async def run_batch(self, bid: str) -> dict:
        """Run every pending line of batch `bid`, then write its files. Returns the closed batch."""
        batch = self.store.get_batch(None, bid)
        kind, tenant = ENDPOINTS[batch["endpoint"]], self.store.tenant_of(bid)
        running: dict[int, asyncio.Task] = {}
        attempts: dict[int, int] = {}
        try:
            while True:
                if self.store.get_batch(None, bid)["status"] == "cancelling":
                    break
                todo = self.store.pending(bid, exclude=set(running), limit=1)
                if not todo:
                    if not running:
                        break
                    await asyncio.wait(running.values(), return_when=asyncio.FIRST_COMPLETED)
                    continue
                await self.gate.acquire()
                idx, custom_id, body = todo[0]
                running[idx] = asyncio.create_task(self._line(bid, kind, tenant, idx, custom_id, body, attempts))
                running[idx].add_done_callback(lambda _t, i=idx: (running.pop(i, None), self.gate.release()))
            if running:
                await asyncio.wait(running.values())
        finally:
            for t in running.values():  # worker stopped: lines in flight stay pending and run again
                t.cancel()
        return self.store.finalize(bid)

    async def _line(self, bid: str, kind: str, tenant: str, idx: int, custom_id: str | None, body: dict,
                    attempts: dict[int, int]) -> None:
        try:
            status, answer = await self.run_line(kind, body, tenant)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a transport failure is retried like a 5xx
            log.warning("batch %s line %d: %s", bid, idx, e)
            status, answer = 500, {"error": {"message": f"internal error: {type(e).__name__}",
                                             "type": "server_error", "param": None, "code": None}}
        attempts[idx] = attempts.get(idx, 0) + 1
        if status in RETRYABLE and attempts[idx] < self.max_attempts:
            await asyncio.sleep(self.retry_delay_s * attempts[idx])
            return  # still pending: picked up again
        ok = 200 <= status < 300
        self.store.finish_line(bid, idx, ok, result_record(custom_id, status, answer))

