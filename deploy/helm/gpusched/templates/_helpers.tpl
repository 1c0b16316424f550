{{- define "gpusched.labels" -}}
app.kubernetes.io/part-of: gpusched
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
{{- define "gpusched.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/*
How the scheduler's /metrics, /debug and probes are served: HTTPS whenever
callers send bearer tokens (httpAuth delegated) or a certificate is mounted.
*/}}
{{- define "gpusched.schedulerScheme" -}}
{{- if or (eq .Values.scheduler.httpAuth "delegated") .Values.scheduler.tls.secretName -}}
https
{{- else -}}
http
{{- end -}}
{{- end }}
