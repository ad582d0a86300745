"""Discrete-event cluster: replicas, routing through the pure policies, autoscaling, drain.

One heap of timed events (engine step ends, stats ticks, scaling decisions, replica
start-ups, drain deadlines) plus the workload's sorted arrivals. Ties break by
insertion order, so a run is a pure function of (workload, settings, seed).

What policies see is what the live adapter feeds them: `rank(RouteRequest,
[ReplicaLoad...], now)` with the router's own `ongoing` count updated at once and
the engine's stats (waiting, running, queued prefill tokens, KV usage) refreshed
every `stats_period_s`, together with the KV cache events (stored/removed blocks)
gathered over that period.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from autoscaling.base import Decision, ReplicaMetrics, ScalingInput, ScalingPolicy
from autoscaling.window import SignalWindow, metrics_from_stats
from kvserve.config import AutoscalingConfig, RouterConfig
from kvserve.perf_model import EngineProfile
from flow.fair_queue import QueueFull
from simulator.bounds import fleet_prefix
from simulator.engine import DRAINING, GONE, SERVING, STARTING, Device, EngineSettings, Replica, SimRequest
from simulator.metrics import ItlLog, TrailingPeak, percentile, seconds_per_minute
from simulator.flow_pending import FlowPending, FlowSim
from simulator.workloads import SimWorkload
from router.base import ReplicaLoad, RouteRequest, RoutingPolicy
from router.hot_prefixes import HotPrefixTracker, family_key
from router.retire import CacheRecency, retire_order

_STEP, _TICK, _DECIDE, _READY, _GRACE, _ARRIVE, _HOST = range(7)
PLOT_WINDOW_S = 10.0
NEW_REPLICA_WINDOW_S = 60.0  # a new replica's first minute of serving: the pre-warm target's window


@dataclass
class ScalingSetup:
    policy: ScalingPolicy
    cfg: AutoscalingConfig
    start_s: float  # engine start-up delay before a new replica is routable
    decision_interval_s: float = 1.0
    # Which serving replicas a scale-down drains: `least_loaded`; `newest` (Ray Serve 2.60's own choice on
    # one node: `deployment_scheduler._get_replicas_to_stop`); `cache` (router.retire: least cache loss).
    retire: str = "least_loaded"
    # A new replica's requests in its first this-many seconds of serving also record what the whole
    # fleet had cached of them (`SimRequest.fleet_hit_blocks`: the pre-warm bound, simulator.bounds).
    new_replica_window_s: float = NEW_REPLICA_WINDOW_S


@dataclass
class RunResult:
    name: str
    requests: list[SimRequest]
    itl: ItlLog
    end_time: float
    replica_seconds: float
    routed: dict[str, int]  # requests routed per replica
    failed_requests: int
    rejected_requests: int  # larger than one replica's KV capacity: can never run
    overloaded_requests: int  # turned away with a 503: the routers' queue was full (max_queued_requests)
    wall_s: float
    timeline: list[dict] = field(default_factory=list)  # one row per scaling decision
    serving_since: dict[str, float] = field(default_factory=dict)  # replica -> when it first took traffic
    events: list[tuple[float, str, int, str]] = field(default_factory=list)  # (t, kind, request, replica) if traced
    replica_seconds_by_minute: list[float] = field(default_factory=list)  # `replica_seconds`, minute by minute
    overloaded_idx: set[int] = field(default_factory=set)  # requests answered 503 (queue bounds)
    scale_downs: list[float] = field(default_factory=list)  # when serving replicas were drained


class Cluster:
    def __init__(
        self,
        workload: SimWorkload,
        profile: EngineProfile,
        engine: EngineSettings,
        policy: RoutingPolicy,
        *,
        replicas: int,
        router_cfg: RouterConfig | None = None,
        scaling: ScalingSetup | None = None,
        name: str = "",
        trace_events: bool = False,
        on_progress: Callable[[int, int], None] | None = None,
        max_ongoing: int | None = None,
        max_queued: int | None = None,
        flow: FlowSim | None = None,
    ) -> None:
        self.workload = workload
        self.profile = profile
        self.engine = engine
        self.policy = policy
        self.router_cfg = router_cfg or RouterConfig()
        self.scaling = scaling
        self.name = name or getattr(policy, "name", "policy")
        self.trace = trace_events
        self.on_progress = on_progress
        self.reqs = workload.fresh()
        self.replicas: dict[str, Replica] = {}
        self.loads: dict[str, ReplicaLoad] = {}  # routable (serving) replicas only
        self.snap: dict[str, tuple[int, int, int, float]] = {}  # last reported engine stats
        self.touched: set[str] = set()
        # The live replica's own signal window (autoscaling.window), fed the same events, so the
        # policy sees exactly what `record_autoscaling_stats` reports live.
        self.windows: dict[str, SignalWindow] = {}
        self.prefix_hits: dict[str, list[int]] = {}  # [hit tokens, prompt tokens] since start: vLLM's counters
        self.serving_since: dict[str, float] = {}
        self.heap: list[tuple[float, int, int, object, int]] = []
        self.seq = itertools.count()
        # Serve's per-replica `max_ongoing_requests`: a request that finds every replica full
        # waits at the router (in `pending`, FIFO) until one has room, as it does live.
        self.max_ongoing = max_ongoing
        self.max_queued = max_queued if max_queued is not None and max_queued >= 0 else None  # beyond it, 503
        self.pending: deque[SimRequest] | FlowPending = deque()  # arrived while no replica was routable or had room
        self.flow = flow
        if flow is not None:  # the ingress's fair queue instead of Serve's FIFO (simulator.flow_pending)
            self.pending = FlowPending(flow, self._cached_tokens)
        self.overloaded_idx: set[int] = set()
        self.pending_peak = TrailingPeak()  # what Serve's `total_queued_requests` reports
        self.itl = ItlLog()
        self.open = len(self.reqs)
        self.failed = 0
        self.rejected = 0
        self.overloaded = 0
        self.done = 0
        self.end_time = 0.0
        self.timeline: list[dict] = []
        self.events: list[tuple[float, str, int, str]] = []
        self.cluster_ttft: deque[tuple[float, float]] = deque()
        self.cluster_arrivals: deque[float] = deque()
        self._n_created = 0
        self.recency = CacheRecency() if scaling is not None and scaling.retire == "cache" else None
        self.scale_downs: list[float] = []  # when serving replicas were drained
        # Scale-up warming, as live: the ingress tracks each family's hot prefix (`router.hot_prefixes`,
        # here over block hashes, one "token" per block) and a starting replica pre-fills the hottest.
        self.hot: HotPrefixTracker | None = None
        if scaling is not None and scaling.cfg.warm_prefixes:
            self.hot = HotPrefixTracker(block_size=1, min_blocks=2)
        initial = replicas
        if scaling is not None:
            c = scaling.cfg
            initial = c.initial_replicas if c.initial_replicas is not None else c.min_replicas
            initial = min(max(initial, c.min_replicas), c.max_replicas)
        for _ in range(initial):
            self._new_replica(0.0, ready=True)

    # ---- plumbing -----------------------------------------------------------

    def _push(self, t: float, kind: int, obj: object = None, ver: int = 0) -> None:
        heapq.heappush(self.heap, (t, next(self.seq), kind, obj, ver))

    def _log(self, t: float, kind: str, req: SimRequest, rid: str) -> None:
        if self.trace:
            self.events.append((t, kind, req.idx, rid))

    def _device_with_room(self) -> Device:
        """The fullest device with a free slot, else a new one: replicas pack onto devices like Serve's
        fractional GPU placement does."""
        members: dict[int, list[Replica]] = {}
        for r in self.replicas.values():
            if r.state != GONE:
                members.setdefault(id(r.device), []).append(r)
        room = [m for m in members.values() if len(m) < self.engine.engines_per_device]
        return max(room, key=len)[0].device if room else Device()

    def _new_replica(self, now: float, ready: bool) -> Replica:
        rid = f"r{self._n_created:04d}"
        self._n_created += 1
        rep = Replica(rid, self.profile, self.engine, now, self._device_with_room())
        self.replicas[rid] = rep
        self.snap[rid] = (0, 0, 0, 0.0)
        if ready:
            self._make_serving(rep, now)
        else:
            self._push(now + self.scaling.start_s, _READY, rep)  # type: ignore[union-attr]
        return rep

    def _ready(self, rep: Replica, now: float) -> None:
        """The engine is up. Warm it first when warming is on (the replica stays STARTING meanwhile)."""
        if self.hot is None or rep.warmed:
            self._make_serving(rep, now)
            return
        rep.warmed = True
        cfg, ms, bs = self.scaling.cfg, 0.0, self.engine.block_size  # type: ignore[union-attr]
        # As live (deployments/replica.py): the ingress's warm set for one more replica than serve now;
        # each prefix one max_tokens=1 request run alone, prefilling what is not cached yet. Live aborts
        # the one running when the time budget runs out; here it is not started.
        serving = sum(1 for r in self.replicas.values() if r.state == SERVING)
        for _, hashes, *_ in self.hot.warm_set(now, serving + 1, cfg.warm_min_requests, cfg.warm_prefixes):
            new = len(hashes) - rep.kv.cached_prefix(hashes)
            step = self.profile.prefill_ms_for(new * bs, (len(hashes) - new) * bs) + self.profile.decode_step_ms(1)
            if (ms + step) / 1000.0 > cfg.warm_timeout_s:
                break
            rep.kv.warm(hashes)
            ms += step
        if not ms:
            self._make_serving(rep, now)  # nothing hot enough: serve at once
            return
        self.touched.add(rep.rid)  # its stored-block events reach the routers with the next stats
        self._push(now + ms / 1000.0, _READY, rep)

    def _make_serving(self, rep: Replica, now: float) -> None:
        rep.state = SERVING
        self.serving_since[rep.rid] = now
        if self.scaling is not None:
            self.windows[rep.rid] = SignalWindow(self.scaling.cfg.look_back_s, clock=lambda t=now: t)
            self.prefix_hits[rep.rid] = [0, 0]
        self._refresh_load(rep)
        self._drain_pending(now)

    def _has_room(self, rid: str) -> bool:
        ongoing = self.replicas[rid].ongoing
        if self.flow is not None and ongoing >= self.flow.slots_per_replica:
            return False
        return self.max_ongoing is None or ongoing < self.max_ongoing

    def _cached_tokens(self, req: SimRequest) -> int:
        best = max((self.replicas[rid].kv.cached_prefix(req.block_hashes) for rid in self.loads), default=0)
        return min(best * self.engine.block_size, req.prompt_tokens)

    def _turn_away(self, req: SimRequest, now: float) -> None:
        """503: a queue bound (Serve's max_queued_requests, or the fair queue's)."""
        req.failed, req.finished = True, now
        self.overloaded += 1
        self.overloaded_idx.add(req.idx)
        self._closed(now)

    def _drain_pending(self, now: float) -> None:
        while self.pending and any(self._has_room(rid) for rid in self.loads):
            self._route(self.pending.popleft(), now)
        self.pending_peak.set(len(self.pending), now)

    def _wait_at_router(self, req: SimRequest, now: float) -> None:
        if isinstance(self.pending, FlowPending):
            try:
                evicted = self.pending.push(req, now)
            except QueueFull:
                self._turn_away(req, now)
                return
            if evicted is not None:
                self._turn_away(evicted, now)
            self.pending_peak.set(len(self.pending), now)
            return
        if self.max_queued is not None and len(self.pending) >= self.max_queued:
            # Serve's `max_queued_requests`: the caller gets a 503 at once rather than a wait.
            self._turn_away(req, now)
            return
        self.pending.append(req)
        self.pending_peak.set(len(self.pending), now)

    def _refresh_load(self, rep: Replica) -> None:
        if rep.state != SERVING:
            return
        w, run, q, kv = self.snap[rep.rid]
        self.loads[rep.rid] = ReplicaLoad(rep.rid, rep.ongoing, w, run, q, kv, rep.s.kv_blocks * rep.s.block_size)

    def _kick(self, rep: Replica, now: float) -> None:
        if rep.busy:
            end = rep.cut_segment(now)
        else:
            end = rep.plan_step(now)
        if end is not None:
            self._push(end, _STEP, rep, rep.version)
        self.touched.add(rep.rid)

    # ---- requests -----------------------------------------------------------

    def _arrive(self, req: SimRequest, now: float) -> None:
        if self.scaling is not None:
            self.cluster_arrivals.append(now)
        if self.hot is not None and len(req.block_hashes) >= 2:
            self.hot.observe(family_key(req.tenant, req.block_hashes), req.block_hashes, now,
                             block_hashes=req.block_hashes)
        if req.total_blocks > self.engine.kv_blocks:
            req.failed, req.finished = True, now
            self.rejected += 1
            self._closed(now)
            return
        if self.pending or not any(self._has_room(rid) for rid in self.loads):
            self._wait_at_router(req, now)  # FIFO: no overtaking the requests already waiting
            return
        if isinstance(self.pending, FlowPending):
            self.pending.charge(req)
        self._route(req, now)

    def _route(self, req: SimRequest, now: float) -> None:
        if req.route is None:
            req.route = RouteRequest(
                request_id=str(req.idx),
                block_hashes=req.block_hashes,
                num_prompt_tokens=req.prompt_tokens,
                tenant=req.tenant,
                token_ids=req.token_ids,
                expected_output_tokens=req.output_tokens,
            )
        loads = self.loads if self.policy.takes_load_map else list(self.loads.values())
        ranked = self.policy.rank(req.route, loads, now)
        # A full replica turns the request away and the router tries the next in its ranking;
        # past a sampling policy's candidates, the least-loaded replica with room.
        rid = next((r for r in ranked if r in self.loads and self._has_room(r)), None)
        if rid is None:
            rid = min((r for r in self.loads if self._has_room(r)), key=lambda r: self.replicas[r].ongoing, default=None)
        if rid is None:
            raise RuntimeError(f"policy {self.name} ranked no routable replica with room")
        self.policy.on_routed(req.route, rid, now)
        if self.recency is not None:
            self.recency.on_routed(rid, req.block_hashes, now)
        rep = self.replicas[rid]
        req.replica, req.routed = rid, now
        since = self.serving_since[rid]
        if self.scaling is not None and since > 0.0 and now - since <= self.scaling.new_replica_window_s:
            req.fleet_hit_blocks = fleet_prefix((r.kv for r in self.replicas.values() if r.state != GONE), req.block_hashes)
        self._log(now, "routed", req, rid)
        if self.scaling is not None:
            self.windows[rid].on_arrival(req.prompt_tokens, now=now, waited_s=now - req.arrival)
        host_ms = self.profile.host_ms(rep.ongoing + 1)
        if host_ms > 0.0:  # the host path first (EngineProfile.host_ms): the engine sees it after
            rep.reserve(req)
            self._refresh_load(rep)
            self._push(now + host_ms / 1000.0, _HOST, req)
            return
        self._to_engine(rep, req, now)

    def _to_engine(self, rep: Replica, req: SimRequest, now: float) -> None:
        rep.enqueue(req)
        self._refresh_load(rep)
        self._kick(rep, now)

    def _finish(self, req: SimRequest, rep: Replica, now: float) -> None:
        self.done += 1
        self.end_time = max(self.end_time, now)
        self._log(now, "finished", req, rep.rid)
        self.policy.on_finished(req.route, rep.rid, now)  # type: ignore[arg-type]
        if isinstance(self.pending, FlowPending):
            self.pending.finished(req)
        self._closed(now)

    def _closed(self, now: float) -> None:
        """A request left the system (done, failed or rejected): closed loops release the next one."""
        self.open -= 1
        c = self.workload.concurrency
        if c:
            nxt = self._closed_next
            if nxt < len(self.reqs):
                self._closed_next += 1
                self.reqs[nxt].arrival = now
                self._push(now, _ARRIVE, self.reqs[nxt])
        if self.on_progress and (self.done % 200 == 0 or self.open == 0):
            self.on_progress(self.done + self.failed + self.rejected + self.overloaded, len(self.reqs))

    # ---- engine steps -------------------------------------------------------

    def _step_end(self, rep: Replica, now: float) -> None:
        first, finished, step_ms, dec_tokens = rep.end_step(now)
        if dec_tokens:
            self.itl.add(now, step_ms, dec_tokens)
        win = self.windows.get(rep.rid) if self.scaling is not None else None
        if win is not None and dec_tokens:
            win.on_token_gap(step_ms, now, count=dec_tokens)
        for r in first:
            self._log(now, "first_token", r, rep.rid)
            if win is not None:
                # As live, where vLLM times a request from when the replica received it: the
                # wait at the router reaches the autoscaler as the routers' queue instead.
                win.on_first_token((now - (r.routed if r.routed is not None else r.arrival)) * 1000.0, now)
                hits = self.prefix_hits[rep.rid]
                hits[0] += r.hit_tokens  # vLLM counts tokens: a prompt's partial last block is a miss
                hits[1] += r.prompt_tokens
                self.cluster_ttft.append((now, (now - r.arrival) * 1000.0))  # the timeline plots what users saw
        for r in finished:
            if win is not None:
                win.on_completion(r.output_tokens, now)
            self._finish(r, rep, now)
        if finished and self.pending:
            self._drain_pending(now)
        if rep.has_work():
            self._kick(rep, now)
        self.touched.add(rep.rid)
        if rep.state == SERVING:
            self._refresh_load(rep)
        elif rep.state == DRAINING and rep.ongoing == 0:
            self._remove(rep, now)

    # ---- stats period -------------------------------------------------------

    def _tick(self, now: float) -> None:
        # Every live replica reports each period, changed or not (the report doubles as
        # its heartbeat: the router's index drops replicas it has not heard from).
        touched, on_events = self.touched, self.policy.on_cache_events
        for rid, rep in self.replicas.items():
            if rep.state == GONE:
                continue
            if rid not in touched:
                on_events(rid, (), (), now)
                continue
            stored, removed = rep.kv.take_events()
            on_events(rid, stored, removed, now)
            if self.recency is not None:
                self.recency.on_cache_events(rid, stored, removed, now)
            self.snap[rid] = (len(rep.waiting), rep.running, max(rep.queued_prefill_tokens, 0), rep.kv.usage())
            self._refresh_load(rep)
        touched.clear()
        if self.open > 0:
            self._push(now + self.router_cfg.stats_period_s, _TICK)

    # ---- autoscaling --------------------------------------------------------

    def _replica_metrics(self, rep: Replica, now: float) -> ReplicaMetrics:
        """Live path: engine gauges into the window, `to_stats_dict()` out, `metrics_from_stats` in."""
        win = self.windows[rep.rid]
        hit, queried = self.prefix_hits[rep.rid]
        win.set_engine_state(len(rep.waiting), rep.running, rep.kv.usage(), hit / queried if queried else None)
        return metrics_from_stats(rep.rid, win.to_stats_dict(now))

    def _decide(self, now: float) -> None:
        sc = self.scaling
        assert sc is not None
        by_state: dict[str, list[Replica]] = {STARTING: [], SERVING: [], DRAINING: []}
        for rep in self.replicas.values():
            if rep.state in by_state:
                by_state[rep.state].append(rep)
        serving, starting = by_state[SERVING], by_state[STARTING]
        inp = ScalingInput(
            now=now,
            target_replicas=len(serving) + len(starting),
            running_replicas=len(serving),
            metrics=[self._replica_metrics(r, now) for r in serving],
            total_ongoing=float(sum(r.ongoing for r in serving) + len(self.pending)),
            queued_requests=self.pending_peak.peak(now, sc.cfg.look_back_s),
        )
        decision: Decision = sc.policy.decide(inp)
        target = min(max(decision.replicas, sc.cfg.min_replicas), sc.cfg.max_replicas)
        current = inp.target_replicas
        if target > current:
            for _ in range(target - current):
                self._new_replica(now, ready=False)
        elif target < current:
            self._scale_down(current - target, starting, serving, now)
        while self.cluster_ttft and self.cluster_ttft[0][0] < now - PLOT_WINDOW_S:
            self.cluster_ttft.popleft()
        while self.cluster_arrivals and self.cluster_arrivals[0] < now - PLOT_WINDOW_S:
            self.cluster_arrivals.popleft()
        self.timeline.append(
            {
                "t": now,
                "target": target,
                "serving": sum(1 for r in self.replicas.values() if r.state == SERVING),
                "existing": sum(1 for r in self.replicas.values() if r.state != GONE),
                "ttft_p90_ms": percentile([x[1] for x in self.cluster_ttft], 90),
                "arrivals_per_s": len(self.cluster_arrivals) / PLOT_WINDOW_S,
                "queued_at_router": len(self.pending),
                "reason": decision.reason,
            }
        )
        if self.open > 0:
            self._push(now + sc.decision_interval_s, _DECIDE)

    def _scale_down(self, n: int, starting: list[Replica], serving: list[Replica], now: float) -> None:
        # Cancel replicas that are still starting first (newest first): they hold no requests.
        for rep in sorted(starting, key=lambda r: r.rid, reverse=True)[:n]:
            rep.state, rep.gone_at = GONE, now
            n -= 1
        # Then drain serving replicas (`ScalingSetup.retire` picks which): no new requests, in-flight ones finish.
        if n > 0:
            self.scale_downs.append(now)
        for rep in self._victims(serving, max(n, 0), now):
            rep.state, rep.drain_started = DRAINING, now
            self.loads.pop(rep.rid, None)
            if rep.ongoing == 0:
                self._remove(rep, now)
            else:
                self._push(now + self.scaling.cfg.drain_grace_s, _GRACE, rep)  # type: ignore[union-attr]

    def _victims(self, serving: list[Replica], n: int, now: float) -> list[Replica]:
        how = self.scaling.retire  # type: ignore[union-attr]
        if how == "newest":
            return sorted(serving, key=lambda r: r.rid, reverse=True)[:n]
        if how == "cache" and n:
            assert self.recency is not None
            by_id = {r.rid: r for r in serving}
            return [by_id[rid] for rid in retire_order(self.recency.holdings(by_id), now, n=n)]
        return sorted(serving, key=lambda r: (r.ongoing, r.rid))[:n]

    def _grace_over(self, rep: Replica, now: float) -> None:
        if rep.state != DRAINING:
            return
        for r in rep.kill_all():
            r.failed, r.finished = True, now
            self.failed += 1
            self.policy.on_finished(r.route, rep.rid, now)  # type: ignore[arg-type]
            self._closed(now)
        self._remove(rep, now)

    def _remove(self, rep: Replica, now: float) -> None:
        rep.state, rep.gone_at = GONE, now
        self.loads.pop(rep.rid, None)
        self.policy.on_replica_gone(rep.rid)
        if self.recency is not None:
            self.recency.on_replica_gone(rep.rid)

    # ---- main loop ----------------------------------------------------------

    def run(self) -> RunResult:
        t0 = time.perf_counter()
        reqs, heap = self.reqs, self.heap
        closed = self.workload.concurrency
        arrivals: list[SimRequest] = [] if closed else reqs
        self._closed_next = 0
        if closed:
            for r in reqs[:closed]:
                r.arrival = 0.0
                self._push(0.0, _ARRIVE, r)
            self._closed_next = min(closed, len(reqs))
        self._push(0.0, _TICK)
        if self.scaling is not None:
            self._push(self.scaling.decision_interval_s, _DECIDE)
        i, n = 0, len(arrivals)
        while True:
            ta = arrivals[i].arrival if i < n else math.inf
            if heap and heap[0][0] <= ta:
                now, _, kind, obj, ver = heapq.heappop(heap)
            elif i < n:
                now, kind, obj, ver = ta, _ARRIVE, arrivals[i], 0
                i += 1
            else:
                break
            if kind == _STEP:
                if ver == obj.version and obj.state != GONE:  # type: ignore[attr-defined]
                    self._step_end(obj, now)  # type: ignore[arg-type]
            elif kind == _ARRIVE:
                self.end_time = max(self.end_time, now)
                self._arrive(obj, now)  # type: ignore[arg-type]
            elif kind == _TICK:
                self._tick(now)
            elif kind == _DECIDE:
                self._decide(now)
            elif kind == _READY:
                if obj.state == STARTING:  # type: ignore[attr-defined]
                    self._ready(obj, now)  # type: ignore[arg-type]
            elif kind == _GRACE:
                self._grace_over(obj, now)  # type: ignore[arg-type]
            elif kind == _HOST:
                rep = self.replicas[obj.replica]  # type: ignore[attr-defined]
                if id(obj) in rep.arriving:  # not lost with its replica meanwhile
                    self._to_engine(rep, obj, now)  # type: ignore[arg-type]
        # Requests still waiting for a replica when the run ends were never served.
        for r in self.pending:
            r.failed, r.finished = True, self.end_time
            self.failed += 1
        end = self.end_time
        spans = [(rep.created, min(rep.gone_at if rep.gone_at is not None else end, end)) for rep in self.replicas.values()]
        rs = sum(max(0.0, stop - start) for start, stop in spans)
        return RunResult(
            name=self.name,
            requests=reqs,
            itl=self.itl,
            end_time=end,
            replica_seconds=rs,
            routed={rid: rep.routed_total for rid, rep in self.replicas.items()},
            failed_requests=self.failed,
            rejected_requests=self.rejected,
            overloaded_requests=self.overloaded,
            wall_s=time.perf_counter() - t0,
            timeline=self.timeline,
            serving_since=dict(self.serving_since),
            events=self.events,
            replica_seconds_by_minute=seconds_per_minute(spans, end),
            overloaded_idx=self.overloaded_idx,
            scale_downs=list(self.scale_downs),
        )
