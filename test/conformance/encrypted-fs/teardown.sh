#!/usr/bin/env bash
# After the encrypted-fs testdriver ran (hack/conformance.sh): the pool setup.sh made.
# hack/conformance.sh has waited for the encrypted volumes' PVs to go (their deletion pods need
# the underlying claim); deleting the namespace then deletes the underlying claims, and
# loop-block their volumes.
set -euo pipefail
k() { "${KUBECTL:-kubectl}" "$@"; }
k delete --ignore-not-found --wait --timeout=180s namespace pav-conformance-encrypted-fs >/dev/null
k delete --ignore-not-found storageclass pav-conformance-encrypted-fs-underlying >/dev/null
