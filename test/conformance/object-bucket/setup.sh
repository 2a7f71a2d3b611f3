#!/usr/bin/env bash
# Before the object-bucket testdriver runs (hack/conformance.sh): the example's in-cluster S3
# store (examples/object-bucket/store.yaml), the StorageClass that names it, and the Secret
# object-bucket-inline in pav's namespace that names it for inline ephemeral volumes. The
# local cluster has no DNS, so the endpoint is the store Service's cluster IP; that is why
# the class and the Secret are made here instead of read from a file.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
k() { "${KUBECTL:-kubectl}" "$@"; }
k apply -f "$ROOT/examples/object-bucket/store.yaml" >/dev/null
k -n pav-object-store rollout status deployment/object-store --timeout=180s >/dev/null
ip=$(k -n pav-object-store get service object-store -o jsonpath='{.spec.clusterIP}')
k apply -f - >/dev/null <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: pav-conformance-object-bucket
provisioner: object-bucket
parameters:
  endpoint: http://$ip:9000
  secretName: object-store-credentials
  secretNamespace: pav-object-store
YAML
# Inline ephemeral volumes use the store the administrator names in pav's namespace.
user=$(k -n pav-object-store get secret object-store-credentials -o jsonpath='{.data.accessKeyId}' | base64 -d)
key=$(k -n pav-object-store get secret object-store-credentials -o jsonpath='{.data.secretAccessKey}' | base64 -d)
k -n pav create secret generic object-bucket-inline --from-literal=endpoint="http://$ip:9000" \
  --from-literal=accessKeyId="$user" --from-literal=secretAccessKey="$key" --dry-run=client -o yaml | k apply -f - >/dev/null
