#!/usr/bin/env bash
# hack/update-snapshot-crds.sh — vendor external-snapshotter's CRDs into
# test/e2e/install/snapshot-controller: the three VolumeSnapshot and the three VolumeGroupSnapshot
# CRDs of client/v8's config/crd, unchanged, at the version hack/tools/snapshotter pins (the one
# the local cluster's snapshot-controller and csi-snapshotter are built from), fetched by the go
# command from the module cache or proxy.
#
# Usage: hack/update-snapshot-crds.sh [--check]
#   --check   change nothing; exit 1, naming the files, when a vendored CRD differs
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/test/e2e/install/snapshot-controller"
MOD=github.com/kubernetes-csi/external-snapshotter/client/v8
CRDS=(
  snapshot.storage.k8s.io_volumesnapshotclasses.yaml
  snapshot.storage.k8s.io_volumesnapshotcontents.yaml
  snapshot.storage.k8s.io_volumesnapshots.yaml
  groupsnapshot.storage.k8s.io_volumegroupsnapshotclasses.yaml
  groupsnapshot.storage.k8s.io_volumegroupsnapshotcontents.yaml
  groupsnapshot.storage.k8s.io_volumegroupsnapshots.yaml
)

check=false
[ "${1:-}" != --check ] || check=true

cd "$ROOT/hack/tools/snapshotter"
version=$(go list -m -f '{{.Version}}' "$MOD")
dir=$(GOFLAGS=-mod=mod go mod download -json "$MOD@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -d "$dir/config/crd" ] || { echo "update-snapshot-crds: no config/crd in $MOD@$version ($dir)" >&2; exit 1; }

stale=()
for f in "${CRDS[@]}"; do
  if $check; then
    cmp -s "$dir/config/crd/$f" "$DEST/$f" || stale+=("$f")
  else
    install -m 0644 "$dir/config/crd/$f" "$DEST/$f"
  fi
done
if [ "${#stale[@]}" -gt 0 ]; then
  echo "update-snapshot-crds: these differ from $MOD@$version (run hack/update-snapshot-crds.sh): ${stale[*]}" >&2
  exit 1
fi
$check || echo "update-snapshot-crds: ${#CRDS[@]} CRDs of $MOD@$version in ${DEST#"$ROOT"/}"
