# Quick start: `make serve` (install, prepare the default model, serve on 127.0.0.1:8000)
# and `make test`. Every target depends on `install`, which is a no-op when nothing changed.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFIG ?=

.PHONY: install install-system serve test test-fast model clean \
	bench-live-routing bench-sim-routing bench-micro bench-sim-autoscaling sim-autoscaling-suite bench-sim-reaction \
	bench-sim-knobs bench-live-autoscaling \
	bench-sim-fidelity bench-serving-floor bench-gpu bench-chaos bench-soak bench-batch bench-noisy bench-limits bench-scenario

install: install-system $(STAMP)

# The system step: Prometheus, which the dashboard's integration test runs for real
# (tests/integration/test_prometheus_dashboard.py). Debian/Ubuntu package; elsewhere, install it yourself.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
install-system:
	@command -v prometheus >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 \
	  && { $(SUDO) apt-get install -y --no-install-recommends prometheus \
	       || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y --no-install-recommends prometheus; }; } \
	  || echo "install-system: install Prometheus yourself (the dashboard test needs it on PATH)"; }

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip "setuptools>=68" wheel
	$(BIN)/pip install -q -e ".[cpu,dev]"
	# PyPI's torchvision/torchaudio/torchcodec break `transformers` beside CPU torch.
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec || true
	touch $(STAMP)

model: install
	$(BIN)/kvserve model prepare

serve: model
	$(BIN)/kvserve serve --dev $(if $(CONFIG),--config $(CONFIG))

# lint-imports: the layer contracts in pyproject.toml ([tool.importlinter]); a violation fails the target.
test: model
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q tests

test-fast: install
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -m "not integration and not slow" tests

# ---- Benchmarks: each target regenerates one table of docs/BENCHMARKS.md, with the commands that
# page cites, into its result file in docs/results/ (scratch output goes to build/bench/).
# Simulator and microbenchmark targets are CPU-only and deterministic up to timing; the live ones
# measure a running cluster; bench-gpu needs a GPU machine.
KV := $(BIN)/kvserve
COLLECT := $(BIN)/python -m bench.results
RESULTS := docs/results
IMG := docs/img
WORK := build/bench
URL ?= http://127.0.0.1:8000
TRACE ?= ../shared/traces/mooncake_synthetic_trace.jsonl
SEED ?= 0
SEEDS ?= 0 1 2 3 4 5 6 7 8 9
# The CPU acceptance workload (issue 3): 16 Zipf-1.1 tenants, 1,000-token system prompts, 300 requests.
MIX := --workload multi-tenant --tenants 16 --tenant-skew zipf:1.1 --system-tokens 1000 \
	--question-tokens 30 --output-tokens 16
ACCEPTANCE := $(MIX) --concurrency 8 --requests 300
CPU_PROFILE := kvserve/profiles/cpu-smollm2-135m.json
CPU_PROFILE_1203 := kvserve/profiles/cpu-smollm2-135m-2026-12-03.json
# Stops a live target early, with the reason, when no cluster answers /ready at $(URL).
# A server must answer; the bench itself waits until every replica serves (/ready).
need_cluster = @$(BIN)/python -c "import httpx; httpx.get('$(URL)/health', timeout=5).raise_for_status()" \
	>/dev/null 2>&1 || { echo "$@: no cluster at $(URL); start one first: $(1)"; exit 1; }

# Batch table and batch-vs-interactive TTFT on CPU (docs/SCENARIOS.md): a running 1-replica cluster,
# `make serve` with KVSERVE_NUM_REPLICAS=1.
bench-batch: install
	$(call need_cluster,KVSERVE_NUM_REPLICAS=1 make serve)
	$(KV) bench --url $(URL) --sweep batch --batch 1,4,8,16,32 --question-tokens 128 --output-tokens 64 \
		--json $(RESULTS)/batch-sweep-cpu.json --plot $(IMG)/batch-sweep-cpu.png
	$(BIN)/python -m bench.batch_interference --url $(URL) --json $(RESULTS)/batch-interference-cpu.json

# Noisy neighbour (docs/FLOW.md): simulated (4 H200-profile replicas), then live on a cluster started
# with `kvserve serve --config bench/configs/noisy-neighbour-cpu.yaml` (port 8123; it redeploys 3 times).
bench-noisy: install
	$(KV) sim --workload noisy-neighbour --replicas 4 --phase-s 180 --json $(RESULTS)/noisy-neighbour-sim.json
	$(KV) bench --workload noisy-neighbour --config bench/configs/noisy-neighbour-cpu.yaml --url http://127.0.0.1:8123 \
		--api-key sk-noisy-neighbour-victim-0 --duration 40s --json $(RESULTS)/noisy-neighbour-cpu.json

# Scenario presets, each on its own workload against a contrast preset (docs/SCENARIOS.md; ~10 min on
# CPU). Redeploys the running 1-replica cluster once per preset, then restores its config.
bench-scenario: install
	$(call need_cluster,KVSERVE_NUM_REPLICAS=1 make serve)
	$(KV) bench --url $(URL) --sweep scenario --json $(RESULTS)/scenario-sweep-cpu.json

# Live routing A/B on CPU: pow2 / ray_prefix / kvserve on the same 300 requests. Needs a running
# `make serve` cluster (2 CPU replicas); the bench redeploys each policy on it in turn (~15 min).
bench-live-routing: install
	$(call need_cluster,make serve)
	@mkdir -p $(WORK)
	$(KV) bench --url $(URL) $(ACCEPTANCE) --kv-cache-tokens 8000 --seed $(SEED) \
	  --policies pow2,ray_prefix,kvserve --json $(WORK)/live-routing-seed$(SEED).json \
	  --plot $(IMG)/live-routing-cpu-ttft-cdf.png
	$(COLLECT) $(RESULTS)/live-routing-cpu.json live=$(WORK)/live-routing-seed$(SEED).json

# Routing in the simulator (~10 min): the router-defaults scenarios over SEEDS, with the hindsight
# partition bound, and the Mooncake trace at cluster scale (16 replicas at 1x/4x/10x its rate, 1,000),
# with sampled against exhaustive scoring on the trace tiled to 12,000 requests (bench/routing_scale.py).
bench-sim-routing: install
	@rm -rf $(WORK)/sim-routing && mkdir -p $(WORK)/sim-routing
	for s in $(SEEDS); do \
	  $(KV) sim $(ACCEPTANCE) --replicas 2 --policies ray_prefix,kvserve --seed $$s \
	    --profile $(CPU_PROFILE) --kv-blocks 250 --json $(WORK)/sim-routing/cpu-$$s.json && \
	  $(KV) sim $(ACCEPTANCE) --replicas 2 --policies ray_prefix,kvserve --seed $$s \
	    --profile $(CPU_PROFILE_1203) --kv-blocks 250 --partition-oracle 1000 --json $(WORK)/sim-routing/oracle-$$s.json && \
	  for c in 16 64; do \
	    $(KV) sim $(MIX) --replicas 2 --policies ray_prefix,kvserve --seed $$s \
	      --concurrency $$c --requests 3000 --kv-blocks 500 --json $(WORK)/sim-routing/h200-c$$c-$$s.json || exit 1; \
	  done || exit 1; \
	done
	$(COLLECT) $(RESULTS)/sim-router-defaults.json \
	  $(foreach s,$(SEEDS),cpu_c8=$(WORK)/sim-routing/cpu-$(s).json) \
	  $(foreach s,$(SEEDS),cpu_c8_partition_oracle=$(WORK)/sim-routing/oracle-$(s).json) \
	  $(foreach s,$(SEEDS),h200_c16=$(WORK)/sim-routing/h200-c16-$(s).json) \
	  $(foreach s,$(SEEDS),h200_c64=$(WORK)/sim-routing/h200-c64-$(s).json)
	$(KV) sim --trace $(TRACE) --replicas 16 --policies round_robin,pow2,approx_tree,ray_prefix,kvserve \
	  --json $(WORK)/sim-routing/trace16-x1.json
	$(KV) sim --trace $(TRACE) --replicas 16 --policies pow2,approx_tree,ray_prefix,kvserve --time-scale 0.25 \
	  --json $(WORK)/sim-routing/trace16-x4.json
	$(KV) sim --trace $(TRACE) --replicas 16 --policies pow2,approx_tree,ray_prefix,kvserve --time-scale 0.1 \
	  --json $(WORK)/sim-routing/trace16-x10.json
	$(KV) sim --trace $(TRACE) --replicas 1000 --policies kvserve --json $(WORK)/sim-routing/trace1000.json
	$(BIN)/python -m bench.routing_scale --trace $(TRACE) --replicas 16,1000 --requests 12000 \
	  --json $(WORK)/sim-routing/sampling.json
	$(COLLECT) $(RESULTS)/sim-routing-scale.json trace16_x1=$(WORK)/sim-routing/trace16-x1.json \
	  trace16_x4=$(WORK)/sim-routing/trace16-x4.json trace16_x10=$(WORK)/sim-routing/trace16-x10.json \
	  trace1000=$(WORK)/sim-routing/trace1000.json sampling=$(WORK)/sim-routing/sampling.json

# The kvserve routing core's per-decision latency (rank + on_routed, with the simulator's load and
# footprint state), 64 and 1,000 replicas; at 1,000 also scoring every replica.
# Tenant limits' cost per request at the ingress (admission + settling) on a local Ray: no cluster needed.
bench-limits: install
	@mkdir -p $(WORK)
	$(BIN)/python -m bench.limits_overhead --requests 3000 --json $(WORK)/limits-overhead.json
	$(COLLECT) $(RESULTS)/limits-overhead-cpu.json limits=$(WORK)/limits-overhead.json

bench-micro: install
	@mkdir -p $(WORK)
	$(KV) bench micro --replicas 64 --blocks 10000 --decisions 5000 > $(WORK)/micro-64.json
	$(KV) bench micro --replicas 64 --blocks 10000 --decisions 5000 --gc-freeze > $(WORK)/micro-64-freeze.json
	$(KV) bench micro --replicas 1000 --blocks 10000 > $(WORK)/micro-1000.json
	$(KV) bench micro --replicas 1000 --blocks 10000 --decisions 500 --exhaustive > $(WORK)/micro-1000-exhaustive.json
	$(COLLECT) $(RESULTS)/router-micro.json replicas64=$(WORK)/micro-64.json \
	  replicas64_gc_freeze=$(WORK)/micro-64-freeze.json replicas1000=$(WORK)/micro-1000.json \
	  replicas1000_exhaustive=$(WORK)/micro-1000-exhaustive.json

# The autoscaling workload suite in the simulator (~10 min on 2 cores): step, burst, diurnal, multi-turn
# conversations, agentic tool loops, heavy-tailed prompts (2 load levels each, H200 profile's KV size), the
# Mooncake trace at 1x and 2x, and two CPU-profile cells; serve_default and kvserve against the oracle and
# the causal bound. Tuned on seeds 0-4, reported on 5-9 (both in the file).
bench-sim-autoscaling sim-autoscaling-suite: install
	$(KV) sim --suite autoscaling --seeds 0-9 --tune-seeds 0-4 --trace $(TRACE) --jobs 2 \
	  --json $(RESULTS)/autoscaling-suite.json

# How late each suite cell lets a policy learn a minute's need (the oracle's counts asked L s late, ungated):
# the attainment misses' bound under the upscale delay (docs/AUTOSCALING.md, ~7 min on one core).
bench-sim-reaction: install
	$(BIN)/python -m simulator.reaction_budget --cells all --lags 0,6,10,12,16,20,30 --seeds 0-9 --tune-seeds 0-4 \
	  --trace $(TRACE) --json $(RESULTS)/autoscaling-reaction-budget.json

# What the autoscaler's knobs buy: 48 settings (headroom x downscale delay x ramp test) on every suite cell
# and seed; the frontier of rows met, and each row's cheapest setting in hindsight (~20 min on 2 cores)
bench-sim-knobs: install
	$(BIN)/python -m simulator.knob_frontier --seeds 0-9 --tune-seeds 0-4 --trace $(TRACE) \
	  --json $(RESULTS)/autoscaling-knob-frontier.json

# Live autoscaling 1 -> 2 -> 1 on CPU (~7 min of load), beside the simulated scale-down victim A/B
# (simulator.retire_ab, ~15 min). Needs a running cluster with the autoscaling config:
# `make serve CONFIG=bench/configs/autoscale-cpu.yaml`.
bench-live-autoscaling: install
	$(call need_cluster,make serve CONFIG=bench/configs/autoscale-cpu.yaml)
	@mkdir -p $(WORK)
	$(KV) bench --url $(URL) --workload multi-tenant --tenants 4 --system-tokens 500 --question-tokens 30 \
	  --output-tokens 16 --rate 0.4 --load-shape step:1,6,1,1 --step-seconds 100 --requests 1200 \
	  --timeline $(WORK)/live-autoscaling.timeline.json --json $(WORK)/live-autoscaling.json
	$(BIN)/python -m simulator.retire_ab --workloads step,drift,trace --trace $(TRACE) --seeds 0-2 \
	  --retire newest,cache --kv-blocks 4000 --tenants 100 --json $(WORK)/sim-retire.json
	$(COLLECT) $(RESULTS)/live-autoscaling.json bench=$(WORK)/live-autoscaling.json \
	  timeline=$(WORK)/live-autoscaling.timeline.json retire_sim=$(WORK)/sim-retire.json
	cp $(WORK)/live-autoscaling.timeline.png $(IMG)/live-autoscaling.png

# Simulator vs live: the live acceptance runs that `make bench-live-routing SEED=S` left in build/bench
# (one per seed in FIDELITY_SEEDS), beside the simulator on the same workload, calibrated with a
# profile measured the same day (`kvserve profile --out FIDELITY_PROFILE`) and the live router's cost
# slopes (the config defaults `make serve` runs with, not the profile's).
FIDELITY_SEEDS ?= 0
FIDELITY_PROFILE ?= $(CPU_PROFILE_1203)
bench-sim-fidelity: install
	@mkdir -p $(WORK)/sim-fidelity
	$(BIN)/python -c "from kvserve.config import RouterConfig as R; r = R(); \
	  print(f'router:\n  prefill_ms_per_token: {r.prefill_ms_per_token}\n  decode_ms_per_seq: {r.decode_ms_per_seq}')" \
	  > $(WORK)/sim-fidelity/live-router.yaml
	for s in $(FIDELITY_SEEDS); do \
	  test -f $(WORK)/live-routing-seed$$s.json || { echo "no live run of seed $$s: make bench-live-routing SEED=$$s"; exit 1; }; \
	  $(KV) sim $(ACCEPTANCE) --replicas 2 --seed $$s --profile $(FIDELITY_PROFILE) --kv-blocks 250 \
	    --policies pow2,ray_prefix,kvserve --config $(WORK)/sim-fidelity/live-router.yaml \
	    --json $(WORK)/sim-fidelity/sim-$$s.json || exit 1; \
	done
	$(COLLECT) $(RESULTS)/sim-fidelity.json $(foreach s,$(FIDELITY_SEEDS),live=$(WORK)/live-routing-seed$(s).json) \
	  $(foreach s,$(FIDELITY_SEEDS),sim=$(WORK)/sim-fidelity/sim-$(s).json)

# Faults under load (issue 25): SIGKILL an engine process, a replica, the ingress, each mid-load on a
# running `make serve` cluster (run on its machine: the bench signals Ray's actor pids). ~5 min each,
# plus the replacement's start-up. Any lost request fails the target.
CHAOS_RATE ?= 1.0
CHAOS_DURATION ?= 240s
CHAOS_AT ?= 90
CHAOS_LOAD := $(MIX) --rate $(CHAOS_RATE) --duration $(CHAOS_DURATION) --chaos-at $(CHAOS_AT) --seed $(SEED)
bench-chaos: install
	$(call need_cluster,make serve)
	@mkdir -p $(WORK)
	for k in kill-engine kill-replica restart-ingress; do \
	  $(KV) bench --url $(URL) $(CHAOS_LOAD) --chaos $$k --json $(WORK)/chaos-$$k.json || exit 1; \
	done
	$(COLLECT) $(RESULTS)/chaos-cpu.json kill_engine=$(WORK)/chaos-kill-engine.json \
	  kill_replica=$(WORK)/chaos-kill-replica.json restart_ingress=$(WORK)/chaos-restart-ingress.json

# Soak (issue 25): DURATION of steady open-loop load at RATE (~70% of this 2-core host's measured
# capacity, ~2.2 requests/s of the acceptance mix: docs/BENCHMARKS.md), sampling the RSS and open
# fds of the ingress, each replica and the Serve controller. Needs a running `make serve`.
RATE ?= 1.5
DURATION ?= 30m
bench-soak: install
	$(call need_cluster,make serve)
	@mkdir -p $(WORK)
	$(KV) bench --url $(URL) $(MIX) --rate $(RATE) --duration $(DURATION) --seed $(SEED) --json $(WORK)/soak.json
	$(COLLECT) $(RESULTS)/soak-cpu.json soak=$(WORK)/soak.json

# GPU tables (router A/B at GPU scale, overhead vs bare vLLM; issue 29): they run on a GPU machine
# with the offline kit, through bench/gpu_tables.sh; this target says how.
# The floor under kvserve's added TTFT (~4 min): Serve's own one- and two-hop paths with a fake engine.
bench-serving-floor: install
	@rm -f $(WORK)/serving-floor.jsonl && mkdir -p $(WORK)
	for t in bare serve-floor-1hop serve-floor kvserve; do \
	  $(BIN)/python -m bench.serving_path run --target $$t --concurrency 1 --probes 20 \
	    --out $(WORK)/serving-floor.jsonl || exit 1; \
	done
	$(BIN)/python -m bench.serving_floor $(WORK)/serving-floor.jsonl $(RESULTS)/serving-floor-cpu.json

bench-gpu:
	@echo "bench-gpu runs on a GPU machine, not here. There, with the offline kit installed (../shared/gpu/README.md):"
	@echo "  bash bench/gpu_tables.sh overhead OUT    # -> OUT/gpu-overhead.json  (docs/results/gpu-overhead.json)"
	@echo "  bash bench/gpu_tables.sh profile OUT     # -> OUT/gpu-profile.json (kvserve/profiles/h100-vllm0.24-llama8b-share0.25.json)"
	@echo "  CONCURRENCY='64 16' POLICIES_AFTER=kvserve,pow2 REQUESTS_AFTER=600 bash bench/gpu_tables.sh router-ab OUT"
	@echo "    # -> OUT/gpu-router-ab.json (c64) and OUT/gpu-router-ab-c16.json; then here, the host path and the simulator beside it:"
	@echo "    python -m bench.host_fit PROFILE OUT/gpu-router-ab.json OUT/gpu-router-ab-c16.json"
	@echo "    python -m bench.gpu_ab_table OUT/gpu-router-ab.json PROFILE docs/results/gpu-router-ab.json --also OUT/gpu-router-ab-c16.json --device D --vllm V --command C"
	@echo "  bash bench/gpu_tables.sh floor OUT       # -> OUT/serving-floor.json (docs/results/serving-floor-gpu.json)"
	@echo "  python3 -m bench.gpu_check OUT bench/configs/gpu-8b-2replicas.yaml bench/configs/gpu-8b-4replicas.yaml"
	@exit 2

clean:
	rm -rf $(VENV) build *.egg-info
