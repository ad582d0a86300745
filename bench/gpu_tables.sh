#!/usr/bin/env bash
# The GPU tables of docs/BENCHMARKS.md, run on a GPU machine where the kit is installed
# (../shared/gpu/README.md: vLLM 0.24 + Ray 2.60 unpacked in /tmp/site, the 8B shape in /tmp/model8b).
#   bash bench/gpu_tables.sh overhead OUT    kvserve (1 replica) vs vLLM's own server -> OUT/gpu-overhead.json
#   bash bench/gpu_tables.sh router-ab OUT   4 replicas on one GPU, routers A/B     -> OUT/gpu-router-ab.json
#   bash bench/gpu_tables.sh profile OUT     one engine on a quarter of the GPU       -> OUT/gpu-profile.json
#   bash bench/gpu_tables.sh floor OUT       Serve's own path (no kvserve work), c1   -> OUT/serving-floor.json
#   bash bench/gpu_tables.sh ab-start        router-ab detached into /tmp/ab (outlives a device call's limit)
#   bash bench/gpu_tables.sh ab-wait OUT [S] waits up to S s for it, then copies /tmp/ab to OUT
# Each writes its JSON as it goes, so a run cut short keeps what it measured.
set -uo pipefail
what=${1:?overhead, router-ab, profile, ab-start or ab-wait}
out=${2:-/tmp/ab}
mkdir -p "$out"
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 RAY_USAGE_STATS_ENABLED=0
py=python3
# The profile and the A/B size each engine's KV cache like a quarter of an H100 (~19k tokens) on any card:
# on a bigger card each replica plans less of its share, so the KV pressure (prompts >= 2x a cache) is the same.
mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
if [ "${mib:-0}" -gt 100000 ] && [ "$what" != overhead ]; then export KVSERVE_ENGINE__GPU_MEMORY_UTILIZATION=0.54; fi

case "$what" in
overhead)
  $py -m cli bench-overhead --config bench/configs/gpu-8b-1replica.yaml --concurrency "${LEVELS:-1,32,128}" \
    --out "$out/gpu-overhead.json" --logs /tmp/overhead-logs
  rc=$?
  tar -czf "$out/overhead-logs.tgz" -C /tmp overhead-logs 2>/dev/null
  exit $rc
  ;;
router-ab)
  cfg=bench/configs/gpu-8b-4replicas.yaml
  setsid $py -m cli serve --config $cfg > /tmp/serve.log 2>&1 < /dev/null &
  pid=$!
  # The bench waits for every replica itself (/ready). Each policy restarts the ingress (its router) and
  # empties the engines' prefix caches; the engines start once (~4 min for 4 with CUDA graphs).
  # CONCURRENCY: one or more levels on the same engines; the first writes gpu-router-ab.json, the others
  # gpu-router-ab-cN.json (how the TTFT breakdown moves with load), with POLICIES_AFTER if set.
  # REQUESTS: 1,200 (the issue's A/B). A closed loop opens with `concurrency` requests at once on empty
  # caches; at 600 requests those 64 are 11% of the run and the p90 lands inside that opening burst.
  # REQUESTS_AFTER: the later levels' count (default REQUESTS).
  rc=0; first=1
  for c in ${CONCURRENCY:-64}; do
    name=gpu-router-ab; pols=${POLICIES:-kvserve,ray_prefix,pow2,round_robin}; n=${REQUESTS:-1200}
    [ $first = 1 ] || { name=gpu-router-ab-c$c; pols=${POLICIES_AFTER:-$pols}; n=${REQUESTS_AFTER:-$n}; }; first=0
    $py -m cli bench --config $cfg --workload multi-tenant --tenants 32 --tenant-skew zipf:1.1 \
      --system-tokens 2000 --question-tokens 50 --output-tokens 64 --concurrency $c --requests "$n" \
      --policies "$pols" --ready-timeout 600 --timeout 300 --json "$out/$name.json" \
      --requests-jsonl /tmp/$name.requests.jsonl || rc=$?
    gzip -c /tmp/$name.requests.jsonl > "$out/$name.requests.jsonl.gz" 2>/dev/null
  done
  kill -INT -- -$pid 2>/dev/null; sleep 10; /tmp/site/bin/ray stop --force > /dev/null 2>&1
  tail -200 /tmp/serve.log > "$out/router-ab.serve.log"
  exit $rc
  ;;
profile)
  # The replicas' own engine settings and share, so the simulator models the engines the A/B ran on.
  $py -m cli profile --config bench/configs/gpu-8b-4replicas.yaml --out "$out/gpu-profile.json" \
    --prompt-sizes 256,512,1024,2048,4000 --fractions 0,0.5,0.9 --batches 1,2,4,8,16,32,64 --contexts 1024,2048 --reps 3
  ;;
floor)
  # The floor under kvserve's added TTFT: Serve's own one- and two-hop paths on this host, fake engine.
  for t in bare serve-floor-1hop serve-floor kvserve; do
    $py -m bench.serving_path run --target $t --concurrency 1 --probes 20 --config bench/configs/gpu-8b-1replica.yaml \
      --out "$out/serving-floor.jsonl" || exit 1
  done
  $py -m bench.serving_floor "$out/serving-floor.jsonl" "$out/serving-floor.json"
  ;;
ab-start)
  mkdir -p /tmp/ab
  setsid bash "$0" router-ab /tmp/ab > /tmp/ab/run.log 2>&1 < /dev/null &
  echo $! > /tmp/ab/pid
  ;;
ab-wait)
  deadline=$((SECONDS + ${3:-500}))
  while kill -0 "$(cat /tmp/ab/pid)" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 5; done
  cp -r /tmp/ab/. "$out/"
  if kill -0 "$(cat /tmp/ab/pid)" 2>/dev/null; then echo "router-ab still running"; exit 3; fi
  ;;
*)
  echo "usage: $0 overhead|router-ab|profile OUT, ab-start, ab-wait OUT [S]" >&2
  exit 2
  ;;
esac
