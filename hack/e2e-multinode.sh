#!/usr/bin/env bash
# hack/e2e-multinode.sh — the e2e suite's cross-node tests (test/e2e/multinode_test.go) on a
# cluster of 3 nodes (make e2e-multinode; make e2e runs it after the suite on a 1-node cluster).
#
# On a cluster of fewer than 3 nodes it boots the missing extra nodes (hack/cluster/node.sh:
# they import the current image archives), waits until every PavProvisioner's node plugin
# (DaemonSet) is available on them, runs the tests with PAV_E2E_NODES=3 (so that a missing node
# fails them instead of skipping them), and removes the nodes it booted, whatever happens:
# the cluster is left with the nodes it had. On a cluster of 3 nodes or more it only runs the
# tests. Env: PAV_CLUSTER_DIR as for hack/cluster/up.sh; GO (default go).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/cluster/lib.sh"

TESTS='^(TestVolumeMovesBetweenNodes|TestNodeLocalTopologyChoice|TestReadWriteManyOnThreeNodes|TestObjectBucketAcrossNodes|TestNodeDown|TestDrain)$'
T0=$SECONDS
NODE1="$(node1_name)"
booted=()
cleanup() {
  local n
  for n in ${booted[@]+"${booted[@]}"}; do "$ROOT/hack/cluster/node.sh" remove "$n" || true; done
}
trap cleanup EXIT

# The missing nodes boot at once (each mostly imports the image archives into its containerd).
pids=()
for n in 2 3; do
  name="$NODE1-$n"
  if ! kubectl_admin get node "$name" >/dev/null 2>&1 || [ ! -S "$D/nodes/$name/run/containerd/containerd.sock" ]; then
    booted+=("$name")
    # A boot that fails (its report above says why) is tried once more from scratch: the
    # tests are about pav across nodes, not about this machine's node emulation.
    { "$ROOT/hack/cluster/node.sh" start "$name" ||
      { log "e2e-multinode: node $name did not boot; removing it and booting it once more"
        "$ROOT/hack/cluster/node.sh" remove "$name" && "$ROOT/hack/cluster/node.sh" start "$name"; }; } & pids+=($!)
  fi
done
# Every boot ends before a failed one stops the script (cleanup must not remove a node that is
# still starting).
failed=0
for p in ${pids[@]+"${pids[@]}"}; do wait "$p" || failed=1; done
[ "$failed" = 0 ] || die "e2e-multinode: booting ${booted[*]} failed (see above)"
if [ ${#booted[@]} -gt 0 ]; then
  log "e2e-multinode: booted ${booted[*]} in $((SECONDS - T0)) s; waiting for every PavProvisioner's node plugins"
  # Every provisioner's node plugin (its DaemonSet's pod) available on the new nodes too.
  for ds in $(kubectl_admin get daemonsets -A -l app.kubernetes.io/managed-by=pav-manager,app.kubernetes.io/component=node -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name}{" "}{end}'); do
    kubectl_admin -n "${ds%%/*}" rollout status "daemonset/${ds#*/}" --timeout=300s >/dev/null
  done
fi
start=$SECONDS
KUBECONFIG="$KUBECONFIG_ADMIN" PAV_E2E_NODES=3 PAV_E2E_PARALLEL=1 PAV_CLUSTER_DIR="$D" "${GO:-go}" test -tags e2e -count=1 \
  -timeout 30m -v -run "$TESTS" "$ROOT/test/e2e/"
log "e2e-multinode: tests in $((SECONDS - start)) s, $((SECONDS - T0)) s in all"
