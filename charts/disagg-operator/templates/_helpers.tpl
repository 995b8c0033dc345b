{{/* The chart name, cut to the 63 characters a label value allows. */}}
{{- define "disagg-operator.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: <release> when it already contains the chart name. */}}
{{- define "disagg-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "disagg-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "disagg-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "disagg-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "disagg-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: disagg
{{- end }}

{{- define "disagg-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "disagg-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Whether to render a ServiceMonitor: asked for, or auto and the API is there. */}}
{{- define "disagg-operator.serviceMonitor" -}}
{{- $want := .Values.metrics.serviceMonitor.enabled }}
{{- if eq (toString $want) "auto" }}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor" }}true{{ end }}
{{- else if $want }}true{{ end }}
{{- end }}

{{/*
Every rule the operator uses, and why. e2e/test_install.py removes them one at a time
and shows that each removal breaks something.
*/}}
{{- define "disagg-operator.rules" -}}
# Read models (watch + resync) and write only their status subresource.
- apiGroups: ["disagg.dev"]
  resources: ["disaggregatedmodels"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["disagg.dev"]
  resources: ["disaggregatedmodels/status"]
  verbs: ["patch"]
# Children: server-side apply (patch; create when the object is new), watch for drift,
# delete what the spec no longer wants. get on deployments: the autoscaler reads each pool's
# current replicas every evaluation.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services", "serviceaccounts"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# External autoscaling (spec.autoscaling.mode: external): HPAs, or KEDA ScaledObjects when
# KEDA is installed (listing them is skipped when its API is absent).
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["keda.sh"]
  resources: ["scaledobjects"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# spec.gateway: the model's HTTPRoute to its router, when the Gateway API is installed
# (listing them is skipped when its API is absent). Its status is read, never written.
- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["httproutes"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# spec.router.kind inferencePool: the model's InferencePool; get/list/watch on it and on
# InferenceObjectives are also what the endpoint picker's Role grants, and Kubernetes only
# lets the operator grant permissions it holds itself.
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["inference.networking.x-k8s.io"]
  resources: ["inferenceobjectives"]
  verbs: ["get", "list", "watch"]
# Pods: status (ready counts, Unschedulable). get/list/watch are also what the router Role
# grants, and Kubernetes only lets the operator grant permissions it holds itself. patch: the
# autoscaler sets controller.kubernetes.io/pod-deletion-cost on the least-loaded pods before a
# scale-down, so the ReplicaSet removes those first.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "patch"]
# Events about each model (kubectl describe dm).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}
