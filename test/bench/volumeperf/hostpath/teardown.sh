#!/usr/bin/env bash
# After the host-path testdriver ran (hack/conformance.sh, once the driver's PVs are gone):
# uninstall csi-driver-host-path with the peer's own script.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." && pwd)"
PEERS="${PAV_PEERS_DIR:-$ROOT/../shared/peers}"
CL="${PAV_CLUSTER_DIR:-$ROOT/_output/cluster}" BIN="${PAV_BIN_DIR:-$ROOT/_output/bin}" \
  "$PEERS/hostpath/uninstall.sh" "${KUBECTL:-kubectl}"
