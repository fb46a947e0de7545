{{/*
The chart label (name-version), as Helm charts conventionally stamp it.
*/}}
{{- define "prfaas-crds.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/*
What is inserted after a CRD's top-level "metadata:" line: annotations (resource policy + user's) and the
release's labels. The generated CRDs carry labels but no annotations, so the inserted annotations block is
the only one; the labels are merged by inserting lines under the existing "labels:" key.
*/}}
{{- define "prfaas-crds.annotations" -}}
{{- $ann := dict -}}
{{- if .Values.keep -}}{{- $_ := set $ann "helm.sh/resource-policy" "keep" -}}{{- end -}}
{{- range $k, $v := .Values.annotations -}}{{- $_ := set $ann $k $v -}}{{- end -}}
{{- if $ann }}
  annotations:
{{- range $k, $v := $ann }}
    {{ $k }}: {{ $v | quote }}
{{- end }}
{{- end }}
{{- end }}

{{- define "prfaas-crds.labels" -}}
helm.sh/chart: {{ include "prfaas-crds.chart" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- range $k, $v := .Values.labels }}
{{ $k }}: {{ $v | quote }}
{{- end }}
{{- end }}
