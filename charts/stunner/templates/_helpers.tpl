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
{{- if not $registry -}}
{{- fail "image.registry is empty: a bare image name is looked up on a public registry, where these images do not exist. Build them with `make images` and either load them into the nodes and set image.registry=localhost, or push them and set image.registry to your registry" -}}
{{- end -}}
{{- $tag := .tag | default .ctx.Values.image.tag | default .ctx.Chart.AppVersion -}}
{{ printf "%s/%s:%s" $registry .repository $tag }}
{{- end -}}

{{/* The chart no longer ships Gateway API CRDs: say how to get the official ones. */}}
{{- define "stunner.checkValues" -}}
{{- if .Values.gatewayAPI.installCRDs -}}
{{- fail "gatewayAPI.installCRDs: this chart does not install the Gateway API CRDs. Install the Gateway API project's release (standard channel and the experimental UDPRoute, see the chart's README) and leave gatewayAPI.installCRDs false" -}}
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
REDIS_PASSWORD and REDIS_URL of the operator or the CDS: pass (dict "ctx" $ "user" "operator")
or "cds". With the chart's Redis, each logs in as its own ACL user with the password from the
Secret "stunner-redis" (Kubernetes expands $(REDIS_PASSWORD) in the URL). With an external
Redis: a Secret holding the whole URL, or a URL plus a password Secret. Rendering fails with a
message when Redis is disabled and no external Redis is given.
*/}}
{{- define "stunner.redisUrlEnv" -}}
{{- $v := .ctx.Values.redis -}}
{{- if $v.enabled }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "stunner.redisName" .ctx }}
      key: {{ printf "%s-password" .user }}
- name: REDIS_URL
  value: {{ printf "redis://stunner-%s:$(REDIS_PASSWORD)@%s.%s.svc:6379/0" .user (include "stunner.redisName" .ctx) .ctx.Release.Namespace | quote }}
{{- else if $v.external.urlSecret.name }}
- name: REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ $v.external.urlSecret.name | quote }}
      key: {{ $v.external.urlSecret.key | default "url" | quote }}
{{- else if $v.external.url }}
{{- if not (regexMatch "^rediss?://" $v.external.url) }}
{{- fail (printf "redis.external.url must start with redis:// or rediss://, got %q" $v.external.url) }}
{{- end }}
{{- if $v.external.passwordSecret.name }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $v.external.passwordSecret.name | quote }}
      key: {{ $v.external.passwordSecret.key | default "password" | quote }}
- name: REDIS_URL
  value: {{ regexReplaceAll "^(rediss?://)(?:([^:@/]*)(?::[^@/]*)?@)?" $v.external.url "${1}${2}:$(REDIS_PASSWORD)@" | quote }}
{{- else }}
- name: REDIS_URL
  value: {{ $v.external.url | quote }}
{{- end }}
{{- else }}
{{- fail "redis.enabled is false: set redis.external.url (e.g. rediss://my-redis:6380/0) or redis.external.urlSecret.name" }}
{{- end }}
{{- end -}}

{{/* Labels selecting the stunnerd pods the operator provisions (any Gateway). */}}
{{- define "stunner.dataplaneSelector" -}}
app: stunner
{{- end -}}

{{/* Redis ACL rules of the operator and the CDS users: keep equal to stunner_common.redis_acl. */}}
{{- define "stunner.redisOperatorRules" -}}
resetkeys ~stunner:* resetchannels -@all +@connection -@admin -@dangerous +ping +evalsha +eval +script|load +script|exists +get +incr +hget +hgetall +hkeys +hset +hdel +xadd +xrange +xlen +multi +exec +discard
{{- end -}}

{{- define "stunner.redisCdsRules" -}}
resetkeys ~stunner:* resetchannels -@all +@connection -@admin -@dangerous +ping +get +hget +hgetall +hkeys +xread +xrange +xrevrange +xlen +multi +exec +discard
{{- end -}}

{{- define "stunner.redisDataplaneRules" -}}
resetkeys ~stunner:quota:* resetchannels -@all +@connection -@admin -@dangerous +ping +evalsha +eval +script|load +script|exists +time +zadd +zrem +zscore +zcard +zrange +zremrangebyscore +pexpireat
{{- end -}}

{{/* Whether the stunnerd pods count userQuota across replicas in the chart's Redis. */}}
{{- define "stunner.clusterQuota" -}}
{{- if and .Values.redis.enabled .Values.dataplane.clusterWideQuota -}}true{{- end -}}
{{- end -}}

{{- define "stunner.quotaSecretName" -}}
stunner-quota-redis
{{- end -}}

{{/* The Secret and key of the CDS bearer token (see cds.token). */}}
{{- define "stunner.cdsTokenSecretName" -}}
{{ .Values.cds.token.existingSecret.name | default "stunner-cds-token" }}
{{- end -}}

{{- define "stunner.cdsTokenSecretKey" -}}
{{ if .Values.cds.token.existingSecret.name }}{{ .Values.cds.token.existingSecret.key | default "token" }}{{ else }}token{{ end }}
{{- end -}}

{{/* The CDS_TOKEN env entry of a CDS client or of the CDS itself; nothing when cds.token is off. */}}
{{- define "stunner.cdsTokenEnv" -}}
{{- if .Values.cds.token.enabled }}
- name: CDS_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "stunner.cdsTokenSecretName" . | quote }}
      key: {{ include "stunner.cdsTokenSecretKey" . | quote }}
{{- end }}
{{- end -}}
