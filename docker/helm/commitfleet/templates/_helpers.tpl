{{/*
Names, labels, the checks every render makes, and the environment every process gets.
*/}}

{{- define "commitfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "commitfleet.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "commitfleet.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "commitfleet.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* A component's name: <fullname>-<component>, within 63 characters. */}}
{{- define "commitfleet.componentName" -}}
{{- printf "%s-%s" (include "commitfleet.fullname" .ctx | trunc 50 | trimSuffix "-") .component }}
{{- end }}

{{- define "commitfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "commitfleet.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "commitfleet.labels" -}}
{{ include "commitfleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: commitfleet
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "commitfleet.secretName" -}}
{{- if .Values.secrets.create }}
{{- include "commitfleet.fullname" . }}
{{- else }}
{{- .Values.secrets.existingSecret }}
{{- end }}
{{- end }}

{{- define "commitfleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "commitfleet.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "commitfleet.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* terminationGracePeriodSeconds of a worker: the drain, then the margin for handing back and leaving. */}}
{{- define "commitfleet.workerGrace" -}}
{{- add (int (ceil .Values.worker.drainGrace)) (int .Values.worker.terminationMargin) }}
{{- end }}

{{/*
The checks every render makes: what the fleet cannot run with is refused here, with one line.
*/}}
{{- define "commitfleet.validate" -}}
{{- $shards := int .Values.fleet.shards }}
{{- if or (lt $shards 1) (gt $shards 16384) }}
{{- fail "fleet.shards must be between 1 and 16384 (the chart sets it on every process and caps the workers at it)" }}
{{- end }}
{{- if gt (int .Values.worker.replicas) $shards }}
{{- fail (printf "worker.replicas (%d) is above fleet.shards (%d): a worker beyond the shard count owns nothing" (int .Values.worker.replicas) $shards) }}
{{- end }}
{{- $port := int .Values.worker.httpPort }}
{{- if or (lt $port 1) (gt $port 65535) }}
{{- fail "worker.httpPort must be 1..65535: the probes need the worker's health endpoint" }}
{{- end }}
{{- if le (float64 .Values.worker.drainGrace) 0.0 }}
{{- fail "worker.drainGrace must be > 0" }}
{{- end }}
{{- if lt (int .Values.worker.terminationMargin) 1 }}
{{- fail "worker.terminationMargin must be at least 1 second" }}
{{- end }}
{{- if regexMatch "^[a-z+]+://[^/@]*:[^/@]*@" .Values.redis.url }}
{{- fail "redis.url holds a password: put it in the Secret (key redis-password), never in values" }}
{{- end }}
{{- if not (regexMatch "^(s3|gs|az)://" .Values.store.url) }}
{{- fail "store.url must be an object store URL: s3://, gs:// or az:// (file:// is for one host)" }}
{{- end }}
{{- if .Values.secrets.create }}
{{- $token := required "secrets.values.adminToken is required when secrets.create is true" .Values.secrets.values.adminToken }}
{{- if lt (len $token) 16 }}
{{- fail "secrets.values.adminToken must be at least 16 characters" }}
{{- end }}
{{- else if not .Values.secrets.existingSecret }}
{{- fail "name a Secret (secrets.existingSecret) or let the chart create one (secrets.create with secrets.values)" }}
{{- end }}
{{- range $section, $keys := .Values.settings }}
{{- range $key, $_ := $keys }}
{{- $name := printf "%s.%s" $section $key }}
{{- if or (has $section (list "fleet" "redis" "store")) (has $name (list "worker.drain_grace" "worker.http_port" "worker.http_host" "coordinator.http_host" "coordinator.http_port" "coordinator.admin_token" "coordinator.allowed_hosts" "security.hmac_secret")) }}
{{- fail (printf "settings.%s is set by the chart (or is a credential): use its own value" $name) }}
{{- end }}
{{- end }}
{{- end }}
{{- $keda := .Values.autoscaling.keda }}
{{- if $keda.enabled }}
{{- if gt (int $keda.maxReplicaCount) $shards }}
{{- fail (printf "autoscaling.keda.maxReplicaCount (%d) is above fleet.shards (%d): a worker beyond the shard count owns nothing" (int $keda.maxReplicaCount) $shards) }}
{{- end }}
{{- if or (lt (int $keda.minReplicaCount) 1) (gt (int $keda.minReplicaCount) (int $keda.maxReplicaCount)) }}
{{- fail "autoscaling.keda.minReplicaCount must be at least 1 and at most maxReplicaCount" }}
{{- end }}
{{- $window := int $keda.scaleDownStabilizationSeconds }}
{{- if or (gt $window 3600) (lt $window (mul 2 (int (include "commitfleet.workerGrace" .)))) }}
{{- fail "autoscaling.keda.scaleDownStabilizationSeconds must be at least twice the workers' grace period (drainGrace + terminationMargin) and at most 3600" }}
{{- end }}
{{- end }}
{{- end }}

{{/* A variable from the Secret (optional: a key left out of the Secret leaves the variable unset). */}}
{{- define "commitfleet.secretEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ include "commitfleet.secretName" .ctx }}
      key: {{ .key }}
      optional: {{ .optional }}
{{- end }}

{{/* The environment every process gets: the fleet, Redis, the store, their credentials, the extra settings. */}}
{{- define "commitfleet.env" -}}
- name: COMMITFLEET_FLEET_NAME
  value: {{ .Values.fleet.name | quote }}
- name: COMMITFLEET_FLEET_SHARDS
  value: {{ .Values.fleet.shards | int | toString | quote }}
- name: REDIS_URL
  value: {{ .Values.redis.url | quote }}
{{- with .Values.redis.durability }}
- name: COMMITFLEET_REDIS_DURABILITY
  value: {{ . | quote }}
{{- end }}
{{- if .Values.redis.waitReplicas }}
- name: COMMITFLEET_REDIS_WAIT_REPLICAS
  value: {{ .Values.redis.waitReplicas | int | toString | quote }}
{{- end }}
- name: COMMITFLEET_STORE
  value: {{ .Values.store.url | quote }}
{{- if hasPrefix "s3://" .Values.store.url }}
- name: COMMITFLEET_STORE_S3_REGION
  value: {{ .Values.store.s3.region | quote }}
- name: AWS_DEFAULT_REGION
  value: {{ .Values.store.s3.region | quote }}
{{- with .Values.store.s3.endpointUrl }}
- name: COMMITFLEET_STORE_S3_ENDPOINT_URL
  value: {{ . | quote }}
{{- end }}
{{ include "commitfleet.secretEnv" (dict "ctx" . "name" "AWS_ACCESS_KEY_ID" "key" "aws-access-key-id" "optional" true) }}
{{ include "commitfleet.secretEnv" (dict "ctx" . "name" "AWS_SECRET_ACCESS_KEY" "key" "aws-secret-access-key" "optional" true) }}
{{- end }}
{{- if hasPrefix "gs://" .Values.store.url }}
{{- with .Values.store.gcs.endpoint }}
- name: COMMITFLEET_STORE_GCS_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- if .Values.store.gcs.credentialsFromSecret }}
- name: GOOGLE_APPLICATION_CREDENTIALS
  value: /var/run/secrets/commitfleet/gcs/credentials.json
{{- end }}
{{- end }}
{{- if hasPrefix "az://" .Values.store.url }}
{{ include "commitfleet.secretEnv" (dict "ctx" . "name" "COMMITFLEET_STORE_AZURE_CONNECTION_STRING" "key" "azure-connection-string" "optional" true) }}
{{- if .Values.store.azure.accountUrl }}
- name: COMMITFLEET_STORE_AZURE_ACCOUNT_URL
  value: {{ .Values.store.azure.accountUrl | quote }}
{{ include "commitfleet.secretEnv" (dict "ctx" . "name" "AZURE_STORAGE_KEY" "key" "azure-storage-key" "optional" true) }}
{{- else }}
{{ include "commitfleet.secretEnv" (dict "ctx" . "name" "COMMITFLEET_STORE_AZURE_ACCOUNT_URL" "key" "azure-account-url" "optional" true) }}
{{- end }}
{{- end }}
{{ include "commitfleet.secretEnv" (dict "ctx" . "name" "COMMITFLEET_REDIS_PASSWORD" "key" "redis-password" "optional" true) }}
{{ include "commitfleet.secretEnv" (dict "ctx" . "name" "COMMITFLEET_SECURITY_HMAC_SECRET" "key" "hmac-secret" "optional" true) }}
- name: PYTHONDONTWRITEBYTECODE
  value: "1"
{{- range $section, $keys := .Values.settings }}
{{- range $key, $value := $keys }}
- name: {{ printf "COMMITFLEET_%s_%s" $section $key | upper }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Volumes every pod mounts: /tmp, and the GCS key file when asked. */}}
{{- define "commitfleet.volumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.tmpSizeLimit }}
{{- if and (hasPrefix "gs://" .Values.store.url) .Values.store.gcs.credentialsFromSecret }}
- name: gcs-credentials
  secret:
    secretName: {{ include "commitfleet.secretName" . }}
    items:
      - key: gcs-credentials.json
        path: credentials.json
{{- end }}
{{- end }}

{{- define "commitfleet.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if and (hasPrefix "gs://" .Values.store.url) .Values.store.gcs.credentialsFromSecret }}
- name: gcs-credentials
  mountPath: /var/run/secrets/commitfleet/gcs
  readOnly: true
{{- end }}
{{- end }}
