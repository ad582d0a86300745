"""Batch API pieces without a cluster: JSONL checks, the SQLite store (exactly once, restart), the
lowest-priority worker (resume after a crash, retries, yielding to interactive requests)."""

from __future__ import annotations

import asyncio
import json

import pytest

from deployments.batch_jsonl import parse_file
from deployments.batch_store import BatchStore
from deployments.batch_worker import BatchWorker, PriorityGate
from deployments.errors import APIError

EP, MODEL = "/v1/chat/completions", "m"


def _line(cid: str, model: str = MODEL, url: str = EP, **body) -> str:
    return json.dumps({"custom_id": cid, "method": "POST", "url": url,
                       "body": {"model": model, "messages": [{"role": "user", "content": cid}], **body}})


def _file(n: int) -> bytes:
    return "\n".join(_line(f"r{i}") for i in range(n)).encode()


# -- input file ------------------------------------------------------------------------------------------


def test_bad_lines_become_their_own_error_records():
    raw = "\n".join([_line("a"), "{not json", json.dumps([1]), json.dumps({"custom_id": "c", "url": EP}),
                     _line("d", url="/v1/completions"), _line("e", stream=True), "", _line("f")]).encode()
    lines = parse_file(raw, EP, MODEL, 100)
    assert [ln.idx for ln in lines] == list(range(7))  # the blank line is not a request
    ok = [ln.custom_id for ln in lines if ln.body is not None]
    assert ok == ["a", "f"]
    codes = [ln.error["code"] for ln in lines if ln.error]
    assert codes == ["invalid_json", "invalid_request", "invalid_body", "invalid_url", "invalid_body"]
    assert lines[1].error["message"].startswith("line 2:")


@pytest.mark.parametrize("raw, endpoint, param, words", [
    (_file(2) + b"\n" + _line("r1").encode(), EP, "input_file_id", ["'r1'", "duplicated", "lines 2 and 3"]),
    (_line("x", model="other").encode(), EP, "input_file_id", ["'other'", "serves 'm'"]),
    (b"\n\n", EP, "input_file_id", ["no requests"]),
    (_file(1), "/v1/embeddings", "endpoint", ["not supported"]),
    (_file(5), EP, "input_file_id", ["limit is 4"]),
])
def test_a_batch_that_cannot_run_is_a_400_naming_why(raw, endpoint, param, words):
    with pytest.raises(APIError) as e:
        parse_file(raw, endpoint, MODEL, 4)
    assert e.value.status == 400 and e.value.param == param
    assert all(w in e.value.message for w in words), e.value.message


# -- store -----------------------------------------------------------------------------------------------


def _batch(store: BatchStore, n: int, raw: bytes | None = None) -> str:
    raw = raw or _file(n)
    f = store.add_file("t", "in.jsonl", "batch", raw)
    return store.create_batch("t", f["id"], EP, "24h", {"k": "v"}, MODEL, parse_file(raw, EP, MODEL, 100))["id"]


def test_store_answers_each_line_once_and_survives_a_reopen(tmp_path):
    db = tmp_path / "b.sqlite"
    store = BatchStore(db)
    bid = _batch(store, 3)
    assert store.finish_line(bid, 0, True, {"custom_id": "r0"})
    assert not store.finish_line(bid, 0, True, {"custom_id": "r0 again"})  # already answered: dropped
    store.close()
    store = BatchStore(db)  # a restart
    assert store.unfinished() == [bid]
    assert [i for i, _, _ in store.pending(bid, set(), 10)] == [1, 2]
    assert store.get_batch("t", bid)["request_counts"] == {"total": 3, "completed": 1, "failed": 0}
    assert store.get_batch("other-tenant", bid) is None and store.get_file("other-tenant", "x") is None


def test_finalize_writes_output_and_error_files(tmp_path):
    store = BatchStore(tmp_path / "b.sqlite")
    bid = _batch(store, 0, (_line("a") + "\n{oops\n" + _line("b")).encode())
    store.finish_line(bid, 0, True, {"custom_id": "a"})
    store.finish_line(bid, 2, False, {"custom_id": "b"})
    done = store.finalize(bid)
    assert done["status"] == "completed" and store.unfinished() == []
    out = [json.loads(x) for x in store.file_content("t", done["output_file_id"]).splitlines()]
    err = [json.loads(x) for x in store.file_content("t", done["error_file_id"]).splitlines()]
    assert [r["custom_id"] for r in out] == ["a"]
    assert [r.get("custom_id") for r in err] == [None, "b"] and err[0]["error"]["code"] == "invalid_json"
    assert store.get_file("t", done["output_file_id"])["purpose"] == "batch_output"


# -- worker ----------------------------------------------------------------------------------------------


def _worker(store, run, gate=None, **kw):
    return BatchWorker(store, run, gate or PriorityGate(4, 1), retry_delay_s=0.0, **kw)


def test_a_worker_stopped_mid_batch_resumes_and_answers_every_line_once(tmp_path):
    db = tmp_path / "b.sqlite"
    calls: list[str] = []

    async def first_run():
        store = BatchStore(db)
        bid = _batch(store, 40)
        release = asyncio.Event()

        async def run(kind, body, tenant):
            calls.append(body["messages"][0]["content"])
            if len(calls) > 10:
                await release.wait()  # the rest hang until the "crash"
            return 200, {"echo": body["messages"][0]["content"]}

        w = _worker(store, run)
        w.start()
        while len(calls) < 12:
            await asyncio.sleep(0.01)
        await w.stop()  # the ingress dies: lines in flight were never stored
        store.close()
        return bid

    bid = asyncio.run(first_run())

    async def second_run():
        store = BatchStore(db)

        async def run(kind, body, tenant):
            calls.append(body["messages"][0]["content"])
            return 200, {"echo": body["messages"][0]["content"]}

        return store, await _worker(store, run).run_batch(bid)

    store, done = asyncio.run(second_run())
    assert done["status"] == "completed"
    out = [json.loads(x) for x in store.file_content("t", done["output_file_id"]).splitlines()]
    assert sorted(r["custom_id"] for r in out) == sorted(f"r{i}" for i in range(40))  # each exactly once
    assert all(r["response"]["body"]["echo"] == r["custom_id"] for r in out)
    assert 40 < len(calls) <= 40 + 4  # only the lines in flight at the crash ran twice


def test_overload_is_retried_and_a_4xx_goes_to_the_error_file(tmp_path):
    store = BatchStore(tmp_path / "b.sqlite")
    bid = _batch(store, 3)
    seen: dict[str, int] = {}

    async def run(kind, body, tenant):
        cid = body["messages"][0]["content"]
        seen[cid] = seen.get(cid, 0) + 1
        if cid == "r0" and seen[cid] == 1:
            return 503, {"error": {"message": "overloaded"}}
        if cid == "r1":
            return 400, {"error": {"message": "bad"}}
        if cid == "r2":
            return 503, {"error": {"message": "always overloaded"}}
        return 200, {"ok": True}

    done = asyncio.run(_worker(store, run, max_attempts=3).run_batch(bid))
    assert seen == {"r0": 2, "r1": 1, "r2": 3}
    assert done["request_counts"] == {"total": 3, "completed": 1, "failed": 2}
    err = [json.loads(x) for x in store.file_content("t", done["error_file_id"]).splitlines()]
    assert {r["custom_id"]: r["response"]["status_code"] for r in err} == {"r1": 400, "r2": 503}


class _RecordingGate(PriorityGate):
    """Notes, per test phase, the most batch lines running when one is let through."""

    def __init__(self, phases: tuple[str, ...], **kw) -> None:
        super().__init__(**kw)
        self.phase = {"now": phases[0]}  # the test moves it along
        self.peak = dict.fromkeys(phases, 0)

    async def acquire(self) -> None:
        await super().acquire()
        now = self.phase["now"]
        self.peak[now] = max(self.peak[now], self.batch_inflight)


def test_batch_lines_yield_to_interactive_requests(tmp_path):
    store = BatchStore(tmp_path / "b.sqlite")
    bid = _batch(store, 30)
    gate = _RecordingGate(("idle", "busy", "waiting"), max_concurrency=4, under_load=1, idle_after_s=0.05)
    phase, peak = gate.phase, gate.peak

    async def main():
        async def run(kind, body, tenant):
            await asyncio.sleep(0.02)
            return 200, {}

        task = asyncio.create_task(_worker(store, run, gate).run_batch(bid))
        await asyncio.sleep(0.1)
        token = gate.interactive_started()  # an interactive request waits for a replica: no batch line starts
        phase["now"] = "waiting"
        await asyncio.sleep(0.2)
        gate.interactive_taken(token)  # a replica took it: one batch line at a time while it runs
        phase["now"] = "busy"
        await asyncio.sleep(0.2)
        gate.interactive_done(token)
        phase["now"] = "idle"
        await task

    asyncio.run(main())
    assert peak["waiting"] == 0 and peak["busy"] == 1 and peak["idle"] == 4
    assert store.get_batch("t", bid)["request_counts"]["completed"] == 30


def test_an_interactive_request_that_never_reports_its_end_stops_counting():
    gate = PriorityGate(max_concurrency=4, under_load=1, max_age_s=0.05)
    gate.interactive_started()  # e.g. a stream whose client left before it began
    assert gate.limit() == 0

    async def main():
        await asyncio.wait_for(gate.acquire(), 5)  # no one calls done(): the age bound frees the slot

    asyncio.run(main())
    assert gate.limit() == 4 and gate.batch_inflight == 1


def test_a_gap_between_interactive_requests_does_not_let_a_burst_of_lines_in(tmp_path):
    # Closed-loop clients whose requests end together leave "none in flight" gaps of a few ms; each
    # gap used to start max_concurrency lines at once, and the next requests waited behind them.
    store = BatchStore(tmp_path / "b.sqlite")
    bid = _batch(store, 40)
    gate = _RecordingGate(("busy", "idle"), max_concurrency=4, under_load=1, idle_after_s=0.3)
    phase, peak = gate.phase, gate.peak

    async def main():
        async def run(kind, body, tenant):
            await asyncio.sleep(0.03)  # 40 lines one at a time outlast the busy phase
            return 200, {}

        tokens = [gate.interactive_started() for _ in range(2)]
        for t in tokens:
            gate.interactive_taken(t)
        task = asyncio.create_task(_worker(store, run, gate).run_batch(bid))
        for _ in range(10):  # both end together, then both come back 5 ms later
            await asyncio.sleep(0.02)
            for t in tokens:
                gate.interactive_done(t)
            await asyncio.sleep(0.005)
            tokens = [gate.interactive_started() for _ in range(2)]
            for t in tokens:
                gate.interactive_taken(t)
        for t in tokens:
            gate.interactive_done(t)
        await asyncio.sleep(0.25)  # still within the quiet spell: under-load concurrency
        phase["now"] = "idle"  # from here the quiet spell ends (~0.05 s): back to 4 without anyone notifying
        await asyncio.wait_for(task, 10)

    asyncio.run(main())
    assert peak["busy"] == 1 and peak["idle"] == 4
    assert store.get_batch("t", bid)["request_counts"]["completed"] == 40


def test_gate_limit_over_a_quiet_spell():
    now = [100.0]
    gate = PriorityGate(max_concurrency=4, under_load=1, idle_after_s=2.0, clock=lambda: now[0])
    assert gate.limit() == 4  # no interactive traffic yet
    t = gate.interactive_started()
    assert gate.limit() == 0  # waiting for a replica
    gate.interactive_taken(t)
    assert gate.limit() == 1
    gate.interactive_done(t)
    assert gate.limit() == 1  # answered just now: the spell has not passed
    now[0] += 1.9
    assert gate.limit() == 1
    now[0] += 0.2
    assert gate.limit() == 4
    gate.interactive_done(t)  # a second report of the same end does not restart the spell
    assert gate.limit() == 4
