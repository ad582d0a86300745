"""kvserve's router: token-exact prefix index + predicted-TTFT cost, near-ties broken at random.

For each replica: how many leading blocks of the prompt it holds (`PrefixIndex`,
fed by engine KV events plus speculative entries for what we just routed), ->
uncached prompt tokens -> routing cost (`router.cost`): predicted TTFT,
including prefill work this router sent there that the replica's stats do not
show yet, plus the eviction a miss causes and the context this router has in
flight there (Dynamo's decode-load term), plus the other families' prefixes a
miss would push out of that replica's cache (`router.footprint`): families are
packed so that the set living on each replica fits its cache.

Only candidates are scored (`router.candidates`): the replicas holding the
prompt's prefix, the family's home, and `sample_replicas` others drawn at random,
so a decision costs O(candidates), not O(replicas); with few replicas every one
is a candidate.

The minimum wins; replicas within `tie_tolerance` of it are shuffled with a
seeded RNG, so a burst sharing one hot prefix spreads instead of herding onto
whichever replica happened to win the first decision. A hot prefix spills to
another replica by itself once its home's queued work costs more than
re-prefilling the prefix elsewhere.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kvserve.policy_params import RouterParams
from router.base import ReplicaLoad, RouteRequest, RoutingPolicy
from router.candidates import candidate_ids
from router.cost import CostParams, cost_terms_ms
from router.footprint import Footprints
from router.index import PrefixIndex


@dataclass
class _InFlight:
    uncached: int  # prompt tokens the replica had to prefill when we routed it
    context: int  # prompt + expected output tokens: the KV/batch share it holds until done
    prefill_done_at: float  # predicted: routing time + predicted TTFT
    pending: bool = True  # still counted as waiting for prefill in its replica's _Pending totals


@dataclass
class _Pending:
    """One replica's requests from us predicted to be still prefilling, kept as running totals.

    Entries leave when their predicted prefill end passes (a heap ordered by that
    time) or when they finish, so a decision reads two integers instead of walking
    every in-flight request (that walk dominated overloaded simulations).
    Assumes `now` does not go backwards; if it does, a request already counted as
    running stays running (the next stats report corrects the replica's load).
    """

    tokens: int = 0
    count: int = 0
    heap: list[tuple[float, int, _InFlight]] = field(default_factory=list)

    def add(self, entry: _InFlight, seq: int) -> None:
        self.tokens += entry.uncached
        self.count += 1
        heapq.heappush(self.heap, (entry.prefill_done_at, seq, entry))

    def drop(self, entry: _InFlight) -> None:
        """`entry` left before its predicted prefill end (finished, retried); its heap item is skipped later."""
        if entry.pending:
            entry.pending = False
            self.tokens -= entry.uncached
            self.count -= 1

    def advance(self, now: float) -> None:
        heap = self.heap
        while heap and heap[0][0] <= now:
            self.drop(heapq.heappop(heap)[2])


Loads = Sequence[ReplicaLoad] | Mapping[str, ReplicaLoad]


class PrefixCostRouter(RoutingPolicy):
    name = "kvserve"
    takes_load_map = True

    @classmethod
    def create(cls, params: RouterParams, seed: int) -> RoutingPolicy:
        return cls(params, seed)

    def __init__(
        self,
        cfg: RouterParams | None = None,
        seed: int = 0,
        block_size: int | None = None,
        params: CostParams | None = None,
    ) -> None:
        cfg = cfg or RouterParams()
        self.cfg = cfg
        self.params = params or cfg.cost
        # None: infer per request from prompt length / chain length (works for any engine block size).
        self.block_size = block_size
        self.index = PrefixIndex(cfg.speculative_ttl_s, cfg.stale_after_s)
        self._rng = random.Random(seed)
        self._sample_rng = random.Random(f"{seed}:candidates")  # apart, so ties shuffle as without sampling
        self._inflight: dict[str, dict[str, _InFlight]] = {}  # replica -> request id -> what we sent
        self._pending: dict[str, _Pending] = {}  # replica -> our requests predicted still prefilling
        self._seq = itertools.count()  # heap tie-breaker
        self._active: dict[str, int] = {}  # replica -> context tokens of our in-flight requests there
        # The last decision (request id, index matches, per-replica evaluation), reused by on_routed.
        self._last: tuple[str, dict[str, int], dict[str, tuple[float, float]]] | None = None
        # Prefix family (hash of the prompt's second block) -> the replica it was last sent to.
        self._home: OrderedDict[int, tuple[str, float]] = OrderedDict()  # family -> (replica, prefill done at)
        self._max_homes = 100_000
        self.footprints = Footprints(cfg.footprint_window_s)

    # ---- decision ----------------------------------------------------------

    def costs(self, request: RouteRequest, replicas: Loads, now: float) -> dict[str, float]:
        """Routing cost (ms) per candidate replica for `request`: `router.cost.routing_cost_ms` with our in-flight work."""
        return {rid: c for rid, (c, _) in self._evaluate(request, replicas, now).items()}

    @staticmethod
    def _family(request: RouteRequest) -> int | None:
        hashes = request.block_hashes
        return hashes[min(1, len(hashes) - 1)] if hashes else None

    def rank(self, request: RouteRequest, replicas: Loads, now: float) -> list[str]:
        """Candidate replica ids, best first (every replica while they are few; `router.candidates`).

        `replicas` may be a mapping replica id -> load, read only for the candidates.
        """
        costs = self.costs(request, replicas, now)
        best = min(costs.values())
        # Stickiness: a family stays on its home (the replica it last went to) when home holds its
        # prefix and serves within the spill bound, or costs within `home_affinity` of the best.
        # A tenant whose prefix was evicted everywhere would otherwise move on a small load
        # difference and end up cached on every replica, halving the cluster's effective cache.
        # The affinity rule waits out a cold burst: while the family's last request is still
        # predicted to be prefilling at home and the engine has not confirmed the prefix there,
        # followers gain nothing from going there and must stay free to spread.
        family = self._family(request)
        home, settled_at = self._home.get(family, (None, 0.0))  # type: ignore[arg-type]
        if home in costs and (
            self._holds_within_spill(request, home)
            or ((now >= settled_at or self.index.confirms(home, family))
                and costs[home] <= best * (1.0 + self.cfg.home_affinity) + 1e-9)
        ):
            return [home, *sorted((rid for rid in costs if rid != home), key=lambda rid: (costs[rid], rid))]
        limit = best * (1.0 + self.cfg.tie_tolerance) + 1e-9
        ties = [rid for rid, c in costs.items() if c <= limit]
        ties.sort()  # replicas' input order must not bias the seeded shuffle
        self._rng.shuffle(ties)
        rest = sorted((rid for rid, c in costs.items() if c > limit), key=lambda rid: (costs[rid], rid))
        return ties + rest

    def _holds_within_spill(self, request: RouteRequest, home: str) -> bool:
        """Home holds the prompt's prefix and its predicted TTFT is under `spill_ttft_ms`: stay, whatever the rest.

        Under saturation the replicas' predicted queues swing past each other; chasing the
        shorter one moves tenants back and forth, every move a miss that adds prefill work and
        evicts someone else. A fixed TTFT bound spills only what home cannot serve in time.
        The rule guards against misses only: when another replica holds as much of the prompt
        (a warmed new replica after scale-up, or a hot prefix that already spilled), leaving home
        misses nothing, and the cost model with the affinity margin decides.
        """
        spill = self.cfg.spill_ttft_ms
        last = self._last
        if spill is None or last is None or last[0] != request.request_id:
            return False
        matches = last[1]
        held = matches.get(home, 0)
        if held <= 0 or last[2][home][1] > spill:
            return False
        return all(n < held for rid, n in matches.items() if rid != home and rid in last[2])

    def _evaluate(self, request: RouteRequest, replicas: Loads, now: float) -> dict[str, tuple[float, float]]:
        """candidate replica -> (routing cost ms, predicted TTFT ms); remembered for the on_routed that follows."""
        loads = replicas if isinstance(replicas, Mapping) else {load.replica_id: load for load in replicas}
        matches = self.index.match(request.block_hashes, now)
        family = self._family(request)
        home = self._home.get(family) if family is not None else None
        ids = candidate_ids(matches, list(loads), loads, self.cfg.sample_replicas, self._sample_rng,
                            (home[0],) if home else ())
        bs = self._block_size(request)
        prompt = request.num_prompt_tokens
        params, active = self.params, self._active
        fp_weight = self.cfg.footprint_weight * params.prefill_ms_per_token
        fp_tokens, headroom = len(request.block_hashes) * bs, self.cfg.footprint_headroom
        out: dict[str, tuple[float, float]] = {}
        for rid in ids:
            load = loads[rid]
            queued, running = self._known_load(load, now)
            uncached = prompt - matches.get(rid, 0) * bs
            cost, ttft = cost_terms_ms(queued, running, load.kv_usage, uncached, active.get(rid, 0), params)
            if fp_weight and load.kv_capacity_tokens and family is not None:
                cost += fp_weight * self.footprints.overflow(
                    rid, family, fp_tokens, load.kv_capacity_tokens * headroom, now)
            out[rid] = (cost, ttft)
        self._last = (request.request_id, matches, out)
        return out

    # ---- feedback ----------------------------------------------------------

    def on_routed(self, request: RouteRequest, replica_id: str, now: float) -> None:
        last = self._last
        if last is None or last[0] != request.request_id or replica_id not in last[2]:
            # Routed without a matching rank call: evaluate with only what we know ourselves.
            self._evaluate(request, {replica_id: ReplicaLoad(replica_id)}, now)
            last = self._last
        assert last is not None
        self._last = None
        _, matches, evaluated = last
        prefill_done_at = now + evaluated[replica_id][1] / 1000.0
        family = self._family(request)
        if family is not None:
            self.footprints.record(family, replica_id, len(request.block_hashes) * self._block_size(request), now)
            self._home[family] = (replica_id, prefill_done_at)
            self._home.move_to_end(family)
            if len(self._home) > self._max_homes:
                self._home.popitem(last=False)
        uncached = max(request.num_prompt_tokens - matches.get(replica_id, 0) * self._block_size(request), 0)
        context = request.num_prompt_tokens + request.expected_output_tokens
        mine = self._inflight.setdefault(replica_id, {})
        pending = self._pending.setdefault(replica_id, _Pending())
        old = mine.pop(request.request_id, None)  # a retry re-routed to the same replica
        if old is not None:
            pending.drop(old)
        entry = _InFlight(uncached, context, prefill_done_at)
        mine[request.request_id] = entry
        if prefill_done_at > now:
            pending.add(entry, next(self._seq))
        else:
            entry.pending = False
        self._active[replica_id] = self._active.get(replica_id, 0) + context - (old.context if old else 0)
        self.index.on_routed(replica_id, request.block_hashes, now)

    def on_finished(self, request: RouteRequest, replica_id: str, now: float) -> None:
        entry = self._inflight.get(replica_id, {}).pop(request.request_id, None)
        if entry is not None:
            self._active[replica_id] -= entry.context
            self._pending[replica_id].drop(entry)

    def on_cache_snapshot(self, replica_id: str, block_hashes: Iterable[int], now: float) -> None:
        self.index.on_cache_snapshot(replica_id, block_hashes, now)

    def on_cache_events(self, replica_id: str, stored: Iterable[int], removed: Iterable[int], now: float) -> None:
        self.index.on_cache_events(replica_id, stored, removed, now)

    def on_replica_gone(self, replica_id: str) -> None:
        self.index.on_replica_gone(replica_id)
        self._inflight.pop(replica_id, None)
        self._pending.pop(replica_id, None)
        self._active.pop(replica_id, None)
        self.footprints.forget_replica(replica_id)

    # ---- helpers -----------------------------------------------------------

    def _block_size(self, request: RouteRequest) -> int:
        if self.block_size:
            return self.block_size
        n = len(request.block_hashes)
        return max(request.num_prompt_tokens // n, 1) if n else 1

    def _known_load(self, load: ReplicaLoad, now: float) -> tuple[int, int]:
        """(queued prefill tokens, running sequences) on `load`'s replica, merged with our own requests.

        Replica stats arrive every `stats_period_s`, so the requests we routed
        since are invisible in them. Each of our in-flight requests is assumed to
        be waiting for prefill until the TTFT we predicted when routing it, and
        running after. Taking the max (not the sum) with the reported numbers
        avoids counting twice the requests that the stats do show.
        """
        rid = load.replica_id
        mine = self._inflight.get(rid)
        if not mine:
            return load.queued_prefill_tokens, load.running
        pending = self._pending[rid]
        pending.advance(now)
        return max(load.queued_prefill_tokens, pending.tokens), max(load.running, len(mine) - pending.count)
