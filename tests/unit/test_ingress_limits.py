"""The ingress's limits adapter on an in-process board: 429s with their headers, leases, settling."""

from __future__ import annotations

import asyncio
import json

import pytest

from deployments.ingress_limits import IngressLimits, RateLimited
from deployments.stream_usage import ask_usage
from deployments.tenant_classes import tenant_classes
from kvserve.config import TenantClass, TenantsConfig
from router.tenant_limits import Limits, Need, TenantLimiter


class _Call:
    def __init__(self, fn) -> None:  # type: ignore[no-untyped-def]
        self.fn = fn

    def remote(self, *args):  # type: ignore[no-untyped-def]
        return _Done(self.fn(*args))


class _Done:
    """An already finished call: awaitable, and fine never awaited (fire and forget)."""

    def __init__(self, value) -> None:  # type: ignore[no-untyped-def]
        self.value = value

    def __await__(self):  # type: ignore[no-untyped-def]
        return self.value
        yield  # a generator: `await` runs it


class _Board:
    """LimitBoard's methods on a controllable clock, called as a Ray handle would be."""

    def __init__(self, clock) -> None:  # type: ignore[no-untyped-def]
        self.clock, self.tenants, self.calls = clock, {}, 0

    def _lim(self, tenant: str, limits: Limits) -> TenantLimiter:
        return self.tenants.setdefault(tenant, TenantLimiter(limits, self.clock()))

    def _acquire(self, tenant, limits, need, give_back):  # type: ignore[no-untyped-def]
        self.calls += 1
        return self._lim(tenant, limits).acquire(need, self.clock(), give_back)

    def __getattr__(self, name: str) -> _Call:
        if name == "acquire":
            return _Call(self._acquire)
        if name == "refund":
            return _Call(lambda t, lim, amount: self._lim(t, lim).refund(amount, self.clock()))
        if name == "charge":
            return _Call(lambda t, lim, n: self._lim(t, lim).charge(n, self.clock()))
        raise AttributeError(name)


def _limits(cls: TenantClass, now: list[float], ttl_s: float = 1.0) -> tuple[IngressLimits, _Board]:
    board = _Board(lambda: now[0])
    classes = {"default": TenantClass(), "small": cls}
    return IngressLimits(classes, {"acme": "small", "free": "default"}, lambda: board, max_model_len=2048,
                         clock=lambda: now[0], ttl_s=ttl_s), board


def _admit(lim: IngressLimits, rid: str, prompt: int = 10, max_tokens: int = 20, tenant: str = "acme"):  # type: ignore[no-untyped-def]
    return asyncio.run(lim.admit(rid, tenant, prompt, max_tokens))


def test_over_the_request_limit_is_a_429_with_retry_after_and_openai_headers():
    now = [100.0]
    lim, _ = _limits(TenantClass(requests_per_min=2), now)
    first = _admit(lim, "r1")
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    _admit(lim, "r2")
    with pytest.raises(RateLimited) as err:
        _admit(lim, "r3")
    resp = err.value.response()
    assert resp.status_code == 429
    assert resp.headers["Retry-After"] == "30" and resp.headers["retry-after-ms"] == "30000"
    assert resp.headers["x-ratelimit-remaining-requests"] == "0"
    assert resp.headers["x-ratelimit-reset-requests"] == "1m0s"
    body = json.loads(resp.body)["error"]
    assert body["type"] == "rate_limit_error" and body["code"] == "rate_limit_exceeded"
    assert "requests per min (RPM): limit 2" in body["message"]
    now[0] += 30.0
    assert _admit(lim, "r4") is not None


def test_a_tenant_without_limits_costs_no_board_call():
    now = [0.0]
    lim, board = _limits(TenantClass(requests_per_min=2), now)
    assert _admit(lim, "r1", tenant="free") is None and board.calls == 0
    lim.finish("r1", 200, None)  # not admitted here: nothing to settle


def test_far_from_the_limit_requests_spend_a_local_lease():
    now = [0.0]
    lim, board = _limits(TenantClass(requests_per_min=600, tokens_per_min=600_000, max_concurrent=200), now)
    for i in range(30):
        adm = _admit(lim, f"r{i}")
        lim.finish(f"r{i}", 200, {"prompt_tokens": 10, "completion_tokens": 5})
    assert board.calls <= 3  # one call per lease (60 requests, 60,000 tokens, 20 slots), not per request
    assert adm.headers["x-ratelimit-remaining-requests"] == "570"
    # 30 requests of 15 real tokens each; the lease holds the rest of the reservations.
    assert adm.headers["x-ratelimit-remaining-tokens"] == str(600_000 - 29 * 15 - 30)


def test_tokens_are_reserved_at_admission_and_settled_with_usage():
    now = [0.0]
    lim, board = _limits(TenantClass(tokens_per_min=1000), now)
    _admit(lim, "r1", prompt=100, max_tokens=800)
    with pytest.raises(RateLimited) as err:
        _admit(lim, "r2", prompt=100, max_tokens=800)
    assert "tokens per min (TPM): limit 1000, requested 900" in err.value.message
    assert err.value.headers["Retry-After"] == "48"  # 800 more tokens at 1000/min
    lim.finish("r1", 200, {"prompt_tokens": 100, "completion_tokens": 40})
    assert _admit(lim, "r3", prompt=100, max_tokens=700) is not None
    # Without max_tokens a request reserves the rest of the context.
    assert lim.need(100, 0) == Need(1, 2048, 1)


def test_concurrency_frees_a_slot_when_a_request_ends_and_a_refused_request_waits_one_second():
    now = [0.0]
    lim, _ = _limits(TenantClass(max_concurrent=1), now)
    _admit(lim, "r1")
    with pytest.raises(RateLimited) as err:
        _admit(lim, "r2")
    assert err.value.headers["Retry-After"] == "1" and "requests in flight: limit 1" in err.value.message
    lim.finish("r1", 499, None)
    assert _admit(lim, "r3") is not None


def test_expired_leases_go_back_to_the_board():
    now = [0.0]
    lim, board = _limits(TenantClass(requests_per_min=600), now, ttl_s=0.01)
    _admit(lim, "r1")
    assert board.tenants["acme"].requests.level == pytest.approx(600 - 1 - 60)
    now[0] += 0.01
    lim.sweep()
    assert board.tenants["acme"].requests.level == pytest.approx(599 + 0.1)  # the lease's 60, and 0.01 s of refill


def test_every_stream_asks_for_usage_and_hides_it_unless_asked():
    assert ask_usage({"stream": True}) == ({"stream": True, "stream_options": {"include_usage": True}}, True)
    asked = {"stream": True, "stream_options": {"include_usage": True}}
    assert ask_usage(asked) == (asked, False)
    assert ask_usage({"stream": False}) == ({"stream": False}, False)
    assert ask_usage({"stream": True, "stream_options": "x"})[1] is False  # vLLM's own 400 names it


def test_keys_file_classes_are_read_and_an_unknown_one_names_the_entry(tmp_path):
    f = tmp_path / "keys.yaml"
    f.write_text("- {tenant: acme, key_sha256: '" + "0" * 64 + "', class: gold}\n")
    cfg = TenantsConfig(keys_file=str(f), classes={"gold": {"requests_per_min": 5}})
    assert tenant_classes(cfg) == {"acme": "gold"}
    with pytest.raises(ValueError, match=r"keys.yaml\[0\] \(tenant 'acme'\): unknown class 'gold'"):
        tenant_classes(TenantsConfig(keys_file=str(f)))


def test_a_wall_clock_jump_unlocks_no_limit(monkeypatch):
    """The board reads the monotonic clock: the wall clock a day ahead (NTP step, VM resume) refills nothing."""
    import time

    from deployments.limit_board import Limiters

    board, limits = Limiters(), Limits(requests_per_min=2)
    assert all(board.acquire("acme", limits, Need(1, 0, 1), Need()).admitted for _ in range(2))
    real = time.time()
    monkeypatch.setattr(time, "time", lambda: real + 86_400)
    d = board.acquire("acme", limits, Need(1, 0, 1), Need())
    assert not d.admitted and 29 <= d.retry_after_s <= 30


def test_limits_hold_across_ingress_replicas():
    """Two ingresses sharing one board admit, between them, what one tenant's limit allows."""
    now = [0.0]
    board = _Board(lambda: now[0])
    classes = {"default": TenantClass(), "small": TenantClass(requests_per_min=100, max_concurrent=100)}
    ingresses = [IngressLimits(classes, {"acme": "small"}, lambda: board, 2048, clock=lambda: now[0])
                 for _ in range(2)]
    admitted = 0
    for i in range(300):
        try:
            _admit(ingresses[i % 2], f"r{i}")
            admitted += 1
        except RateLimited:
            pass
    assert admitted <= 100 and admitted >= 90  # a lease still held by one ingress is not lost for good ...
    for ing in ingresses:
        now[0] += 2.0  # ... it goes back when it expires
        ing.sweep()
    assert board.tenants["acme"].in_flight == admitted  # slots of the running requests, none leaked


def test_a_tenant_flooding_past_its_limit_is_refused_here_without_asking_the_board():
    now = [0.0]
    lim, board = _limits(TenantClass(requests_per_min=2, tokens_per_min=10_000), now)
    _admit(lim, "r1")
    _admit(lim, "r2")
    with pytest.raises(RateLimited) as first:
        _admit(lim, "r3")
    calls = board.calls
    now[0] += 10.0
    for i in range(50):
        with pytest.raises(RateLimited) as err:
            _admit(lim, f"f{i}")
    assert board.calls == calls  # refused at the ingress, with the wait that is left
    assert first.value.headers["Retry-After"] == "30" and err.value.headers["Retry-After"] == "20"
    assert err.value.headers["x-ratelimit-reset-requests"] == "50s"
    now[0] += 20.0
    assert _admit(lim, "r4") is not None and board.calls == calls + 1


def test_a_token_refusal_is_asked_again_once_tokens_come_back():
    now = [0.0]
    lim, board = _limits(TenantClass(tokens_per_min=2000), now)
    _admit(lim, "r1", prompt=100, max_tokens=800)
    with pytest.raises(RateLimited):
        _admit(lim, "r2", prompt=100, max_tokens=1400)
    assert _admit(lim, "small", prompt=10, max_tokens=10) is not None  # a smaller request is still asked
    calls = board.calls
    with pytest.raises(RateLimited):
        _admit(lim, "r3", prompt=100, max_tokens=1400)
    assert board.calls == calls  # the same size again: refused here
    lim.finish("r1", 200, {"prompt_tokens": 100, "completion_tokens": 10})  # 790 of its 900 come back
    assert _admit(lim, "r4", prompt=100, max_tokens=1400) is not None
