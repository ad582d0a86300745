"""One simulated vLLM replica: FCFS queue, continuous batching, chunked prefill, prefix-cached KV blocks.

Modelled on vLLM V1's scheduler (`Scheduler.schedule`), simplified where it does not move the numbers we study:
- Each step first schedules the running requests in admission order (a decode token each, or their next
  prefill chunk), then admits waiting ones FCFS, within `max_batched_tokens` and `max_num_seqs`.
- KV blocks are allocated for the tokens scheduled in that step only (a prefill chunk, then one slot per
  decode token; block accounting in `simulator.kv_blocks`). A running request that cannot get a block
  preempts the latest admitted running request, itself if it is the latest (recompute: its blocks are
  freed, its cached prompt blocks stay evictable, and it goes back to the front of the queue); a step
  that preempted admits nobody. A waiting request that does not fit waits at the queue head.
- A request's prefix hit and first token are counted once, at its first admission (vLLM's
  PrefixCacheStats keeps a preempted request's lookups apart). On resume it recomputes its prompt and
  the tokens it had generated, less its blocks still cached.
- Step time = prefill_ms(prefill tokens of the step, the context they attend to)
  + decode_step_ms(decoders, their prompt length) from the measured `EngineProfile`.
- Decode-only stretches are one event up to the next completion or the step before the first one whose
  new blocks would not fit, cut short when a request arrives, so cost scales with events, not tokens.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvserve.perf_model import EngineProfile
from router.base import RouteRequest
from simulator.kv_blocks import KVCache


@dataclass
class SimRequest:
    idx: int
    arrival: float
    prompt_tokens: int
    output_tokens: int
    block_hashes: list[int]  # cacheable (full) prompt blocks, chained
    total_blocks: int  # KV blocks it needs at its longest (prompt + output): larger than a replica, rejected
    tenant: str = "default"
    token_ids: Sequence[int] | None = None
    # filled in by the simulation
    route: RouteRequest | None = None
    replica: str | None = None
    routed: float | None = None  # when a replica took it (after any wait at the router)
    admitted: float | None = None  # first admission
    first_token: float | None = None
    finished: float | None = None
    failed: bool = False
    hit_blocks: int = 0  # prompt blocks found cached at its first admission
    fleet_hit_blocks: int | None = None  # leading blocks cached on any replica when routed (new replicas' only)
    hit_tokens: int = 0
    prefilled_tokens: int = 0  # tokens computed in prefill chunks (recomputation after preemption included)
    generated: int = 0
    computed: int = 0  # tokens with KV slots (vLLM's num_computed_tokens, advanced when scheduled)
    preemptions: int = 0
    unprefilled: int = 0  # its share of the replica's queued prefill tokens
    registered: int = 0  # prompt blocks already cached (or kept private)
    refs: list[int | None] = field(default_factory=list)  # held blocks: cached hash, or None if private

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.generated


@dataclass
class EngineSettings:
    block_size: int  # tokens per cache block (trace: its 512-token blocks)
    kv_blocks: int  # capacity per replica, in those blocks
    max_num_seqs: int
    max_batched_tokens: int
    # vLLM's long_prefill_token_threshold: per-request prefill tokens per step while more than
    # one request is running or waiting (0 = off).
    long_prefill_tokens: int = 0
    # Replicas that share one device (1 / engine.gpus_per_replica). A profile is measured with one engine
    # busy on its device; engines that share it take turns on its compute and memory bandwidth.
    engines_per_device: int = 1


class Device:
    """One accelerator that several replicas share: a step that starts while n of its engines are
    busy (itself included) takes n times the profile's time (processor sharing, fixed at the step's start)."""

    def __init__(self) -> None:
        self.busy = 0


STARTING, SERVING, DRAINING, GONE = "starting", "serving", "draining", "gone"


class Replica:
    """Engine state and step scheduling of one replica; the cluster drives its clock."""

    def __init__(
        self, rid: str, profile: EngineProfile, settings: EngineSettings, created: float, device: Device | None = None
    ) -> None:
        self.rid = rid
        self.device = device or Device()
        self.profile = profile
        self.s = settings
        self.kv = KVCache(settings.kv_blocks)
        self.state = STARTING
        self.created = created
        self.gone_at: float | None = None
        self.drain_started: float | None = None
        self.waiting: deque[SimRequest] = deque()
        self.arriving: dict[int, SimRequest] = {}  # routed here, still on the host path (not yet in the engine)
        self.batch: list[SimRequest] = []  # vLLM's running list: admission order, preempted from the end
        self.ongoing = 0  # routed and not finished (the router's count)
        self.queued_prefill_tokens = 0
        self.routed_total = 0
        # the step in flight
        self.busy = False
        self.version = 0
        self.seg_start = 0.0
        self.seg_step_s = 0.0
        self.seg_k = 0
        self.seg_decoders = 0
        self.seg_chunks: list[tuple[SimRequest, int, bool]] = []  # (request, tokens, is a prefill chunk)
        self.head_may_unblock = False  # the queue head, refused this step, could fit once its hits are evicted
        self.stats_dirty = True
        self.warmed = False  # scale-up warm-up done (or skipped): ready to serve

    # ---- queueing ---------------------------------------------------------

    def reserve(self, req: SimRequest) -> None:
        """Routed here: counted as ongoing while it crosses the host path; `enqueue` hands it to the engine."""
        self.arriving[id(req)] = req
        self.ongoing += 1
        self.routed_total += 1
        self.stats_dirty = True

    def enqueue(self, req: SimRequest) -> None:
        if self.arriving.pop(id(req), None) is None:
            self.ongoing += 1
            self.routed_total += 1
        self.waiting.append(req)
        self._unprefilled(req, req.num_tokens)
        self.stats_dirty = True

    def _unprefilled(self, req: SimRequest, tokens: int) -> None:
        self.queued_prefill_tokens += tokens - req.unprefilled
        req.unprefilled = tokens

    @property
    def running(self) -> int:
        return len(self.batch)

    def has_work(self) -> bool:
        return bool(self.waiting or self.batch)

    # ---- stepping ---------------------------------------------------------

    def plan_step(self, now: float) -> float | None:
        """Schedule the next step; returns its end time, or None when idle."""
        chunks, preempted = self._schedule(now)
        if not chunks:
            # Everything running was preempted: the next schedule admits from the queue's front.
            return self.plan_step(now) if preempted and self.waiting else None
        ptoks = context = n_dec = dec_prompt = 0
        for r, n, prefill in chunks:
            if prefill:
                ptoks += n
                context += r.computed - n  # new tokens attend to what the request already holds
            else:
                n_dec += 1
                dec_prompt += r.prompt_tokens
        step_ms = 0.0
        if ptoks:
            step_ms += self.profile.prefill_ms_for(ptoks, context if self.profile.cached_token_ms else 0)
        if n_dec:
            step_ms += self.profile.decode_step_ms(n_dec, dec_prompt / n_dec)
        k = 1
        if not ptoks and not preempted and len(chunks) == len(self.batch):  # decode only: jump ahead
            k = self._decode_stretch()
        self._set_busy(True)
        step_ms *= self.device.busy
        self.version += 1
        self.seg_start, self.seg_step_s, self.seg_k = now, step_ms / 1000.0, k
        self.seg_decoders, self.seg_chunks = n_dec, chunks
        self.stats_dirty = True
        return now + k * self.seg_step_s

    def _schedule(self, now: float) -> tuple[list[tuple[SimRequest, int, bool]], bool]:
        """One vLLM schedule(): the running requests first (preempting when a block is missing), then,
        unless that preempted, the waiting ones. Advances `computed` and caches the scheduled full blocks."""
        s, kv, batch = self.s, self.kv, self.batch
        bs, budget = s.block_size, s.max_batched_tokens
        # vLLM applies the cap only when another request could use the budget.
        cap = s.long_prefill_tokens if len(batch) + len(self.waiting) > 1 else 0
        chunks: list[tuple[SimRequest, int, bool]] = []
        preempted = self.head_may_unblock = False
        i = 0
        while i < len(batch) and budget > 0:
            r = batch[i]
            n = min(r.num_tokens - r.computed, cap or budget, budget)
            need = blocks_for(r.computed + n, bs) - len(r.refs)
            victim = None
            while need > kv.free_blocks() and victim is not r:
                victim = batch.pop()
                self._preempt(victim)
                preempted = True
            if victim is r:
                break
            kv.allocate(r, need)
            chunks.append(self._scheduled(r, n))
            budget -= n
            i += 1
        while not preempted and self.waiting and budget > 0 and len(batch) < s.max_num_seqs:
            r = self.waiting[0]
            ntok = r.num_tokens
            hits = kv.cached_prefix(r.block_hashes, (ntok - 1) // bs)  # the last token is always computed
            n = min(ntok - hits * bs, cap or budget, budget)
            new = blocks_for(hits * bs + n, bs) - hits
            if not kv.admit(r, hits, new):
                # It asks for `new` blocks plus its hits still in the free queue. Losing a hit to eviction
                # frees none of those for it, unless its chunk is cut to the budget (then it asks no more
                # new blocks for a smaller hit): only then can the shrinking free queue let it in.
                self.head_may_unblock = ntok > min(cap or budget, budget) and new <= kv.free_blocks()
                break
            self.waiting.popleft()
            r.computed = hits * bs
            if r.admitted is None:
                r.admitted, r.hit_blocks, r.hit_tokens = now, hits, hits * bs
            self._unprefilled(r, ntok - r.computed)
            batch.append(r)
            chunks.append(self._scheduled(r, n))
            budget -= n
        return chunks, preempted

    def _scheduled(self, r: SimRequest, n: int) -> tuple[SimRequest, int, bool]:
        prefill = n > 1 or r.generated == 0
        if not prefill and r.unprefilled:
            self._unprefilled(r, 0)
        r.computed += n
        self.kv.cache_full(r, min(len(r.block_hashes), r.computed // self.s.block_size))
        return r, n, prefill

    def _preempt(self, r: SimRequest) -> None:
        """vLLM's recompute preemption: free its blocks and put it back at the queue's front."""
        self.kv.release(r, r.computed % self.s.block_size != 0)
        r.computed = 0
        r.preemptions += 1
        self._unprefilled(r, r.num_tokens)
        self.waiting.appendleft(r)

    def _decode_stretch(self) -> int:
        """Steps of the decode-only stretch that starts now: up to the next completion, and no further than
        the new blocks the free queue can supply (the step after that one preempts, so it runs alone).
        A waiting request stays blocked (nothing is freed before the next completion), or where evicting its
        cached blocks could let it in, the stretch stops before the next allocation."""
        batch, bs = self.batch, self.s.block_size
        k_max = min(r.output_tokens - r.generated for r in batch)
        free = 0 if self.waiting and self.head_may_unblock else self.kv.free_blocks()

        def demand(k: int) -> int:  # blocks needed by steps 2..k of the stretch
            return sum(-(-(r.computed + k - 1) // bs) - len(r.refs) for r in batch)

        if k_max <= 1 or demand(k_max) <= free:
            return max(k_max, 1)
        lo, hi = 1, k_max  # demand(lo) <= free < demand(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if demand(mid) <= free:
                lo = mid
            else:
                hi = mid
        return lo

    def _set_busy(self, busy: bool) -> None:
        if busy != self.busy:
            self.device.busy += 1 if busy else -1
        self.busy = busy

    def cut_segment(self, now: float) -> float | None:
        """A request arrived during a multi-step decode stretch: end it at the step boundary after `now`."""
        if not self.busy or self.seg_k <= 1:
            return None
        done = int((now - self.seg_start) / self.seg_step_s) if self.seg_step_s > 0 else 0
        k = min(self.seg_k, done + 1)
        if k >= self.seg_k:
            return None
        self.seg_k = k
        self.version += 1
        return self.seg_start + k * self.seg_step_s

    def end_step(self, now: float) -> tuple[list[SimRequest], list[SimRequest], float, int]:
        """Apply the finished step: (first-token requests, finished requests, step_ms, decode tokens)."""
        self._set_busy(False)
        k, bs = self.seg_k, self.s.block_size
        first: list[SimRequest] = []
        finished: list[SimRequest] = []
        for r, n, prefill in self.seg_chunks:
            if prefill:
                r.prefilled_tokens += n
                if r.computed < r.num_tokens:  # more prompt to go
                    self._unprefilled(r, r.num_tokens - r.computed)
                    continue
                self._unprefilled(r, 0)
            if k > 1:  # the stretch's later steps: one more slot each, blocks as boundaries are crossed
                r.computed += k - 1
                self.kv.allocate(r, blocks_for(r.computed, bs) - len(r.refs))
            r.generated += k
            if r.first_token is None:
                r.first_token = now
                first.append(r)
            if r.generated >= r.output_tokens:
                finished.append(r)
        if finished:
            done = {id(r) for r in finished}
            self.batch = [r for r in self.batch if id(r) not in done]
        for r in finished:
            self.kv.release(r, r.computed % bs != 0)
            self.ongoing -= 1
            r.finished = now
        self.seg_chunks = []
        self.stats_dirty = True
        return first, finished, self.seg_step_s * 1000.0, self.seg_decoders * k

    def kill_all(self) -> list[SimRequest]:
        """Grace period over: everything still here fails (counted, never silently dropped)."""
        lost = list(self.arriving.values()) + list(self.waiting) + list(self.batch)
        self.arriving.clear()
        self.waiting.clear()
        self.batch.clear()
        self._set_busy(False)
        self.version += 1
        self.ongoing = 0
        return lost


def blocks_for(tokens: int, block_size: int) -> int:
    return math.ceil(tokens / block_size)
