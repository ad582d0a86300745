"""The one config model: every knob of kvserve lives here.

Serve config, Helm values (and their JSON schema) and CLI flags are derived
from these classes, so a knob added here shows up everywhere.

Sources, lowest to highest precedence: defaults < YAML file < environment
(``KVSERVE_<SECTION>__<FIELD>``, e.g. ``KVSERVE_SERVER__PORT=9000``) < explicit
overrides (CLI flags).
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kvserve.perf_model import EngineProfile
from kvserve.policy_params import (AUTOSCALER, COST, FLOW, ROUTER, SLO, AutoscalerParams, CostParams, FlowParams,
                                   RouterParams, SLOTargets)
from kvserve.policy_registry import AUTOSCALERS, ROUTERS, live_names
from kvserve.scenarios import Scenario, apply_preset

DEFAULT_MODEL = "smollm2-135m-instruct"
# The policies the live cluster can run, from the one registry (kvserve.policy_registry).
LiveRouter = Literal[live_names(ROUTERS)]  # type: ignore[valid-type]
LiveAutoscaler = Literal[live_names(AUTOSCALERS)]  # type: ignore[valid-type]
ENV_PREFIX = "KVSERVE_"


class _Section(BaseModel):
    # Unknown keys are errors: a typo in a YAML file must fail loudly at start.
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(_Section):
    source: str = Field(
        DEFAULT_MODEL,
        description="Model to serve: the embedded default name, a Hugging Face id, or a local path.",
    )
    served_name: str | None = Field(None, description="Name clients use in `model`; defaults to `source`.")
    tokenizer: str | None = Field(None, description="Tokenizer id/path if different from the model.")
    max_model_len: int = Field(2048, ge=64, description="Context length (prompt + completion) in tokens.")

    @property
    def name(self) -> str:
        return self.served_name or self.source


# Defaults for fields left unset, per device. CPU: this repo's measured fast settings; GPU: the
# reasons are in each field's description.
DEVICE_DEFAULTS: dict[str, dict[str, Any]] = {
    "cpu": {"dtype": "float32", "enforce_eager": True, "max_num_batched_tokens": 2048, "block_size": 32},
    "gpu": {"dtype": "auto", "enforce_eager": False, "max_num_batched_tokens": 8192, "block_size": 16},
}


class EngineConfig(_Section):
    """vLLM engine arguments. Fields left unset take the device's default (DEVICE_DEFAULTS)."""

    device: Literal["cpu", "gpu"] = "cpu"
    scenario: Scenario | None = Field(
        None, description="Preset for a serving goal (realtime-chat, offline-batch, long-document, edge): fills the "
        "engine, SLO and router fields the config leaves unset, adapted to the device (kvserve/scenarios.py; "
        "`kvserve config show --scenario X` prints each choice and why). Explicit fields win.",
    )
    dtype: str | None = Field(
        None, description="None: float32 on CPU (bf16 is ~5x slower there); auto on GPU (the checkpoint's "
        "dtype, bf16 for current models; vLLM casts fp32 checkpoints down to bf16/fp16).",
    )
    enforce_eager: bool | None = Field(
        None, description="Skip CUDA-graph capture / torch.compile. None: true on CPU (saves ~2 min warm-up); "
        "false on GPU (CUDA graphs cut per-step launch overhead, most of decode latency at small batches).",
    )
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    block_size: int | None = Field(
        None, ge=1, description="KV block size in tokens (router hashes use it). None: 32 on CPU (its attention "
        "kernel needs multiples of 32), 16 on GPU (vLLM's GPU default: finer prefix-cache sharing).",
    )
    kv_cache_gib: float = Field(1.0, gt=0, description="CPU only: KV cache space per replica (VLLM_CPU_KVCACHE_SPACE).")
    kv_cache_tokens: int | None = Field(
        None, ge=16, description="Cap on KV cache tokens per replica (num_gpu_blocks_override); None = all memory."
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="GPU: fraction of the replica's GPU share (gpus_per_replica x device memory) "
        "its engine may fill with weights, activations, CUDA graphs and KV cache. With a whole GPU this is "
        "vLLM's own setting; with a fraction (< 1), kvserve derives the KV cache size from the share "
        "(vLLM alone would size it for the whole device) and passes vLLM share x this.",
    )
    max_num_seqs: int = Field(32, ge=1, description="Continuous-batching width.")
    max_num_batched_tokens: int | None = Field(
        None, ge=16, description="Token budget of one engine step (chunked prefill). None: 2048 on CPU; 8192 on "
        "GPU (vLLM's own default for 70+ GB GPUs: long prefills take few steps, at a bounded activation peak).",
    )
    long_prefill_token_threshold: int = Field(
        0, ge=0, description="Cap on one request's prefill tokens per engine step while others are scheduled "
        "(vLLM's long_prefill_token_threshold; 0 = off). A cap lets cached hits and decodes through while a "
        "long cold prompt prefills: lower tail TTFT/ITL for chat, slightly slower cold prefills.",
    )
    tensor_parallel_size: int = Field(1, ge=1)
    quantization: str | None = Field(None, description="awq, gptq, fp8, ... (GPU).")
    kv_cache_dtype: str = Field("auto", description="KV cache element type: auto (the model's dtype) or fp8 (GPU: "
                                "half the bytes per token, so twice the tokens fit).")
    speculative_decoding: Literal["off", "ngram", "draft"] = Field(
        "off", description="ngram: prompt-lookup drafts (no draft model; pays off when outputs copy the prompt, e.g. "
        "summaries); draft: `draft_model` proposes tokens. A draft_model, when given, replaces ngram.",
    )
    draft_model: str | None = Field(None, description="Draft or EAGLE model (HF id or path) for speculative decoding.")
    num_speculative_tokens: int = Field(4, ge=1, le=16, description="Tokens drafted per step.")
    omp_threads_bind: str = Field(
        "slot", description="CPU only: VLLM_CPU_OMP_THREADS_BIND; `slot` gives each replica on a host its own cores."
    )
    cpus_per_replica: float = Field(1.0, gt=0, description="Ray CPUs reserved per replica.")
    gpus_per_replica: float = Field(
        0.0, ge=0, description="Ray GPUs reserved per replica (GPU device; 0 = tensor_parallel_size). A fraction "
        "shares one GPU between replicas: each sizes its KV cache to its share."
    )
    chat_template: str | None = Field(
        None, description="Chat template: a Jinja file, an inline template, or `chatml-tools` (shipped with kvserve: "
        "the embedded model's ChatML template plus tools and tool calls in the Hermes format). None: the model's own."
    )
    tool_call_parser: str | None = Field(
        None, description="vLLM's tool-call parser (e.g. `hermes`, `llama3_json`, `mistral`): needed for `tools` with "
        "`tool_choice` `required` or a named function (vLLM constrains the output to the tool's schema)."
    )
    enable_auto_tool_choice: bool = Field(
        False, description="Let the model decide to call tools (`tool_choice: auto`); needs `tool_call_parser`."
    )
    reasoning_parser: str | None = Field(
        None, description="vLLM's reasoning parser (e.g. `deepseek_r1`, `qwen3`): reasoning goes to `reasoning_content`."
    )
    extra_args: dict[str, Any] = Field(default_factory=dict, description="Passed through to vLLM AsyncEngineArgs.")

    @model_validator(mode="after")
    def _device_defaults(self) -> EngineConfig:
        if self.device == "gpu" and self.gpus_per_replica == 0:
            self.__dict__["gpus_per_replica"] = float(self.tensor_parallel_size)
        for name, value in DEVICE_DEFAULTS[self.device].items():
            if getattr(self, name) is None:
                self.__dict__[name] = value
        if self.device == "cpu" and self.block_size % 32:
            raise ValueError("on CPU, block_size must be a multiple of 32 (vLLM's CPU attention kernel)")
        if self.speculative_decoding == "draft" and not self.draft_model:
            raise ValueError("speculative_decoding: draft needs draft_model")
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise ValueError("enable_auto_tool_choice needs tool_call_parser (e.g. `hermes`)")
        return self

    @property
    def gpu_share(self) -> float:
        """The fraction of each of its GPUs one replica may use (1 for whole GPUs)."""
        return min(self.gpus_per_replica / self.tensor_parallel_size, 1.0)

    @property
    def engines_per_device(self) -> int:
        """How many replicas share one GPU (Ray packs fractional GPUs); 1 on CPU, where each has its own cores."""
        return max(1, int(1.0 / self.gpu_share + 1e-9)) if self.device == "gpu" else 1


class RouterConfig(_Section):
    policy: LiveRouter = "kvserve"
    prefill_ms_per_token: float = Field(
        COST.prefill_ms_per_token, gt=0, description="Cost model: prefill ms per uncached prompt token (default: this repo's CPU "
        "profile, kvserve/profiles/cpu-smollm2-135m.json; `kvserve profile` measures yours)."
    )
    decode_ms_per_seq: float = Field(
        COST.decode_ms_per_seq, ge=0, description="Cost model: extra ms a running sequence adds to each engine step (same profile)."
    )
    tie_tolerance: float = Field(
        ROUTER.tie_tolerance, ge=0, le=1, description="Replicas within this fraction of the best cost are near-ties, chosen at random."
    )
    home_affinity: float = Field(
        ROUTER.home_affinity, ge=0, description="A prefix family keeps its last replica (its 'home') while that replica's cost is "
        "within this fraction of the best: keeps tenants partitioned across replicas instead of migrating "
        "(and duplicating their prefixes) on small load differences."
    )
    spill_ttft_ms: float | None = Field(
        ROUTER.spill_ttft_ms, gt=0, description="A prefix family stays on the replica holding its prefix while that replica's "
        "predicted TTFT is under this bound, however short other queues look; above it, the cost model decides "
        "(the hot prefix spills). Unset: the TTFT target, slo.ttft_p90_ms. A tiny value turns the rule off."
    )
    speculative_ttl_s: float = Field(
        ROUTER.speculative_ttl_s, gt=0, description="How long a routed-but-unconfirmed prefix is assumed cached on its replica."
    )
    active_token_weight: float = Field(
        COST.active_token_weight,
        ge=0,
        description="Cost model: each context token this router has in flight on a replica costs this fraction of"
        " a prefill token (Dynamo's decode-block load); stops cached tenants piling onto one replica.",
    )
    cache_miss_weight: float = Field(
        COST.cache_miss_weight,
        ge=0,
        description="Cost model: uncached tokens are charged this much extra (x their prefill cost): storing them"
        " evicts as many cached tokens from a full prefix cache, which someone re-prefills later.",
    )
    kv_pressure_start: float = Field(
        COST.kv_pressure_start, ge=0, le=1, description="Cost model: KV usage above which new uncached blocks are charged extra."
    )
    kv_pressure_weight: float = Field(
        COST.kv_pressure_weight, ge=0, description="Cost model: extra charge on uncached tokens at 100% KV usage (x their prefill cost)."
    )
    footprint_weight: float = Field(
        ROUTER.footprint_weight, ge=0, description="Cost model: prefix tokens of other families that placing this prompt on a replica "
        "would push out of its cache (the families that live there need more than its capacity) are charged this "
        "much (x their prefill cost). Packs families so each replica's set fits its cache. 0 turns it off."
    )
    footprint_window_s: float = Field(
        ROUTER.footprint_window_s, gt=0, description="A family counts towards its replica's cache footprint while it was routed "
        "within this window."
    )
    footprint_headroom: float = Field(
        ROUTER.footprint_headroom, gt=0, le=1, description="Fraction of a replica's KV cache that cached prefixes may fill (the rest "
        "holds running requests' own blocks)."
    )
    sample_replicas: int | None = Field(
        ROUTER.sample_replicas, ge=1, description="kvserve policy: each decision scores the replicas holding the prompt's prefix plus "
        "this many others drawn at random (power of k choices; router/candidates.py), so its cost does not grow "
        "with the cluster: scoring all 1,000 replicas takes ~4 ms of CPU per request, too slow in front of 1,000 "
        "GPUs, while the best of 16 random replicas is nearly always among the least-loaded. Up to this many replicas plus the "
        "prefix holders, every replica is scored (the same decisions as exhaustive). null: always score every replica."
    )
    stats_period_s: float = Field(0.5, gt=0, description="How often replicas report routing stats (cache + load).")
    stale_after_s: float = Field(ROUTER.stale_after_s, gt=0, description="A replica silent for this long drops out of the index.")
    silent_after_periods: float = Field(
        6.0, gt=0, description="A replica whose routing stats are older than this many stats periods gets no "
        "new requests while another replica reports (a replica whose engine died is dropped at its next report, "
        "one that died is dropped by Serve). Not 2: on a saturated 2-core host a live replica's reports arrive "
        "seconds late."
    )

    def params(self) -> RouterParams:
        """The router core's parameters (router/policies/kvserve.py)."""
        cost = CostParams(**{f: getattr(self, f) for f in CostParams.__dataclass_fields__})
        rest = {f: getattr(self, f) for f in RouterParams.__dataclass_fields__ if f != "cost"}
        return RouterParams(cost=cost, **rest)

    def fitted_to(self, profile: EngineProfile, batch: int = 32) -> RouterConfig:
        """This config with the cost slopes measured in `profile` (prefill ms/token, decode ms per extra sequence)."""
        per_seq = max((profile.decode_step_ms(batch) - profile.decode_step_ms(1)) / max(batch - 1, 1), 0.0)
        return self.model_copy(
            update={"prefill_ms_per_token": profile.prefill_ms_per_token(), "decode_ms_per_seq": per_seq}
        )


class SLOConfig(_Section):
    ttft_p90_ms: float = Field(SLO.ttft_p90_ms, gt=0)
    itl_p90_ms: float = Field(SLO.itl_p90_ms, gt=0)

    def params(self) -> SLOTargets:
        return SLOTargets(self.ttft_p90_ms, self.itl_p90_ms)


class AutoscalingConfig(_Section):
    enabled: bool = False
    policy: LiveAutoscaler = "kvserve"
    min_replicas: int = Field(AUTOSCALER.min_replicas, ge=0)
    max_replicas: int = Field(AUTOSCALER.max_replicas, ge=1)
    initial_replicas: int | None = Field(None, ge=0)
    target_ongoing_requests: float = Field(AUTOSCALER.target_ongoing_requests, gt=0, description="serve_default only.")
    upscale_delay_s: float = Field(AUTOSCALER.upscale_delay_s, ge=0)
    downscale_delay_s: float = Field(
        AUTOSCALER.downscale_delay_s, ge=0, description="A scale-down wish must last this long before it acts (a contrary wish restarts it)."
    )
    max_step: int = Field(AUTOSCALER.max_step, ge=1, description="Most replicas added or removed in one decision.")
    headroom: float = Field(AUTOSCALER.headroom, gt=0, le=1, description="Plan each replica to this fraction of modelled capacity.")
    hysteresis: float = Field(AUTOSCALER.hysteresis, gt=0, lt=1, description="A fleet this far within the SLO (latency / target below this) "
                              "at a higher load than the remembered overload proves that memory stale: it is raised.")
    drain_grace_s: float = Field(60.0, ge=0, description="In-flight requests get this long to finish on scale-down.")
    warm_prefixes: int = Field(
        64, ge=0, description="A starting replica pre-fills the hottest prefixes (tenant system prompts, "
        "conversations) until they carry its share (1 / replicas) of the hot traffic, at most this many, before "
        "it takes traffic (0 = off). A safety cap: the share and the time budget decide."
    )
    warm_timeout_s: float = Field(
        10.0, ge=0, description="Time budget for that warm-up: it delays the replica's first traffic, so a slow "
        "(CPU) engine stops early (a prefill that would pass it is aborted)."
    )
    warm_min_requests: float = Field(
        2.0, ge=0, description="Warm only prefixes seen at least this often recently (a request count decayed with "
        "a 2-minute half-life; a conversation's latest turns). A warm-up delays the replica's first traffic by one "
        "prefill per prefix and pays back only if the prefix soon sends it requests; rarely seen ones are not worth it."
    )
    look_back_s: float = Field(AUTOSCALER.look_back_s, gt=0)
    overload_memory_s: float = Field(
        AUTOSCALER.overload_memory_s, gt=0, description="The overload memory (the per-replica load that once broke the SLO, which vetoes "
        "scale-downs back to it) expires after this long; each time it is re-learned within its lifetime of an "
        "expiry, the lifetime doubles (the expiry was premature)."
    )
    overload_memory_max_s: float = Field(
        AUTOSCALER.overload_memory_max_s, gt=0, description="Cap on that doubled lifetime: a load the fleet keeps failing at is re-learnt "
        "at most ~log2(cap / overload_memory_s) times before it is remembered for this long."
    )
    fleet_ratio_quantile: float = Field(
        AUTOSCALER.fleet_ratio_quantile, gt=0, le=1, description="The fleet's SLO error is this quantile of the "
        "replicas' p90/target ratios (weighted by rate): one replica's backlog, which more replicas cannot drain, is "
        "not a fleet-wide violation; most of the fleet over target is."
    )
    max_slo_factor: float = Field(
        AUTOSCALER.max_slo_factor, ge=1, description="An SLO-driven scale-up multiplies the fleet by at most this "
        "per settle period (a burst needing 3x then takes one period, not two)."
    )
    max_slo_factor_within_capacity: float = Field(
        AUTOSCALER.max_slo_factor_within_capacity, ge=1, description="... and by at most this when the capacity "
        "model says the fleet carries the load: the error then measures what the model misses (long prompts queued "
        "on a few replicas), not a rate."
    )
    min_p90_samples: int = Field(
        AUTOSCALER.min_p90_samples, ge=1, description="Requests in the look-back window before a p90 over target may "
        "add replicas (with nothing queued): a p90 of fewer is their maximum, one cold prompt."
    )
    trend_fit_s: float = Field(
        AUTOSCALER.trend_fit_s, gt=0, description="The ramp forecast fits a line through this much of the recent "
        "rate (and needs half of it): long enough that a burst is not read as a ramp."
    )
    trend_z: float = Field(
        AUTOSCALER.trend_z, gt=0, description="Standard errors a ramp's slope must clear, and its fit must stay "
        "within, against the samples' Poisson noise (~0.6% false alarms on a flat load)."
    )
    queue_growth_s: float = Field(
        AUTOSCALER.queue_growth_s, gt=0, description="The routers' queue's growth over this span counts as "
        "arrivals no replica saw (every replica full)."
    )
    startup_estimate_s: float = Field(
        AUTOSCALER.startup_estimate_s, ge=0, description="Replica start-up assumed by the ramp forecast until one "
        "has been measured (from the replicas the policy asked for)."
    )
    unprofiled_scale: float = Field(
        AUTOSCALER.unprofiled_scale, gt=0, description="A model without a measured profile starts from the "
        "packaged CPU profile with every time multiplied by this (slow: over-provision rather than miss), then "
        "fits both factors to its replicas' own reports."
    )
    profile: str | None = Field(
        None, description="Engine profile JSON (`kvserve profile`) for the capacity model. None: the embedded model's "
        "packaged profile, or for any other model a conservative estimate fitted online (`unprofiled_scale`)."
    )

    def params(self) -> AutoscalerParams:
        """The autoscaling cores' parameters (autoscaling/policies/)."""
        return AutoscalerParams(**{f: getattr(self, f) for f in AutoscalerParams.__dataclass_fields__})

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas must be <= max_replicas")
        if self.overload_memory_s > self.overload_memory_max_s:
            raise ValueError("overload_memory_s must be <= overload_memory_max_s")
        return self


class TenantClass(_Section):
    """What a class of tenants may use and is promised. Every limit is per tenant of the class; None: no limit."""

    priority: int = Field(
        0, description="Higher goes first when replicas are saturated (lower classes still get a bounded share, "
        "so they never starve)."
    )
    weight: float = Field(
        1.0, gt=0, description="Fair-share weight within the priority: a tenant of weight 2 gets twice the "
        "cluster work (uncached prefill + decode tokens) of a tenant of weight 1 while both are backlogged."
    )
    requests_per_min: int | None = Field(None, gt=0, description="Requests a minute, per tenant (429 beyond).")
    tokens_per_min: int | None = Field(
        None, gt=0, description="Prompt + completion tokens a minute, per tenant, counted as OpenAI does (429 beyond)."
    )
    max_concurrent: int | None = Field(None, gt=0, description="Requests in flight at once, per tenant (429 beyond).")
    ttft_p90_ms: float | None = Field(
        None, gt=0, description="This class's TTFT target; None: the cluster's slo.ttft_p90_ms. The autoscaler "
        "plans for the tightest target among classes with traffic."
    )
    itl_p90_ms: float | None = Field(None, gt=0, description="This class's inter-token target; None: slo.itl_p90_ms.")


class TenantKey(_Section):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)

    tenant: str = Field(..., min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    tenant_class: str = Field("default", alias="class", description="A name in tenants.classes.")
    key_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$", description="sha256 hex of the API key.")
    key_env: str | None = Field(None, description="Read the key from this environment variable.")
    key_file: str | None = Field(None, description="Read the key from this file (e.g. a mounted Secret).")

    @model_validator(mode="after")
    def _one_source(self) -> TenantKey:
        given = [x for x in (self.key_sha256, self.key_env, self.key_file) if x]
        if len(given) != 1:
            raise ValueError("exactly one of key_sha256, key_env, key_file must be set")
        return self

    def resolved_sha256(self) -> str:
        """The key's sha256 hex; keys from env/file are hashed as soon as they are read."""
        if self.key_sha256:
            return self.key_sha256
        if self.key_env:
            raw = os.environ.get(self.key_env)
            if not raw:
                raise ValueError(f"tenants.keys: environment variable {self.key_env} is not set")
        else:
            raw = Path(self.key_file).read_text().strip()  # type: ignore[arg-type]
        return hashlib.sha256(raw.strip().encode()).hexdigest()


class TenantsConfig(_Section):
    open_mode: bool = Field(
        False, description="No API keys: every request is tenant `default`. For development (`kvserve serve --dev` "
        "sets it); without it kvserve serves only with keys (tenants.keys / tenants.keys_file)."
    )
    allow_open_on_network: bool = Field(
        False, description="Let open mode bind a non-loopback server.host (e.g. 0.0.0.0). Open mode on a network "
        "address lets anyone who reaches the port use the engines, unmetered and unattributed, so it takes "
        "this second, deliberate switch: for a trusted network only (e.g. a dev cluster behind a ClusterIP Service)."
    )
    keys: list[TenantKey] = Field(default_factory=list)
    cache_isolation: Literal["tenant", "shared"] = Field(
        "tenant", description="`tenant`: the ingress salts every prompt's KV blocks with its tenant (vLLM's "
        "cache_salt), so tenants share cached blocks only among their own requests: another tenant cannot time "
        "its TTFT to learn what you have cached. Costs hit rate only on prefixes tenants have in common. "
        "`shared`: one cache for all (the client's own cache_salt still applies); for a single trusted tenant "
        "or tenants that share long preambles."
    )
    keys_file: str | None = Field(
        None, description="YAML/JSON list of {tenant, key_sha256, class} entries (e.g. a mounted Secret)."
    )
    classes: dict[str, TenantClass] = Field(
        default_factory=lambda: {"default": TenantClass()},
        description="Named tenant classes (limits, priority, fair-share weight, SLO tier); a key names its class, "
        "open mode's tenant is in `default`. A `default` class is added when absent.",
    )

    def key_classes(self) -> dict[str, str]:
        """tenant -> class name, for the keys in this config (deployments.tenant_classes adds keys_file's)."""
        return {k.tenant: k.tenant_class for k in self.keys}

    @model_validator(mode="after")
    def _classes_known(self) -> TenantsConfig:
        if "default" not in self.classes:
            self.__dict__["classes"] = {"default": TenantClass(), **self.classes}
        for i, key in enumerate(self.keys):
            if key.tenant_class not in self.classes:
                raise ValueError(f"tenants.keys[{i}] (tenant {key.tenant!r}): unknown class {key.tenant_class!r}; "
                                 f"known: {sorted(self.classes)}")
        return self


class FlowConfig(_Section):
    """Flow control at the ingress when every replica is busy (flow/fair_queue.py): requests wait in
    per-tenant queues; the highest class priority goes first, within it weighted fair queuing on
    uncached prefill + expected decode tokens; batch lines are the lowest class."""

    enabled: bool = Field(False, description="Off: requests go straight to Serve's router, which queues them FIFO.")
    slots_per_replica: int | None = Field(
        None, ge=1, description="Requests in flight per serving replica before the ingress queues the rest "
        "(None: engine.max_num_seqs, the batch a replica runs at once; more would wait FIFO in the engine, where the "
        "fair queue cannot reorder them. One more keeps the batch full as requests end, ~4% more throughput in "
        "`kvserve sim --workload noisy-neighbour`, at ~1.6x the victims' p90 TTFT).")
    max_queued_per_tenant: int = Field(FLOW.max_per_tenant, ge=1, description="Beyond it the tenant gets 503 + Retry-After.")
    max_queued: int = Field(
        FLOW.max_total, ge=1, description="Requests queued in all; beyond it the tenant with the most queued "
        "loses its newest (503), so a flooding tenant, not its neighbours, is turned away.")
    starvation_limit: int = Field(
        FLOW.starvation_limit, ge=1, description="A waiting lower class is passed over at most this many "
        "dispatches in a row (plus one per other class) before it is served.")

    def params(self) -> FlowParams:
        return FlowParams(self.max_queued_per_tenant, self.max_queued, self.starvation_limit)


class LoggingConfig(_Section):
    prompts: bool = Field(
        False, description="Debugging only: put each request's prompt text on its access line (logger "
        "`kvserve.access`) and turn on vLLM's request logging (--enable-log-requests). Off, logs carry no "
        "prompt or completion text: tenant, status, tokens and latency only."
    )


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    max_body_bytes: int = Field(1_048_576, ge=1024, description="Larger request bodies get 413.")
    max_ongoing_requests: int = Field(64, ge=1, description="Per replica; beyond it requests queue.")
    max_queued_requests: int = Field(256, ge=-1, description="Per caller; beyond it 503 (-1 = unbounded).")
    max_queue_wait_s: float | None = Field(
        30.0, gt=0,
        description="A request no replica has taken within this many seconds of its arrival at the "
                    "ingress gets a 503 (the queue bound is a count; this bounds the wait). None: no bound.",
    )
    cold_start_wait_s: float | None = Field(
        300.0, gt=0,
        description="With autoscaling.min_replicas 0: a request that arrives while no replica serves waits up to "
                    "this long (at least max_queue_wait_s) for the first to start and take it (an engine start "
                    "takes a minute or more), then gets a 503. None: no bound.",
    )
    request_timeout_s: float = Field(600.0, gt=0)
    max_tokens_limit: int = Field(4096, ge=1, description="Requests asking for more tokens than this get 400.")
    max_n: int = Field(16, ge=1, description="Most choices (`n`) one request may ask for; more get 400.")
    replica_retries: int = Field(
        2, ge=0, description="Times a request is sent to another replica when its replica's engine died, or the "
        "replica was lost, before the request produced any output: it never started, so re-running it cannot "
        "duplicate anything the client saw. A stream cut after its first token ends with an SSE error event."
    )
    health_check_period_s: float = Field(
        2.0, gt=0, description="How often Serve checks each replica; a replica whose engine died fails the "
        "check, and Serve replaces it."
    )


class BatchConfig(_Section):
    """The OpenAI Batch API (/v1/files, /v1/batches): jobs run at the lowest priority, persisted in SQLite."""

    enabled: bool = True
    db_path: str | None = Field(
        None, description="SQLite file holding batch input/output files, jobs and every line's result (it must "
        "outlive the ingress: a restart resumes unfinished lines). None: batch.sqlite in kvserve's cache dir on "
        "the ingress's node. Helm: the batchStore PVC.",
    )
    node_resource: str | None = Field(
        None, description="Ray custom resource that pins the ingress (and so the batch worker) to the node holding "
        "db_path (Helm sets it on the head pod when batchStore is enabled).",
    )
    max_file_bytes: int = Field(100 * 2**20, ge=1024, description="Larger uploads to /v1/files get 413.")
    max_lines: int = Field(50_000, ge=1, description="Most requests in one batch input file (OpenAI's limit).")
    max_concurrency: int = Field(
        4, ge=1, description="Most batch lines in flight while no interactive request is in flight.")
    concurrency_under_load: int = Field(
        1, ge=0, description="Most batch lines in flight while interactive requests are in flight; while any "
        "interactive request waits for a replica, batch lines start none (lowest priority).",
    )
    idle_after_s: float = Field(
        2.0, ge=0, description="Interactive traffic counts as gone (batch lines go back to max_concurrency) only "
        "after no interactive request has been in flight for this long: closed-loop clients leave gaps of "
        "milliseconds, and each such gap would otherwise start max_concurrency lines at once.")
    max_attempts: int = Field(3, ge=1, description="A line answered 429/5xx (overload, a replica lost) is retried "
                              "this many times before its error is recorded.")


# vLLM flags that put prompt/completion text in its logs: only logging.prompts turns them on.
_REQUEST_LOG_FLAGS = {"enable_log_requests", "enable_log_outputs"}


class KVServeConfig(_Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    num_replicas: int = Field(2, ge=1, description="Fixed replica count when autoscaling is off.")
    router: RouterConfig = Field(default_factory=RouterConfig)
    slo: SLOConfig = Field(default_factory=SLOConfig)
    autoscaling: AutoscalingConfig = Field(default_factory=AutoscalingConfig)
    tenants: TenantsConfig = Field(default_factory=TenantsConfig)
    flow: FlowConfig = Field(default_factory=FlowConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    batch: BatchConfig = Field(default_factory=BatchConfig)
    app_name: str = Field("kvserve", pattern=r"^[a-z0-9-]+$")

    @model_validator(mode="before")
    @classmethod
    def _scenario_preset(cls, data: Any) -> Any:
        # Before field validation: only fields absent from the input take the preset's value.
        return apply_preset(data)[0] if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _spill_at_the_slo(self) -> KVServeConfig:
        if self.router.spill_ttft_ms is None:
            self.router.__dict__["spill_ttft_ms"] = self.slo.ttft_p90_ms
        return self

    @model_validator(mode="after")
    def _request_logging_is_a_logging_switch(self) -> KVServeConfig:
        for flag in _REQUEST_LOG_FLAGS & {k.replace("-", "_") for k in self.engine.extra_args}:
            raise ValueError(f"engine.extra_args.{flag}: vLLM logs prompts with it; use logging.prompts instead")
        return self


class ConfigError(ValueError):
    """A config that does not validate; the message names the offending field."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a hostname: it may resolve to anything
        return False


def serving_problem(cfg: KVServeConfig) -> str | None:
    """Why `cfg` must not serve HTTP, or None. The one check every serving path makes (`kvserve
    serve`/`deploy`, the Serve app builder behind Helm and `ray up`, the Helm values check).

    A config without API keys is a valid description (the simulator, the dashboard and profiling
    use one) but not a server: serving without keys must be asked for explicitly."""
    t, host = cfg.tenants, cfg.server.host
    if t.open_mode:
        if not t.allow_open_on_network and not is_loopback(host):
            return (f"open mode (no API keys) on the network address server.host={host!r}: anyone who reaches "
                    "the port could use it. Bind 127.0.0.1, configure API keys (tenants.keys / tenants.keys_file), "
                    "or, on a trusted network only, set tenants.allow_open_on_network: true")
        return None
    if not t.keys and not t.keys_file:
        return ("no API keys configured, and kvserve does not serve without them. For a local dev server on "
                "127.0.0.1 pass --dev (open mode). Otherwise add tenants.keys (key_sha256 from `kvserve config "
                "hash-key`, or key_env / key_file) or tenants.keys_file; or set tenants.open_mode: true explicitly")
    return None


def require_servable(cfg: KVServeConfig) -> KVServeConfig:
    """`cfg`, or ConfigError saying what to change (see serving_problem)."""
    problem = serving_problem(cfg)
    if problem:
        raise ConfigError(f"refusing to serve: {problem}")
    return cfg


def _set_path(d: dict, path: list[str], value: Any) -> None:
    for key in path[:-1]:
        d = d.setdefault(key, {})
    d[path[-1]] = value


def _env_overrides(environ: dict[str, str]) -> dict:
    out: dict = {}
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        path = [p.lower() for p in key[len(ENV_PREFIX):].split("__")]
        if path[0] not in KVServeConfig.model_fields:
            continue
        _set_path(out, path, yaml.safe_load(raw) if raw != "" else None)
    return out


def deep_merge(base: dict, over: dict) -> dict:
    merged = dict(base)
    for k, v in over.items():
        merged[k] = deep_merge(merged[k], v) if isinstance(v, dict) and isinstance(merged.get(k), dict) else v
    return merged


def format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "(root)"
        lines.append(f"{field}: {e['msg']}")
    return "invalid kvserve config:\n  " + "\n  ".join(lines)


def load_config(
    path: str | Path | None = None,
    overrides: dict | None = None,
    environ: dict[str, str] | None = None,
) -> KVServeConfig:
    """Defaults < YAML file < KVSERVE_* env < overrides. Raises ConfigError naming the field."""
    data = raw_config(path, overrides, environ)
    try:
        return KVServeConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err)) from None


def raw_config(
    path: str | Path | None = None,
    overrides: dict | None = None,
    environ: dict[str, str] | None = None,
) -> dict:
    """The merged YAML file < env < overrides, before defaults and validation: the fields set explicitly."""
    data: dict = {}
    if path:
        text = Path(path).read_text()
        loaded = yaml.safe_load(text) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: top level must be a mapping")
        data = loaded
    data = deep_merge(data, _env_overrides(dict(os.environ if environ is None else environ)))
    if overrides:
        data = deep_merge(data, overrides)
    return data


def dump_config(cfg: KVServeConfig) -> dict:
    return cfg.model_dump(mode="json")


def redacted(cfg: KVServeConfig) -> dict:
    """The config as JSON with key material masked (safe to print or serve)."""
    data = dump_config(cfg)
    for key in data.get("tenants", {}).get("keys", []):
        if key.get("key_sha256"):
            key["key_sha256"] = key["key_sha256"][:8] + "…"
    return data
