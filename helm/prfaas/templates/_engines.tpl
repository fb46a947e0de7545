{{/* The pod template of one engine workload (StatefulSet or LeaderWorkerSet), from the rendered launch:
(dict "root" $ "e" .Values.engines "w" workload "labels" podLabels "launch" launch "ports" ports). */}}
{{- define "prfaas.enginePod" -}}
metadata:
  labels:
    app.kubernetes.io/name: {{ include "prfaas.name" .root }}
    app.kubernetes.io/instance: {{ .root.Release.Name }}
    {{- toYaml .labels | nindent 4 }}
spec:
  automountServiceAccountToken: false
  {{- with .root.Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .e.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .e.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  containers:
    - name: engine
      image: "{{ .e.image.repository }}:{{ .e.image.tag }}"
      imagePullPolicy: {{ .e.image.pullPolicy }}
      command:
        {{- toYaml .launch.command | nindent 8 }}
      args:
        {{- toYaml .launch.args | nindent 8 }}
      env:
        {{- toYaml .launch.env | nindent 8 }}
      ports:
        - name: http
          containerPort: {{ .ports.http }}
          protocol: TCP
        - name: kv-side
          containerPort: {{ .ports.sideChannel }}
          protocol: TCP
        {{- if .ports.kvEvents }}
        - name: kv-events
          containerPort: {{ .ports.kvEvents }}
          protocol: TCP
        {{- end }}
      readinessProbe:
        httpGet:
          path: /health
          port: http
        periodSeconds: 10
      {{- with .w.resources }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .e.volumeMounts }}
      volumeMounts:
        {{- toYaml . | nindent 8 }}
      {{- end }}
  {{- with .e.volumes }}
  volumes:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
