"""The per-tenant limiter core: token buckets, concurrency, leases, Retry-After and OpenAI's headers."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.limit_lease import LocalLease
from router.tenant_limits import (LEASE_SHARE, Limits, Need, TenantLimiter, TokenBucket, go_duration, rate_limit_headers,
                                  retry_after_header)

ONE = Need(requests=1, slots=1)


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="tokens_per_min"):
        Limits(tokens_per_min=0)
    assert not Limits().any and Limits(max_concurrent=1).any


def test_requests_per_min_refuses_the_next_one_with_the_exact_wait():
    lim = TenantLimiter(Limits(requests_per_min=3), now=0.0)
    assert [lim.acquire(ONE, 0.0, lease=False).admitted for _ in range(3)] == [True, True, True]
    d = lim.acquire(ONE, 0.0, lease=False)
    assert not d.admitted and d.reason == "requests" and d.retry_after_s == pytest.approx(20.0)
    assert d.snapshot.remaining_requests == 0 and d.snapshot.reset_requests_s == pytest.approx(60.0)
    assert not lim.acquire(ONE, 19.9, lease=False).admitted
    assert lim.acquire(ONE, 20.0, lease=False).admitted


def test_tokens_reserve_then_settle_with_real_usage():
    lim = TenantLimiter(Limits(tokens_per_min=1000), now=0.0)
    d = lim.acquire(Need(1, 900, 1), 0.0)  # prompt 100 + max_tokens 800
    assert d.admitted and d.snapshot.remaining_tokens == 100
    assert not lim.acquire(Need(1, 200, 1), 0.0).admitted
    lim.refund(Need(tokens=900 - 130), 0.0)  # it used 100 prompt + 30 completion
    assert lim.snapshot(0.0).remaining_tokens == 870
    assert lim.acquire(Need(1, 200, 1), 0.0).admitted


def test_a_request_larger_than_a_minute_waits_for_a_full_bucket_and_leaves_debt():
    lim = TenantLimiter(Limits(tokens_per_min=600), now=0.0)
    assert lim.acquire(Need(1, 1200, 1), 0.0).admitted  # full bucket: admitted, 600 tokens of debt
    d = lim.acquire(Need(1, 10, 1), 0.0)
    assert not d.admitted and d.retry_after_s == pytest.approx((600 + 10) / 10.0)
    lim.charge(60, 0.0)  # it used more than reserved: more debt
    assert lim.acquire(Need(1, 10, 1), 0.0).retry_after_s == pytest.approx((660 + 10) / 10.0)


def test_concurrency_refuses_until_a_slot_comes_back():
    lim = TenantLimiter(Limits(max_concurrent=2), now=0.0)
    assert lim.acquire(ONE, 0.0).admitted and lim.acquire(ONE, 0.0).admitted
    d = lim.acquire(ONE, 100.0)
    assert not d.admitted and d.reason == "concurrency" and retry_after_header(d.retry_after_s) == 1
    lim.refund(Need(slots=1), 100.0)
    assert lim.acquire(ONE, 100.0).admitted


def test_a_clock_that_goes_back_unlocks_nothing():
    lim = TenantLimiter(Limits(requests_per_min=60), now=1000.0)
    for _ in range(60):
        assert lim.acquire(ONE, 1000.0, lease=False).admitted
    assert not lim.acquire(ONE, 10.0, lease=False).admitted  # back 990 s
    assert not lim.acquire(ONE, 1000.5, lease=False).admitted  # and forward again: only 0.5 s refilled
    assert lim.acquire(ONE, 1001.0, lease=False).admitted


def test_headers_and_durations_are_openais():
    assert go_duration(0.0172) == "18ms" and go_duration(1.5) == "1.5s" and go_duration(360) == "6m0s"
    assert go_duration(61.2) == "1m2s"
    lim = TenantLimiter(Limits(requests_per_min=60, tokens_per_min=6000), now=0.0)
    h = rate_limit_headers(lim.acquire(Need(1, 600, 1), 0.0, lease=False).snapshot)
    assert h == {"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "59",
                 "x-ratelimit-reset-requests": "1s", "x-ratelimit-limit-tokens": "6000",
                 "x-ratelimit-remaining-tokens": "5400", "x-ratelimit-reset-tokens": "6s"}
    assert rate_limit_headers(TenantLimiter(Limits(max_concurrent=3), 0.0).snapshot(0.0)) == {}


def test_leases_come_only_from_the_top_half_of_a_bucket():
    lim = TenantLimiter(Limits(requests_per_min=100, tokens_per_min=10_000, max_concurrent=100), now=0.0)
    d = lim.acquire(Need(1, 100, 1), 0.0)
    assert d.lease == Need(10, 1000, 10)
    for _ in range(60):
        lim.acquire(Need(1, 0, 0), 0.0, lease=False)
    assert lim.acquire(Need(1, 100, 1), 0.0).lease.requests == 0  # 28 left of 100: below the half


times = st.floats(min_value=0, max_value=600, allow_nan=False)
ops = st.lists(st.tuples(st.floats(0, 30), st.integers(1, 400), st.booleans()), min_size=1, max_size=60)


@settings(max_examples=200, deadline=None)
@given(rpm=st.integers(1, 120), tpm=st.integers(100, 5000), steps=ops)
def test_what_is_taken_never_outruns_the_buckets(rpm, tpm, steps):
    """Whatever the arrivals (and leases), requests and tokens taken by time t are at most one
    minute's worth plus the refill until t (plus the one oversize request a full bucket admits)."""
    lim = TenantLimiter(Limits(requests_per_min=rpm, tokens_per_min=tpm), now=0.0)
    now, taken_req, taken_tok, biggest = 0.0, 0, 0, 0
    for dt, tokens, lease in steps:
        now += dt
        d = lim.acquire(Need(1, tokens, 0), now, lease=lease)
        if d.admitted:
            taken_req += 1 + d.lease.requests
            taken_tok += tokens + d.lease.tokens
            biggest = max(biggest, tokens)
        assert taken_req <= rpm + now * rpm / 60 + 1e-6
        assert taken_tok <= tpm + now * tpm / 60 + max(biggest - tpm, 0) + 1e-6


@settings(max_examples=200, deadline=None)
@given(rpm=st.integers(1, 120), tpm=st.integers(100, 5000), steps=ops, tokens=st.integers(1, 6000))
def test_retry_after_is_at_least_one_second_and_right_within_one(rpm, tpm, steps, tokens):
    lim = TenantLimiter(Limits(requests_per_min=rpm, tokens_per_min=tpm), now=0.0)
    now = 0.0
    for dt, t, _ in steps:
        now += dt
        lim.acquire(Need(1, t, 0), now, lease=False)
    d = lim.acquire(Need(1, tokens, 0), now, lease=False)
    if d.admitted:
        return
    header = retry_after_header(d.retry_after_s)
    assert header >= 1 and header - d.retry_after_s < 1
    probe = TenantLimiter(Limits(requests_per_min=rpm, tokens_per_min=tpm), now=0.0)
    probe.requests.__dict__.update(lim.requests.__dict__)
    probe.tokens.__dict__.update(lim.tokens.__dict__)
    if d.retry_after_s > 0.01:  # just before the wait it is still refused ...
        assert not probe.acquire(Need(1, tokens, 0), now + d.retry_after_s * 0.99, lease=False).admitted
    # ... and at the header's whole seconds it is admitted.
    assert lim.acquire(Need(1, tokens, 0), now + header, lease=False).admitted


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.tuples(times, st.integers(1, 50)), min_size=1, max_size=40))
def test_time_going_back_refills_no_more_than_the_latest_time_would(steps):
    lim = TenantLimiter(Limits(tokens_per_min=3000), now=0.0)
    latest = 0.0
    for t, tokens in steps:
        lim.acquire(Need(0, tokens, 0), t, lease=False)
        latest = max(latest, t)
        assert lim.tokens.at == latest
    ref = TokenBucket(3000, lim.tokens.level, latest)
    lim.snapshot(latest - 100.0)
    assert lim.tokens.level == ref.level


@settings(max_examples=200, deadline=None)
@given(cap=st.integers(1, 50), steps=st.lists(st.booleans(), min_size=1, max_size=100))
def test_slots_in_use_never_exceed_max_concurrent(cap, steps):
    lim = TenantLimiter(Limits(max_concurrent=cap), now=0.0)
    running, leased = 0, 0
    for start in steps:
        if start:
            d = lim.acquire(ONE, 0.0)
            if d.admitted:
                running += 1
                leased += d.lease.slots
        elif running:
            running -= 1
            lim.refund(Need(slots=1), 0.0)
        assert running + leased == lim.in_flight <= cap


@settings(max_examples=200, deadline=None)
@given(rpm=st.integers(20, 600), tpm=st.integers(2000, 50_000),
       steps=st.lists(st.tuples(st.floats(0, 2), st.integers(1, 300)), min_size=1, max_size=80))
def test_an_ingress_spending_a_lease_stays_within_the_limits_and_reads_the_shared_numbers(rpm, tpm, steps):
    """Leases are limited too: what an ingress admits (from its lease or the limiter) by time t is
    at most a minute's worth plus the refill plus one lease; its headers read what the limiter
    would say with the lease given back."""
    limits = Limits(requests_per_min=rpm, tokens_per_min=tpm)
    shared = TenantLimiter(limits, 0.0)
    lease: LocalLease | None = None
    now, admitted, tokens_in = 0.0, 0, 0
    for dt, tokens in steps:
        now += dt
        need = Need(1, tokens, 1)
        snap = lease.try_take(need, now) if lease else None
        if snap is None:
            d = shared.acquire(need, now, give_back=lease.drain() if lease else Need())
            lease = LocalLease(limits, d.lease, d.snapshot, now, ttl_s=5.0) if d.admitted else None
            snap = lease.snapshot(now) if lease else None
        if snap is None:
            continue
        admitted, tokens_in = admitted + 1, tokens_in + tokens
        assert admitted <= rpm * (1 + LEASE_SHARE) + now * rpm / 60 + 1
        assert tokens_in <= tpm * (1 + LEASE_SHARE) + now * tpm / 60 + 1
        view = copy.deepcopy(shared)
        view.refund(lease.held, now)
        truth = view.snapshot(now)
        assert abs(snap.remaining_requests - truth.remaining_requests) <= 1
        assert abs(snap.remaining_tokens - truth.remaining_tokens) <= 1
