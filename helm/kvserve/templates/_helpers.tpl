{{/* Names and labels. */}}
{{- define "kvserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kvserve.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "kvserve.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "kvserve.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kvserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kvserve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "kvserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "kvserve.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "kvserve.isGpu" -}}
{{- if eq (dig "engine" "device" "cpu" .Values.kvserve) "gpu" }}true{{ end -}}
{{- end -}}

{{- define "kvserve.httpPort" -}}
{{- dig "server" "port" 8000 .Values.kvserve | int -}}
{{- end -}}

{{/*
The kvserve config as served: .Values.kvserve with the mounted key Secret wired into
tenants.keys_file when no key source is set (mirrors cluster.helm_values.effective_kvserve),
plus the checks the JSON schema cannot express, failing with the field name (the key rules
are kvserve.config.serving_problem's, which the app applies again when it starts).
*/}}
{{- define "kvserve.config" -}}
{{- $cfg := deepCopy (.Values.kvserve | default dict) -}}
{{- $secret := .Values.apiKeySecret -}}
{{- $t := $cfg.tenants | default dict -}}
{{- if not (or $t.keys $t.keys_file $t.open_mode) -}}
{{- if $secret.name -}}
{{- $_ := set $t "keys_file" (printf "%s/%s" $secret.mountPath $secret.key) -}}
{{- $_ := set $cfg "tenants" $t -}}
{{- else -}}
{{- fail "kvserve.tenants: no API keys configured: set apiKeySecret.name (recommended), kvserve.tenants.keys/keys_file, or kvserve.tenants.open_mode=true with kvserve.tenants.allow_open_on_network=true for development on a trusted network" -}}
{{- end -}}
{{- end -}}
{{- if .Values.batchStore.enabled -}}
{{- $b := $cfg.batch | default dict -}}
{{- if not (hasKey $b "db_path") }}{{ $_ := set $b "db_path" (printf "%s/batch.sqlite" .Values.batchStore.mountPath) }}{{ end -}}
{{- if not (hasKey $b "node_resource") }}{{ $_ := set $b "node_resource" "node:__internal_head__" }}{{ end -}}
{{- $_ := set $cfg "batch" $b -}}
{{- end -}}
{{- $host := dig "server" "host" "127.0.0.1" $cfg -}}
{{- if and $t.open_mode (not $t.allow_open_on_network) (not (or (hasPrefix "127." $host) (eq $host "localhost" "::1"))) -}}
{{- fail (printf "kvserve.tenants.open_mode serves without API keys on the network address server.host=%s: set kvserve.tenants.allow_open_on_network=true (trusted network only) or configure API keys" $host) -}}
{{- end -}}
{{- $as := $cfg.autoscaling | default dict -}}
{{- if gt (int (dig "min_replicas" 1 $as)) (int (dig "max_replicas" 2 $as)) -}}
{{- fail "kvserve.autoscaling.min_replicas must be <= kvserve.autoscaling.max_replicas" -}}
{{- end -}}
{{- if gt (float64 (dig "overload_memory_s" 300.0 $as)) (float64 (dig "overload_memory_max_s" 86400.0 $as)) -}}
{{- fail "kvserve.autoscaling.overload_memory_s must be <= kvserve.autoscaling.overload_memory_max_s" -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* Ray Serve config (serveConfigV2): the same shape as cluster.serve_config.build_serve_config. */}}
{{- define "kvserve.serveConfig" -}}
{{- $cfg := include "kvserve.config" . | fromYaml -}}
{{- $http := dict "host" (dig "server" "host" "0.0.0.0" .Values.kvserve) "port" (include "kvserve.httpPort" . | int) "request_timeout_s" (dig "server" "request_timeout_s" 600.0 .Values.kvserve) -}}
{{- $app := dict "name" (default "kvserve" $cfg.app_name) "route_prefix" "/" "import_path" "deployments.app:build_app" "runtime_env" .Values.serve.runtimeEnv -}}
{{- if dig "autoscaling" "enabled" false $cfg -}}
{{- $_ := set $app "args" (dict "config" $cfg) -}}
{{- else -}}
{{/* A fixed count goes in per-deployment overrides, not the args, so resizing restarts no engine (mirrors cluster.serve_config.size_overrides). */}}
{{- $n := int (dig "num_replicas" 2 $cfg) -}}
{{- $mo := int (dig "server" "max_ongoing_requests" 64 $cfg) -}}
{{- $mq := int (dig "server" "max_queued_requests" 256 $cfg) -}}
{{- $ongoing := max (mul 2 (add (mul $mo $n) (max $mq 0))) 256 -}}
{{- $queued := $ongoing -}}
{{- if lt $mq 0 }}{{ $queued = -1 }}{{ end -}}
{{- $args := deepCopy $cfg -}}
{{- $_ := set $args "num_replicas" 1 -}}
{{- $_ := set $app "args" (dict "config" $args) -}}
{{- $_ := set $app "deployments" (list (dict "name" "LLMReplica" "num_replicas" $n) (dict "name" "Ingress" "max_ongoing_requests" $ongoing "max_queued_requests" $queued)) -}}
{{- end -}}
{{- toYaml (dict "http_options" $http "applications" (list $app)) -}}
{{- end -}}

{{/*
Worker pods for the replica range (mirrors cluster.helm_values.worker_bounds):
replicas per worker = gpus / tensor_parallel_size on GPU (fails if a replica cannot fit), 1 on CPU;
a fixed count when autoscaling is off.
*/}}
{{- define "kvserve.workerBounds" -}}
{{- $kv := .Values.kvserve -}}
{{- $per := 1 -}}
{{- if include "kvserve.isGpu" . -}}
{{- $tp := int (dig "engine" "tensor_parallel_size" 1 $kv) -}}
{{- if lt (int .Values.worker.gpus) $tp -}}
{{- fail (printf "worker.gpus (%d) < kvserve.engine.tensor_parallel_size (%d): a replica cannot fit" (int .Values.worker.gpus) $tp) -}}
{{- end -}}
{{- $per = div (int .Values.worker.gpus) $tp -}}
{{- end -}}
{{- $lo := int (dig "num_replicas" 2 $kv) -}}
{{- $hi := $lo -}}
{{- if dig "autoscaling" "enabled" false $kv -}}
{{- $lo = int (dig "autoscaling" "min_replicas" 1 $kv) -}}
{{- $hi = int (dig "autoscaling" "max_replicas" 2 $kv) -}}
{{- end -}}
{{- $min := div (add $lo $per -1) $per -}}
{{- $max := div (add $hi $per -1) $per -}}
{{- if not (kindIs "invalid" .Values.worker.minReplicas) }}{{ $min = int .Values.worker.minReplicas }}{{ end -}}
{{- if not (kindIs "invalid" .Values.worker.maxReplicas) }}{{ $max = int .Values.worker.maxReplicas }}{{ end -}}
{{- if gt $min $max -}}
{{- fail "worker.minReplicas must be <= worker.maxReplicas" -}}
{{- end -}}
{{- toYaml (dict "min" $min "max" $max) -}}
{{- end -}}

{{/* Volume + mount of the tenant-key Secret (read-only), when one is named. */}}
{{- define "kvserve.keyVolume" -}}
{{- if .Values.apiKeySecret.name -}}
- name: api-keys
  secret:
    secretName: {{ .Values.apiKeySecret.name }}
    defaultMode: 0440
{{- end -}}
{{- end -}}
{{- define "kvserve.keyMount" -}}
{{- if .Values.apiKeySecret.name -}}
- name: api-keys
  mountPath: {{ .Values.apiKeySecret.mountPath }}
  readOnly: true
{{- end -}}
{{- end -}}
