{{/*
fullname: the release's name, with "vivarium" unless it has it already,
cut so that a node pod's name (<fullname>-node-<5 characters>) stays a
DNS label: node names are pod names, and sandboxes' ids carry them.
*/}}
{{- define "vivarium.fullname" -}}
{{- $name := .Release.Name -}}
{{- if not (contains "vivarium" $name) -}}
{{- $name = printf "%s-vivarium" $name -}}
{{- end -}}
{{- $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "vivarium.nodeName" -}}{{ include "vivarium.fullname" . }}-node{{- end -}}
{{- define "vivarium.gatewayName" -}}{{ include "vivarium.fullname" . }}-gateway{{- end -}}

{{/* The Secret holding the cluster token, under "token". */}}
{{- define "vivarium.tokenSecret" -}}
{{- .Values.clusterToken.existingSecret | default (printf "%s-cluster-token" (include "vivarium.fullname" .)) -}}
{{- end -}}

{{/*
Labels. app.kubernetes.io/name is "vivarium" on every object, as the
binary sets it on its Leases and key Secrets: one release per namespace.
*/}}
{{- define "vivarium.labels" -}}
app.kubernetes.io/name: vivarium
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "vivarium.selector" -}}
app.kubernetes.io/name: vivarium
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "vivarium.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/*
A value as a flag takes it: numbers from values files are floats to
Helm, which would print 1000000 as 1e+06; whole ones are printed whole.
*/}}
{{- define "vivarium.flagValue" -}}
{{- if and (kindIs "float64" .) (eq (float64 (int64 .)) .) -}}
{{- int64 . -}}
{{- else -}}
{{- . -}}
{{- end -}}
{{- end -}}

{{/* Checks of values that would render a chart that cannot work. */}}
{{- define "vivarium.validate" -}}
{{- if not (has .Values.backend (list "native" "gvisor")) -}}
{{- fail (printf "backend must be native or gvisor, not %q" .Values.backend) -}}
{{- end -}}
{{- if not (has .Values.node.kind (list "DaemonSet" "StatefulSet")) -}}
{{- fail (printf "node.kind must be DaemonSet or StatefulSet, not %q" .Values.node.kind) -}}
{{- end -}}
{{- if not (has .Values.node.storage.type (list "hostPath" "pvc" "emptyDir")) -}}
{{- fail (printf "node.storage.type must be hostPath, pvc or emptyDir, not %q" .Values.node.storage.type) -}}
{{- end -}}
{{- if and (eq .Values.node.storage.type "pvc") (ne .Values.node.kind "StatefulSet") -}}
{{- fail "node.storage.type pvc needs node.kind StatefulSet (a claim per node; a DaemonSet's pods would share one)" -}}
{{- end -}}
{{- range .Values.keys -}}
{{- if not (regexMatch "^key_[0-9a-f]{12}$" (.id | toString)) -}}
{{- fail (printf "keys: id %q must be key_ and 12 hex digits" (.id | toString)) -}}
{{- end -}}
{{- if not (regexMatch "^[0-9a-f]{64}$" (.sha256 | toString)) -}}
{{- fail (printf "keys: %s: sha256 must be the token's sha256, 64 hex digits" .id) -}}
{{- end -}}
{{- end -}}
{{- end -}}
