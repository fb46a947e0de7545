{{/* ---------------------------------------------------------------------------------------------------
Names and labels
--------------------------------------------------------------------------------------------------- */}}

{{/* The chart name (nameOverride wins). */}}
{{- define "prfaas.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The object-name prefix: <release>-<chart>, or the release name when it already contains the chart name. */}}
{{- define "prfaas.fullname" -}}
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

{{/* name-version, for the helm.sh/chart label. */}}
{{- define "prfaas.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "prfaas.labels" -}}
helm.sh/chart: {{ include "prfaas.chart" . }}
app.kubernetes.io/name: {{ include "prfaas.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: prfaas
{{- with .Values.region }}
prfaas.io/region: {{ . | quote }}
{{- end }}
{{- range $k, $v := .Values.commonLabels }}
{{ $k }}: {{ $v | quote }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: (dict "root" $ "component" "operator"). */}}
{{- define "prfaas.selectorLabels" -}}
app.kubernetes.io/name: {{ include "prfaas.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* All labels of one component's objects: (dict "root" $ "component" "operator"). */}}
{{- define "prfaas.componentLabels" -}}
{{ include "prfaas.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The one image of every component. */}}
{{- define "prfaas.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}
{{- end }}

{{/* ---------------------------------------------------------------------------------------------------
Operator
--------------------------------------------------------------------------------------------------- */}}

{{- define "prfaas.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (printf "%s-operator" (include "prfaas.fullname" .)) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "prfaas.operator.leaseName" -}}
{{- default (printf "%s-operator" (include "prfaas.fullname" .)) .Values.operator.lease.name }}
{{- end }}

{{/* The namespaces the operator serves, as a JSON list (empty watchNamespaces: the release namespace). */}}
{{- define "prfaas.operator.namespaces" -}}
{{- if .Values.operator.watchNamespaces }}
{{- .Values.operator.watchNamespaces | uniq | toJson }}
{{- else }}
{{- list .Release.Namespace | toJson }}
{{- end }}
{{- end }}

{{/* One RBAC rule of files/operator-rbac.yaml, without its documentation keys: (dict "root" $ "rule" $rule). */}}
{{- define "prfaas.operator.rule" -}}
{{- $rule := .rule }}
{{- $out := dict "apiGroups" $rule.apiGroups "resources" $rule.resources "verbs" $rule.verbs }}
{{- if eq (default "" $rule.resourceNamesFrom) "lease" }}
{{- $_ := set $out "resourceNames" (list (include "prfaas.operator.leaseName" .root)) }}
{{- end }}
{{- $omit := false }}
{{- if eq (default "" $rule.resourceNamesFrom) "secrets" }}
{{- $rbac := .root.Values.operator.rbac }}
{{- $names := concat (default list $rbac.secretNames) (default list .root.Values.router.secrets) | uniq | sortAlpha }}
{{- if $rbac.allSecrets }}
{{- else if $names }}
{{- $_ := set $out "resourceNames" $names }}
{{- else }}
{{- $omit = true }}
{{- end }}
{{- end }}
{{- if not $omit }}
{{- list $out | toYaml }}
{{- end }}
{{- end }}

{{/* ---------------------------------------------------------------------------------------------------
Router (standalone and sidecar)
--------------------------------------------------------------------------------------------------- */}}

{{/* The ConfigMap the operator writes for a PDCluster (never templated by this chart): router_config.py. */}}
{{- define "prfaas.router.configMapName" -}}
{{- printf "%s-router-config" (required "router.pdCluster is required for the router and its sidecar" .Values.router.pdCluster) }}
{{- end }}

{{/* The chart-owned ConfigMap of the router's static settings. */}}
{{- define "prfaas.router.settingsName" -}}
{{- printf "%s-router-settings" (include "prfaas.fullname" .) }}
{{- end }}

{{- define "prfaas.router.configDir" -}}/etc/prfaas/router{{- end }}
{{- define "prfaas.secretsDir" -}}/var/run/prfaas/secrets{{- end }}

{{/* Volume mounts of a router container: the operator's ConfigMap and the remote gateways' Secrets. */}}
{{- define "prfaas.router.volumeMounts" -}}
- name: prfaas-router-config
  mountPath: {{ include "prfaas.router.configDir" . }}
  readOnly: true
{{- range $i, $name := .Values.router.secrets }}
- name: prfaas-secret-{{ $i }}
  mountPath: {{ include "prfaas.secretsDir" $ }}/{{ $name }}
  readOnly: true
{{- end }}
{{- include "prfaas.tokenizer.volumeMount" . }}
{{- if include "prfaas.router.peersTokenSecret" . }}
- name: prfaas-router-peers-token
  mountPath: {{ dir (include "prfaas.router.peersTokenFile" .) }}
  readOnly: true
{{- end }}
{{- if gt (int .Values.router.workers) 1 }}
{{- /* the workers' shared metrics folder and token (the root filesystem is read-only) */}}
- name: prfaas-router-tmp
  mountPath: /tmp
{{- end }}
{{- end }}

{{/* Where the router replicas' shared books token is mounted (router.replicaSync.tokenSecret). */}}
{{- define "prfaas.router.peersTokenFile" -}}
/var/run/prfaas/router/peers/token
{{- end }}

{{/* Whether router replicas (router.replicaSync) or sidecars (sidecar.replicaSync) share their books. */}}
{{- define "prfaas.router.replicaSyncOn" -}}
{{- if or (and .Values.router.enabled .Values.router.replicaSync.enabled) .Values.sidecar.replicaSync.enabled }}true{{- end }}
{{- end }}

{{/* The Secret (key `token`) of the replicas' books token: router.replicaSync.tokenSecret, else the one this
chart generates (<fullname>-router-peers-token) wherever replicas share books; empty: none is needed. */}}
{{- define "prfaas.router.peersTokenSecret" -}}
{{- if .Values.router.replicaSync.tokenSecret }}{{ .Values.router.replicaSync.tokenSecret }}
{{- else if include "prfaas.router.replicaSyncOn" . }}{{ printf "%s-router-peers-token" (include "prfaas.fullname" .) }}
{{- end }}
{{- end }}

{{/*
The served model's tokenizer volume (values.tokenizer), mounted read-only into routers and gateways.
*/}}
{{- define "prfaas.tokenizer.volumeMount" -}}
{{- if .Values.tokenizer.volume }}
- name: prfaas-tokenizer
  mountPath: {{ .Values.tokenizer.mountPath }}
  readOnly: true
{{- end }}
{{- end }}
{{- define "prfaas.tokenizer.volume" -}}
{{- if .Values.tokenizer.volume }}
- name: prfaas-tokenizer
  {{- toYaml .Values.tokenizer.volume | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The router's volumes. The operator's ConfigMap is optional: a router started before the operator wrote it
waits (--wait-for-config: alive, /ready 503 with the reason) until it appears (kubelet then fills the volume;
later changes are hot-reloaded by the router).
*/}}
{{- define "prfaas.routerSidecar.volumes" -}}
- name: prfaas-router-config
  configMap:
    name: {{ include "prfaas.router.configMapName" . }}
    optional: true
{{- range $i, $name := .Values.router.secrets }}
- name: prfaas-secret-{{ $i }}
  secret:
    secretName: {{ $name }}
{{- end }}
{{- include "prfaas.tokenizer.volume" . }}
{{- with include "prfaas.router.peersTokenSecret" . }}
- name: prfaas-router-peers-token
  secret:
    secretName: {{ . }}
    items:
      - key: token
        path: token
{{- end }}
{{- if gt (int .Values.router.workers) 1 }}
- name: prfaas-router-tmp
  emptyDir:
    medium: Memory
    sizeLimit: 64Mi
{{- end }}
{{- end }}

{{/*
The router as a sidecar container of an engine pod. Include it in your engine pod template's `containers`
and "prfaas.routerSidecar.volumes" in its `volumes`, with this chart as a dependency of yours:

    containers:
      - name: vllm
        ports: [{name: http, containerPort: 8000}]
      {{- include "prfaas.routerSidecar.container" . | nindent 6 }}
    volumes:
      {{- include "prfaas.routerSidecar.volumes" . | nindent 6 }}

Clients then call port `router` (sidecar.port) of any engine pod. The engine's own port must be named
"http": the operator addresses engines by that port, not the sidecar's.
*/}}
{{- define "prfaas.routerSidecar.container" -}}
- name: prfaas-router
  image: {{ include "prfaas.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
    - router
    - --wait-for-config
    - --config
    - $(PRFAAS_ROUTER_CONFIG)
    - --host
    - $(PRFAAS_ROUTER_HOST)
    - --port
    - $(PRFAAS_ROUTER_PORT)
    - --log-level
    - $(PRFAAS_ROUTER_LOG_LEVEL)
    - --workers
    - $(PRFAAS_ROUTER_WORKERS)
    # the other sidecars in front of the same PD cluster, which share their PD prefill books (empty: none)
    - --peers-dns
    - $(PRFAAS_ROUTER_PEERS_DNS)
    - --peers-token-file
    - $(PRFAAS_ROUTER_PEERS_TOKEN_FILE)
  envFrom:
    - configMapRef:
        name: {{ include "prfaas.router.settingsName" . }}
  env:
    - name: PRFAAS_ROUTER_PORT
      value: {{ .Values.sidecar.port | quote }}
    - name: PRFAAS_ROUTER_PEERS_DNS
      {{- if .Values.sidecar.replicaSync.enabled }}
      value: {{ printf "%s.%s.svc:%v" (include "prfaas.routerSidecar.peersService" .) .Release.Namespace .Values.sidecar.port | quote }}
      {{- else }}
      value: ""
      {{- end }}
  ports:
    - name: router
      containerPort: {{ .Values.sidecar.port }}
      protocol: TCP
  readinessProbe:
    httpGet:
      path: /health
      port: router
    periodSeconds: 5
  livenessProbe:
    httpGet:
      path: /health
      port: router
    periodSeconds: 10
    failureThreshold: 6
  volumeMounts:
    {{- include "prfaas.router.volumeMounts" . | nindent 4 }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  resources:
    {{- toYaml .Values.sidecar.resources | nindent 4 }}
{{- end }}

{{/* ---------------------------------------------------------------------------------------------------
Gateway (region A)
--------------------------------------------------------------------------------------------------- */}}

{{/* Where the gateway's token (token/) and TLS (tls/) Secrets are mounted: router_config.py GATEWAY_DIR. */}}
{{- define "prfaas.gateway.dir" -}}/var/run/prfaas/gateway{{- end }}

{{/* The ConfigMap the operator writes for a Managed PrefillCluster (never templated by this chart):
router_config.py build_gateway. */}}
{{- define "prfaas.gateway.configMapName" -}}
{{- printf "%s-gateway-config" (required "gateway.prefillCluster is required with gateway.enabled" .Values.gateway.prefillCluster) }}
{{- end }}

{{/* The gateway replicas' headless Service: <replica>.<this>.<namespace>.svc names each for the peers' loans. */}}
{{- define "prfaas.gateway.peersService" -}}
{{- printf "%s-gateway-peers" (include "prfaas.fullname" .) }}
{{- end }}

{{/* The router replicas' headless Service: each replica resolves it to its peers and shares its PD prefill books. */}}
{{- define "prfaas.router.peersService" -}}
{{- printf "%s-router-peers" (include "prfaas.fullname" .) }}
{{- end }}

{{/* The router sidecars' headless Service (sidecar.replicaSync): every pod of sidecar.replicaSync.podLabels. */}}
{{- define "prfaas.routerSidecar.peersService" -}}
{{- printf "%s-router-sidecar-peers" (include "prfaas.fullname" .) }}
{{- end }}

{{- define "prfaas.gateway.configDir" -}}/etc/prfaas/gateway{{- end }}
