#!/usr/bin/env bash
# After the object-bucket testdriver ran (hack/conformance.sh): the StorageClass and the
# store that setup.sh made. The buckets' PVs go first: their deletion pods need the store and
# its Secret (an interrupted run leaves claims whose deletion is still under way).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
k() { "${KUBECTL:-kubectl}" "$@"; }
pvs() { k get pv -o jsonpath='{range .items[?(@.spec.csi.driver=="object-bucket")]}{.metadata.name}{"\n"}{end}'; }
for _ in $(seq 180); do [ -z "$(pvs)" ] && break; sleep 1; done
[ -z "$(pvs)" ] || echo "object-bucket teardown: PVs still there after 3 minutes: $(pvs | tr '\n' ' ')" >&2
k delete --ignore-not-found storageclass pav-conformance-object-bucket >/dev/null
k delete --ignore-not-found --wait --timeout=180s -f "$ROOT/examples/object-bucket/store.yaml" >/dev/null
