package helmchart

// The chart's own files, written here rather than in charts/pav so that the
// whole chart is generated: a hand edit there would be lost, and the test says so.

// chartYAML takes the chart's version and pav's (the image tag).
const chartYAML = generated + `apiVersion: v2
name: pav
description: "Pods as Volumes: CSI drivers whose volume operations run pods. The install of deploy/ (the pav namespace, the CRDs, RBAC and the pav manager), with the manager's settings as values."
type: application
version: %s
appVersion: %q
kubeVersion: ">=1.30.0-0"
home: https://github.com/pods-as-volumes/pav
sources:
- https://github.com/pods-as-volumes/pav
keywords:
- csi
- storage
- volumes
`

const helpers = `{{/*
Generated from deploy/ by ` + "`make manifests`" + ` (go generate ./internal/helmchart): do not edit.

pav.config is the manager's config.yaml (ConfigMap pav-manager): every value but the chart's
own (namespace), that is the keys of deploy/manager/config.yaml. The manager reads it strictly:
a misspelt key stops it with an error that names the key.
*/}}
{{- define "pav.config" -}}
{{- toYaml (omit .Values "namespace") }}
{{- end }}
`

const notes = `pav {{ .Chart.AppVersion }} is installed; the pav manager runs in namespace {{ .Values.namespace }}.
Every PavProvisioner you apply gets its own CSI driver. From pav's repository, for example:

  kubectl apply -f examples/hello-world/provisioner.yaml
  kubectl get pav

Uninstall: kubectl delete pav --all (it returns once no volume needs a provisioner), then
helm uninstall {{ .Release.Name }} --namespace {{ .Release.Namespace }}.
`

const namespaceHead = `# pav's namespace, labelled for the node plugin (privileged: it mounts). Helm needs a
# release's namespace before it installs anything: a release installed into this namespace
# (helm install --namespace` + " {{ .Values.namespace }}" + `) finds it made already, and the chart leaves it alone.
{{- if ne .Release.Namespace .Values.namespace }}
`

const valuesHead = `# Values of the pav chart (charts/pav), generated from deploy/manager/config.yaml by
# ` + "`make manifests`" + `: edit that file, not this one. Set them as for any chart
# (helm install pav charts/pav --set logLevel=5, or -f my-values.yaml).

# Where pav runs: the manager, every provisioner's drivers and, unless a template says
# otherwise, the pods of their operations. The chart makes this namespace (labelled
# pod-security.kubernetes.io/enforce: privileged, for the node plugin) unless the release is
# installed into it (helm install --namespace), which must then exist.
namespace: pav

# Every other value is a setting of the pav manager, deploy/manager/config.yaml key for key:
# the chart writes them into the manager's ConfigMap pav-manager (config.yaml), and a change
# rolls the manager (helm upgrade), which then rolls the drivers. A key the manager does not
# know stops it with an error that names the key. images.pav is also the manager's own image.

`
