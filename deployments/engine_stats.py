"""A vLLM stat logger that keeps the engine's own counters for routing, autoscaling and bench.

vLLM calls `record()` after every engine step with SchedulerStats (queue sizes,
KV usage, prefix-cache queries/hits in tokens); we only accumulate.
"""

from __future__ import annotations

from typing import Any

from deployments.vllm_compat import get
from kvserve import latency_hist

StatLoggerBase = get("StatLoggerBase")


class EngineCounters:
    """Shared, process-local totals (one engine per replica process)."""

    def __init__(self) -> None:
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.waiting = 0
        self.running = 0
        self.kv_usage = 0.0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.steps = 0
        # Where a request's time to first token goes inside the engine (bench's TTFT breakdown): sums in
        # seconds. ttft: the engine frontend's arrival -> first token (vLLM's own TTFT); queued: waiting
        # in the scheduler; prefill: first scheduled -> first token (the steps its prefill rode in).
        self.first_tokens = 0
        self.ttft_sum_s = 0.0
        self.finished = 0
        self.queued_sum_s = 0.0
        self.prefill_sum_s = 0.0
        # The same per request, bucketed in ms (kvserve.latency_hist) for a run's quantiles.
        self.ttft_hist = latency_hist.new_counts()
        self.queued_hist = latency_hist.new_counts()
        self.prefill_hist = latency_hist.new_counts()
        # Set by the replica: feeds the engine-measured TTFT/ITL into the autoscaling window.
        self.on_iteration = None

    def as_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, list) else v) for k, v in vars(self).items() if k != "on_iteration"}


COUNTERS = EngineCounters()


class CounterStatLogger(StatLoggerBase):
    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        self.counters = COUNTERS

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
        c = self.counters
        c.steps += 1
        if scheduler_stats is not None:
            c.waiting = scheduler_stats.num_waiting_reqs
            c.running = scheduler_stats.num_running_reqs
            c.kv_usage = float(scheduler_stats.kv_cache_usage)
            pcs = scheduler_stats.prefix_cache_stats
            if pcs is not None:
                c.prefix_cache_queries += pcs.queries
                c.prefix_cache_hits += pcs.hits
        if iteration_stats is not None:
            c.generation_tokens += iteration_stats.num_generation_tokens
            c.prompt_tokens += iteration_stats.prompt_token_stats.total
            ttfts = iteration_stats.time_to_first_tokens_iter
            c.first_tokens += len(ttfts)
            c.ttft_sum_s += sum(ttfts)
            for t in ttfts:
                latency_hist.add(c.ttft_hist, 1000.0 * t)
            for f in iteration_stats.finished_requests:
                c.finished += 1
                c.queued_sum_s += f.queued_time
                c.prefill_sum_s += f.prefill_time
                latency_hist.add(c.queued_hist, 1000.0 * f.queued_time)
                latency_hist.add(c.prefill_hist, 1000.0 * f.prefill_time)
            if c.on_iteration is not None:
                c.on_iteration(
                    ttfts,
                    iteration_stats.inter_token_latencies_iter,
                    [f.num_generation_tokens for f in iteration_stats.finished_requests],
                )

    def log_engine_initialized(self) -> None:
        pass
