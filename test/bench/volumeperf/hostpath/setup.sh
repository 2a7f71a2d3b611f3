#!/usr/bin/env bash
# Before the host-path testdriver runs (hack/conformance.sh): install csi-driver-host-path with
# the peer's own script (PAV_PEERS_DIR, default ../shared/peers beside the repository).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." && pwd)"
PEERS="${PAV_PEERS_DIR:-$ROOT/../shared/peers}"
[ -x "$PEERS/hostpath/install.sh" ] || { echo "no $PEERS/hostpath/install.sh: set PAV_PEERS_DIR" >&2; exit 1; }
CL="${PAV_CLUSTER_DIR:-$ROOT/_output/cluster}" BIN="${PAV_BIN_DIR:-$ROOT/_output/bin}" \
  "$PEERS/hostpath/install.sh" "${KUBECTL:-kubectl}"
