#!/usr/bin/env bash
# After the encrypted-fs testdriver ran (hack/conformance.sh): the pool setup.sh made. The
# encrypted volumes' PVs go first (their deletion pods need the underlying claim; an
# interrupted run leaves claims whose deletion is still under way); deleting the namespace
# then deletes the underlying claim, and loop-block its volume.
set -euo pipefail
k() { "${KUBECTL:-kubectl}" "$@"; }
pvs() { k get pv -o jsonpath='{range .items[?(@.spec.csi.driver=="encrypted-fs")]}{.metadata.name}{"\n"}{end}'; }
for _ in $(seq 180); do [ -z "$(pvs)" ] && break; sleep 1; done
[ -z "$(pvs)" ] || echo "encrypted-fs teardown: PVs still there after 3 minutes: $(pvs | tr '\n' ' ')" >&2
k delete --ignore-not-found --wait --timeout=180s namespace pav-conformance-encrypted-fs >/dev/null
k delete --ignore-not-found storageclass pav-conformance-encrypted-fs-underlying >/dev/null
