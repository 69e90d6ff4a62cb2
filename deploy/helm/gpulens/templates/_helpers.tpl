{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "gpulens.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-qualified name; the release name alone when it already contains the chart name. */}}
{{- define "gpulens.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpulens.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "gpulens.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpulens
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "gpulens.exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpulens.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: exporter
{{- end -}}

{{- define "gpulens.dashboard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpulens.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: dashboard
{{- end -}}

{{- define "gpulens.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gpulens.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "gpulens.priorityClassName" -}}
{{- if .Values.exporter.priorityClassName -}}
{{- .Values.exporter.priorityClassName -}}
{{- else if .Values.priorityClass.create -}}
{{- printf "%s-node-critical" (include "gpulens.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "gpulens.webConfigSecretName" -}}
{{- default (printf "%s-web-config" (include "gpulens.fullname" .)) .Values.webConfig.existingSecret -}}
{{- end -}}

{{/* "true" when the exporter runs as exporter.nonRootUser, "" when it runs as uid 0.
runAsNonRoot "auto": uid 0 only while it opens the kubelet's PodResources socket (root-owned, not
writable by others: connect() needs write permission); true / false force it. */}}
{{- define "gpulens.exporter.nonRoot" -}}
{{- $v := .Values.exporter.runAsNonRoot -}}
{{- if eq (toString $v) "auto" -}}
{{- if not .Values.exporter.podResources.enabled }}true{{ end -}}
{{- else if $v }}true{{ end -}}
{{- end -}}

{{/* The lowest Pod Security Standard that admits every pod these values render (the dashboard
is always `restricted`): `privileged` for a hostPath (the PodResources socket) or hostPID, which
`baseline` forbids; `baseline` for uid 0, which `restricted` forbids; `restricted` otherwise (no
capabilities, no privilege escalation, seccomp RuntimeDefault and only emptyDir, Secret and
projected volumes in every case). */}}
{{- define "gpulens.podSecurityLevel" -}}
{{- if or .Values.exporter.podResources.enabled .Values.exporter.hostPID -}}
privileged
{{- else if not (include "gpulens.exporter.nonRoot" .) -}}
baseline
{{- else -}}
restricted
{{- end -}}
{{- end -}}

{{/*
One per-model latency target flag of the dashboard from a map of served model -> duration:
"--FLAG=MODEL=DURATION,..." (models in name order), nothing for an empty map. Called with
(dict "flag" "itl-target" "targets" .Values.dashboard.servingItlTargets), and likewise for TTFT.
*/}}
{{- define "gpulens.dashboard.latencyTargets" -}}
{{- with .targets }}
{{- $targets := list }}
{{- range $model, $target := . }}
{{- $targets = append $targets (printf "%s=%v" $model $target) }}
{{- end }}
- {{ printf "--%s=%s" $.flag (join "," $targets) | quote }}
{{- end }}
{{- end }}
