{{/*
Shared names, labels and values of the STUNner chart. Object names are fixed (not prefixed
with the release name): the stunnerd pods, turncat and the operator find the CDS by the
Service name "stunner-config-discovery", as upstream STUNner does.
*/}}

{{- define "stunner.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/part-of: stunner
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: pass (dict "ctx" $ "component" "cds"). */}}
{{- define "stunner.selectorLabels" -}}
app.kubernetes.io/name: stunner
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Full labels of one component: pass (dict "ctx" $ "component" "cds"). */}}
{{- define "stunner.componentLabels" -}}
{{ include "stunner.labels" .ctx }}
{{ include "stunner.selectorLabels" . }}
{{- end -}}

{{/* An image reference: pass (dict "ctx" $ "repository" "stunner-cds" "tag" ""). */}}
{{- define "stunner.image" -}}
{{- $registry := .ctx.Values.image.registry | default "" | trimSuffix "/" -}}
{{- $tag := .tag | default .ctx.Values.image.tag | default .ctx.Chart.AppVersion -}}
{{- if $registry -}}
{{ printf "%s/%s:%s" $registry .repository $tag }}
{{- else -}}
{{ printf "%s:%s" .repository $tag }}
{{- end -}}
{{- end -}}

{{- define "stunner.cdsServiceName" -}}
stunner-config-discovery
{{- end -}}

{{- define "stunner.redisName" -}}
stunner-redis
{{- end -}}

{{- define "stunner.operatorServiceAccountName" -}}
{{- if .Values.operator.serviceAccount.create -}}
{{ .Values.operator.serviceAccount.name | default "stunner-operator" }}
{{- else -}}
{{ required "operator.serviceAccount.name must name an existing ServiceAccount when operator.serviceAccount.create is false" .Values.operator.serviceAccount.name }}
{{- end -}}
{{- end -}}

{{/* The CDS address the operator hands to the stunnerd pods (host:port). */}}
{{- define "stunner.cdsAddress" -}}
{{- if .Values.operator.cdsAddress -}}
{{ .Values.operator.cdsAddress }}
{{- else -}}
{{ printf "%s.%s.svc:%v" (include "stunner.cdsServiceName" .) .Release.Namespace .Values.cds.port }}
{{- end -}}
{{- end -}}

{{/*
The REDIS_URL environment variable of the operator and the CDS: the chart's own Redis, a
Secret holding the URL, or a plain external URL; rendering fails with a message when Redis is
disabled and neither is given.
*/}}
{{- define "stunner.redisUrlEnv" -}}
- name: REDIS_URL
{{- if .Values.redis.enabled }}
  value: {{ printf "redis://%s.%s.svc:6379/0" (include "stunner.redisName" .) .Release.Namespace | quote }}
{{- else if .Values.redis.urlSecret.name }}
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.urlSecret.name | quote }}
      key: {{ .Values.redis.urlSecret.key | default "url" | quote }}
{{- else if .Values.redis.url }}
{{- if not (regexMatch "^rediss?://" .Values.redis.url) }}
{{- fail (printf "redis.url must start with redis:// or rediss://, got %q" .Values.redis.url) }}
{{- end }}
  value: {{ .Values.redis.url | quote }}
{{- else }}
{{- fail "redis.enabled is false: set redis.url (e.g. redis://my-redis:6379/0) or redis.urlSecret.name" }}
{{- end }}
{{- end -}}

