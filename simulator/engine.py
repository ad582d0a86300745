"""One simulated vLLM replica: FCFS queue, continuous batching, chunked prefill, prefix-cached KV blocks.

Modelled on vLLM V1's scheduler, simplified where it does not move the numbers we study:
- A step serves every decoding sequence one token plus prefill chunks of admitted
  prompts, within `max_batched_tokens`; at most `max_num_seqs` sequences run.
- Step time = prefill_ms(prefill tokens of the step, the context they attend to)
  + decode_step_ms(decoders, context) from the measured `EngineProfile`.
- KV blocks for prompt + output are reserved at admission (no preemption); a request
  whose blocks do not fit waits at the queue head (FCFS, like vLLM).
- Prompt blocks become cached as their tokens are computed; a finished request's
  blocks join the free LRU tail-first (vLLM frees in reverse so tails evict first);
  cached blocks of running requests are pinned.
- Decode-only stretches are simulated as one event up to the next completion and are
  cut short when a request arrives, so cost scales with events, not tokens.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvserve.perf_model import EngineProfile
from router.base import RouteRequest


@dataclass
class SimRequest:
    idx: int
    arrival: float
    prompt_tokens: int
    output_tokens: int
    block_hashes: list[int]  # cacheable prompt blocks, chained
    total_blocks: int  # KV blocks reserved while running (prompt + output)
    tenant: str = "default"
    token_ids: Sequence[int] | None = None
    # filled in by the simulation
    route: RouteRequest | None = None
    replica: str | None = None
    routed: float | None = None  # when a replica took it (after any wait at the router)
    admitted: float | None = None
    first_token: float | None = None
    finished: float | None = None
    failed: bool = False
    hit_blocks: int = 0
    fleet_hit_blocks: int | None = None  # leading blocks cached on any replica when routed (new replicas' only)
    hit_tokens: int = 0
    prefilled_tokens: int = 0  # tokens actually computed in prefill (= prompt - hit)
    generated: int = 0
    remaining: int = 0  # prefill tokens still to compute
    registered: int = 0  # prompt blocks already handled (cached or private)
    refs: list[int] = field(default_factory=list)  # cached blocks this request holds a reference on
    finish_step: int = 0


class KVCache:
    """Block pool of one replica: pinned (referenced) blocks plus an LRU of cached free blocks."""

    __slots__ = ("capacity", "used", "refc", "lru", "events")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0  # physical blocks held by running requests
        self.refc: dict[int, int] = {}  # cached block -> running requests referencing it
        self.lru: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced, oldest first
        self.events: dict[int, bool] = {}  # block -> stored (True) / removed (False) since last flush

    def cached_prefix(self, hashes: list[int]) -> int:
        refc, lru, n = self.refc, self.lru, 0
        for h in hashes:
            if h in refc or h in lru:
                n += 1
            else:
                break
        return n

    def try_admit(self, req: SimRequest) -> bool:
        """Pin the request's cached prefix and reserve the rest, evicting LRU blocks; False if it cannot fit."""
        hashes, lru, refc = req.block_hashes, self.lru, self.refc
        hits = from_lru = 0
        for h in hashes:
            if h in refc:
                hits += 1
            elif h in lru:
                hits += 1
                from_lru += 1
            else:
                break
        used = self.used + (req.total_blocks - hits) + from_lru
        if used > self.capacity:
            return False
        prefix = hashes[:hits]
        for h in prefix:
            if h in lru:
                del lru[h]
                refc[h] = 1
            else:
                refc[h] += 1
        for _ in range(used + len(lru) - self.capacity):
            h, _ = lru.popitem(last=False)
            self.events[h] = False
        self.used = used
        req.hit_blocks = hits
        req.refs = list(prefix)
        req.registered = hits
        return True

    def register(self, req: SimRequest, upto: int) -> None:
        """Prompt blocks [registered, upto) are computed: cache them unless an equal block is already cached."""
        refc, lru = self.refc, self.lru
        for h in req.block_hashes[req.registered : upto]:
            if h not in refc and h not in lru:
                refc[h] = 1
                req.refs.append(h)
                self.events[h] = True
            # else: computed twice concurrently; this copy stays private and is freed on finish
        req.registered = max(req.registered, upto)

    def release(self, req: SimRequest) -> None:
        """Unpin the request's blocks: cached ones join the LRU when no one else holds them, private ones free."""
        refc, lru = self.refc, self.lru
        freed = req.total_blocks - len(req.refs)  # private blocks (output, partial, duplicates)
        for h in reversed(req.refs):  # tail first: tails are evicted before heads
            n = refc[h] - 1
            if n:
                refc[h] = n
            else:
                del refc[h]
                lru[h] = None
                freed += 1
        self.used -= freed
        req.refs = []

    def warm(self, hashes: Sequence[int]) -> int:
        """A warm-up request runs alone and finishes: the same admit, register and release as any request,
        so its blocks join the LRU as newest. Returns blocks added (0 when it cannot fit)."""
        req = SimRequest(-1, 0.0, 0, 1, list(hashes), len(hashes))
        if not self.try_admit(req):
            return 0
        self.register(req, len(hashes))
        self.release(req)
        return len(hashes) - req.hit_blocks

    def usage(self) -> float:
        return self.used / self.capacity if self.capacity else 0.0

    def take_events(self) -> tuple[list[int], list[int]]:
        ev, self.events = self.events, {}
        stored = [h for h, s in ev.items() if s]
        removed = [h for h, s in ev.items() if not s]
        return stored, removed


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
        self.prefilling: list[SimRequest] = []
        self.decoding: list[tuple[int, int, SimRequest]] = []  # heap of (finish_step, idx, req)
        self.dec_prompt_sum = 0
        self.step_no = 0
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
        self.seg_chunks: list[tuple[SimRequest, int]] = []
        self.stats_dirty = True
        self.warmed = False  # scale-up warm-up done (or skipped): ready to serve

    # ---- queueing ---------------------------------------------------------

    def enqueue(self, req: SimRequest) -> None:
        self.waiting.append(req)
        self.ongoing += 1
        self.routed_total += 1
        self.queued_prefill_tokens += req.prompt_tokens
        self.stats_dirty = True

    @property
    def running(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.decoding)

    # ---- stepping ---------------------------------------------------------

    def plan_step(self, now: float) -> float | None:
        """Schedule the next step; returns its end time, or None when idle or blocked."""
        n_dec = len(self.decoding)
        budget = self.s.max_batched_tokens - n_dec
        chunks: list[tuple[SimRequest, int]] = []
        ptoks = 0
        # vLLM applies the cap only when another request could use the budget.
        cap = self.s.long_prefill_tokens if self.running + len(self.waiting) > 1 else 0
        cap = cap or budget
        for r in self.prefilling:
            if budget <= 0:
                break
            c = min(r.remaining, budget, cap)
            chunks.append((r, c))
            budget -= c
            ptoks += c
        bs = self.s.block_size
        while self.waiting and budget > 0 and n_dec + len(self.prefilling) < self.s.max_num_seqs:
            r = self.waiting[0]
            if not self.kv.try_admit(r):
                break
            self.waiting.popleft()
            r.admitted = now
            r.hit_tokens = min(r.hit_blocks * bs, r.prompt_tokens - 1)  # the last token is always computed
            r.remaining = r.prompt_tokens - r.hit_tokens
            self.queued_prefill_tokens -= r.hit_tokens
            self.prefilling.append(r)
            c = min(r.remaining, budget, cap)
            chunks.append((r, c))
            budget -= c
            ptoks += c
        if not chunks and not n_dec:
            return None
        step_ms = 0.0
        if ptoks:
            # New tokens attend to what each request already holds (its cache hit, earlier chunks).
            context = sum(r.prompt_tokens - r.remaining for r, _ in chunks) if self.profile.cached_token_ms else 0
            step_ms += self.profile.prefill_ms_for(ptoks, context)
        if n_dec:
            step_ms += self.profile.decode_step_ms(n_dec, self.dec_prompt_sum / n_dec)
        k = 1
        if not chunks:  # decode only: jump to the next completion (cut short by arrivals)
            k = max(1, self.decoding[0][0] - self.step_no)
        self._set_busy(True)
        step_ms *= self.device.busy
        self.version += 1
        self.seg_start, self.seg_step_s, self.seg_k = now, step_ms / 1000.0, k
        self.seg_decoders, self.seg_chunks = n_dec, chunks
        self.stats_dirty = True
        return now + k * self.seg_step_s

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
        k = self.seg_k
        self.step_no += k
        bs = self.s.block_size
        first: list[SimRequest] = []
        finished: list[SimRequest] = []
        for r, c in self.seg_chunks:
            r.remaining -= c
            r.prefilled_tokens += c
            self.queued_prefill_tokens -= c
            done_tokens = r.prompt_tokens - r.remaining
            n_hash = len(r.block_hashes)
            upto = n_hash if r.remaining == 0 else min(n_hash, done_tokens // bs)
            if upto > r.registered:
                self.kv.register(r, upto)
            if r.remaining == 0:
                self.prefilling.remove(r)
                r.first_token = now
                r.generated = 1
                first.append(r)
                if r.output_tokens <= 1:
                    finished.append(r)
                else:
                    r.finish_step = self.step_no + r.output_tokens - 1
                    heapq.heappush(self.decoding, (r.finish_step, r.idx, r))
                    self.dec_prompt_sum += r.prompt_tokens
        dec_tokens = self.seg_decoders * k
        # Decoders that ran this step advanced k tokens; those finishing now leave the batch.
        dec = self.decoding
        while dec and dec[0][0] <= self.step_no:
            _, _, r = heapq.heappop(dec)
            r.generated = r.output_tokens
            self.dec_prompt_sum -= r.prompt_tokens
            finished.append(r)
        for r in finished:
            self.kv.release(r)
            self.ongoing -= 1
            r.finished = now
        self.seg_chunks = []
        self.stats_dirty = True
        return first, finished, self.seg_step_s * 1000.0, dec_tokens

    def kill_all(self) -> list[SimRequest]:
        """Grace period over: everything still here fails (counted, never silently dropped)."""
        lost = list(self.waiting) + list(self.prefilling) + [r for _, _, r in self.decoding]
        self.waiting.clear()
        self.prefilling.clear()
        self.decoding.clear()
        self._set_busy(False)
        self.version += 1
        self.ongoing = 0
        return lost


def blocks_for(tokens: int, block_size: int) -> int:
    return math.ceil(tokens / block_size)
