{{/*
Generated from deploy/ by `make manifests` (go generate ./internal/helmchart): do not edit.

pav.config is the manager's config.yaml (ConfigMap pav-manager): every value but the chart's
own (namespace), that is the keys of deploy/manager/config.yaml. The manager reads it strictly:
a misspelt key stops it with an error that names the key.
*/}}
{{- define "pav.config" -}}
{{- toYaml (omit .Values "namespace") }}
{{- end }}
