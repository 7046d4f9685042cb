{{/* Chart name, truncated to the 63 characters a label allows. */}}
{{- define "kvgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart, unless the release name already contains the chart name. */}}
{{- define "kvgate.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kvgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kvgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kvgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kvgate
{{- end }}

{{- define "kvgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kvgate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kvgate.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "kvgate.policiesConfigMap" -}}
{{- printf "%s-policies" (include "kvgate.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* ConfigMap keys cannot hold "/": tenant files are stored flat and laid out as tenants/<name>.yaml by the volume. */}}
{{- define "kvgate.tenantKey" -}}
{{- printf "tenant.%s.yaml" . }}
{{- end }}

{{- define "kvgate.usesRedis" -}}
{{- if or .Values.redis.url .Values.redis.existingSecret.name }}true{{ end }}
{{- end }}

{{/* Render-time checks the schema cannot express. */}}
{{- define "kvgate.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not (include "kvgate.usesRedis" .)) }}
{{- fail "replicaCount > 1 needs redis.url or redis.existingSecret: replicas must share the ledger and shadow store (KVGATE_REDIS_URL)" }}
{{- end }}
{{- $keyEnvs := list }}
{{- range .Values.secrets.upstreamKeys }}
{{- $keyEnvs = append $keyEnvs .env }}
{{- end }}
{{- $poolNames := list }}
{{- range .Values.policies.pools }}
{{- if has .name $poolNames }}
{{- fail (printf "policies.pools: pool %q is listed twice" .name) }}
{{- end }}
{{- $poolNames = append $poolNames .name }}
{{- if and .api_key_env (not (has .api_key_env $keyEnvs)) }}
{{- fail (printf "pool %q reads its upstream key from $%s, but secrets.upstreamKeys has no entry with env: %s" .name .api_key_env .api_key_env) }}
{{- end }}
{{- end }}
{{- $tenantNames := list }}
{{- range .Values.policies.tenants }}
{{- if has .tenant $tenantNames }}
{{- fail (printf "policies.tenants: tenant %q is listed twice" .tenant) }}
{{- end }}
{{- $tenantNames = append $tenantNames .tenant }}
{{- end }}
{{- if not (has .Values.policies.defaultPool $poolNames) }}
{{- fail (printf "policies.defaultPool %q is not one of policies.pools" .Values.policies.defaultPool) }}
{{- end }}
{{- if .Values.networkPolicy.enabled }}
{{- $selector := .Values.networkPolicy.vllm.podSelector }}
{{- if not (or $selector.matchLabels $selector.matchExpressions) }}
{{- fail "networkPolicy.enabled needs networkPolicy.vllm.podSelector to select the vLLM pods (an empty selector would select every pod in the namespace)" }}
{{- end }}
{{- end }}
{{- $public := default list .Values.policies.publicPaths }}
{{- if and .Values.probes.liveness.enabled (not (has "/livez" $public)) }}
{{- fail "probes.liveness is on, so policies.publicPaths must include /livez (probes carry no key)" }}
{{- end }}
{{- if and .Values.probes.readiness.enabled (not (has "/readyz" $public)) }}
{{- fail "probes.readiness is on, so policies.publicPaths must include /readyz (probes carry no key)" }}
{{- end }}
{{- end }}
