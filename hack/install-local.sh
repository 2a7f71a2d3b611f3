#!/usr/bin/env bash
# hack/install-local.sh — install pav on the local cluster as a user would, then apply
# PavProvisioners and wait until each is Ready (make install, make e2e-setup, make demo).
#
# Usage: hack/install-local.sh [PROVISIONER.yaml...]
#
#   kubectl apply -k test/e2e/install/snapshot-controller
#   kubectl apply -k test/e2e/install/snapshot-metadata
#                                         the cluster's VolumeSnapshot and VolumeGroupSnapshot
#                                         CRDs and snapshot-controller, and the
#                                         SnapshotMetadataService CRD (changed block tracking;
#                                         a distribution's part, not pav's); skipped with
#                                         PAV_SNAPSHOT_CONTROLLER=0 (make demo: hello-world has
#                                         no snapshots, and its image is not built)
#   kubectl apply -k test/e2e/install     deploy/ with the local images (the only change)
#   kubectl apply -f PROVISIONER.yaml     each provisioner alone: the manager does the rest
#
# The local images keep their tag (pav.local/*:dev) when hack/images/build.sh rebuilds them,
# so the manager and every provisioner's drivers are restarted onto the fresh image.
# Objects left by a deployment without the manager (the deploy/provisioner component, as
# older checkouts deployed the e2e provisioners) are removed first: the manager never takes
# over objects it did not make.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CLUSTER_DIR="${PAV_CLUSTER_DIR:-$ROOT/_output/cluster}"
KUBECTL=("${KUBECTL:-$ROOT/_output/bin/kubectl}" --kubeconfig "$CLUSTER_DIR/kubeconfig")
k() { "${KUBECTL[@]}" "$@"; }
log() { echo "install-local: $*" >&2; }

# Workloads and CSIDrivers of pav that no PavProvisioner owns were deployed without the
# manager (custom-columns prints <none> for a missing owner).
unowned() { # KIND [-n NS]
  k get "$@" -l app.kubernetes.io/name=pav --no-headers \
    -o custom-columns=NAME:.metadata.name,OWNER:.metadata.ownerReferences[0].kind 2>/dev/null |
    awk '$2 == "<none>" {print $1}'
}
for kind in statefulsets daemonsets; do
  for o in $(unowned "$kind" -n pav); do
    log "removing $kind/$o (deployed without the manager)"
    k -n pav delete "$kind" "$o" --wait >/dev/null
  done
done
for o in $(unowned csidrivers); do
  log "removing csidriver/$o (deployed without the manager)"
  k delete csidriver "$o" --wait >/dev/null
done

snapshots="${PAV_SNAPSHOT_CONTROLLER:-1}"
if [ "$snapshots" != 0 ]; then
  log "kubectl apply -k test/e2e/install/snapshot-controller"
  k apply -k "$ROOT/test/e2e/install/snapshot-controller" >/dev/null
  k wait --for condition=established --timeout=60s crd/volumesnapshotclasses.snapshot.storage.k8s.io \
    crd/volumesnapshotcontents.snapshot.storage.k8s.io crd/volumesnapshots.snapshot.storage.k8s.io \
    crd/volumegroupsnapshotclasses.groupsnapshot.storage.k8s.io \
    crd/volumegroupsnapshotcontents.groupsnapshot.storage.k8s.io \
    crd/volumegroupsnapshots.groupsnapshot.storage.k8s.io >/dev/null
  # Onto a freshly built image (same tag); waited for below, with the manager.
  k -n kube-system rollout restart deployment/snapshot-controller >/dev/null
  log "kubectl apply -k test/e2e/install/snapshot-metadata"
  k apply -k "$ROOT/test/e2e/install/snapshot-metadata" >/dev/null
  k wait --for condition=established --timeout=60s crd/snapshotmetadataservices.cbt.storage.k8s.io >/dev/null
fi

log "kubectl apply -k test/e2e/install"
k apply -k "$ROOT/test/e2e/install" >/dev/null
k wait --for condition=established --timeout=60s crd/pavprovisioners.pav.albertofaria.github.io crd/pavvolumes.pav.albertofaria.github.io >/dev/null
k -n pav rollout restart deployment/pav-manager >/dev/null
k -n pav rollout status deployment/pav-manager --timeout=180s >/dev/null
if [ "$snapshots" != 0 ]; then
  k -n kube-system rollout status deployment/snapshot-controller --timeout=120s >/dev/null
fi

names=()
for f in "$@"; do
  log "kubectl apply -f $f"
  k apply -f "$f" >/dev/null
  names+=("$(k get -f "$f" -o jsonpath='{.metadata.name}')")
done
# Drivers that already ran, restarted onto the fresh image.
for r in $(k -n pav get statefulsets,daemonsets -l app.kubernetes.io/name=pav -o name); do
  k -n pav rollout restart "$r" >/dev/null
done
for n in "${names[@]}"; do
  for r in "statefulset/pav-$n-controller" "daemonset/pav-$n-node"; do
    k -n pav wait --for=create "$r" --timeout=60s >/dev/null
    k -n pav rollout status "$r" --timeout=180s >/dev/null
  done
  k wait --for=condition=Ready "pavprovisioner/$n" --timeout=120s >/dev/null
  log "PavProvisioner $n is Ready"
done
