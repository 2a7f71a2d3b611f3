#!/usr/bin/env bash
# hack/demo.sh — make demo: what a user does, on a local cluster built from this tree. It
# builds only what the demo uses, starts the cluster, installs pav, applies hello-world,
# provisions a volume and prints what a pod reads from it. Each step says what it runs and,
# once done, how long it took; a table of the steps closes the run.
#
# Usage: hack/demo.sh              (make demo; as root)
#
# What it builds (each part skipped when up to date):
#   hack/build-tools.sh kubernetes containerd etcd csi-provisioner
#                       the cluster's binaries, and external-provisioner for the drivers
#   hack/images/build.sh pause busybox csi-provisioner pav
#                       the images hello-world's drivers and pods run (the stock
#                       node-driver-registrar and livenessprobe come from ../shared/sidecars,
#                       which the cluster imports)
# and nothing else: the snapshot stack, kwok, rclone, csi-sanity, helm and the examples'
# images are built by the targets that use them (make tools, make images: e2e, bench-scale,
# conformance). hello-world has no snapshots, so pav is installed without the cluster's
# snapshot-controller (PAV_SNAPSHOT_CONTROLLER=0 for hack/install-local.sh).
#
# PAV_CLUSTER_DIR as for hack/cluster/up.sh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PAV_CLUSTER_DIR="${PAV_CLUSTER_DIR:-$ROOT/_output/cluster}"
KUBECTL=("$ROOT/_output/bin/kubectl" --kubeconfig "$PAV_CLUSTER_DIR/kubeconfig")
k() { "${KUBECTL[@]}" "$@"; }

T0=$SECONDS
done_steps=()
N=6
# step TITLE COMMAND...: runs COMMAND, saying what it starts and how long it took.
step() {
  local title="$1" start=$SECONDS; shift
  echo "demo: [$(( ${#done_steps[@]} + 1 ))/$N] $title: $*" >&2
  "$@"
  done_steps+=("$(printf '%6d s  %s' $((SECONDS - start)) "$title")")
  echo "demo: [${#done_steps[@]}/$N] $title: done in $((SECONDS - start)) s" >&2
}

provision_and_read() {
  k delete --ignore-not-found --wait -f "$ROOT/examples/hello-world/usage.yaml" >/dev/null
  k apply -f "$ROOT/examples/hello-world/usage.yaml"
  k wait --for=jsonpath='{.status.phase}'=Bound pvc/hello-claim --timeout=120s
  k wait --for=jsonpath='{.status.phase}'=Succeeded pod/hello-reader --timeout=120s
}

step "Debian packages" "$ROOT/hack/install-deps.sh"
step "the cluster's binaries" "$ROOT/hack/build-tools.sh" kubernetes containerd etcd csi-provisioner
# Built before the cluster starts: hack/cluster/up.sh imports every archive it finds.
step "images" "$ROOT/hack/images/build.sh" pause busybox csi-provisioner registrar pav
step "cluster up" "$ROOT/hack/cluster/up.sh"
step "pav and hello-world installed" env PAV_SNAPSHOT_CONTROLLER=0 "$ROOT/hack/install-local.sh" "$ROOT/examples/hello-world/provisioner.yaml"
step "a volume provisioned and read" provision_and_read

echo "--- the hello-reader pod read from its hello-world volume:"
k logs hello-reader
echo "--- steps:"
printf '%s\n' "${done_steps[@]}"
printf '%6d s  in all\n' $((SECONDS - T0))
echo "--- try: export KUBECONFIG=$PAV_CLUSTER_DIR/kubeconfig; kubectl get pav,pv,pvc; make cluster-down when done"
