#!/usr/bin/env bash
# After the object-bucket testdriver ran (hack/conformance.sh): the StorageClass, the Secret
# and the store that setup.sh made. hack/conformance.sh has waited for the buckets' PVs to
# go: their deletion pods need the store and its Secret (inline volumes went with their pods).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
k() { "${KUBECTL:-kubectl}" "$@"; }
k delete --ignore-not-found storageclass pav-conformance-object-bucket >/dev/null
k -n pav delete --ignore-not-found secret object-bucket-inline >/dev/null
k delete --ignore-not-found --wait --timeout=180s -f "$ROOT/examples/object-bucket/store.yaml" >/dev/null
