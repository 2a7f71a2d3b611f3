#!/usr/bin/env bash
# hack/conformance.sh — run Kubernetes' own External Storage e2e tests against pav's
# provisioners on the local cluster (make conformance; make e2e runs a smoke subset).
#
# Usage: hack/conformance.sh [DRIVER...]     (default: every test/conformance/*/testdriver.yaml)
#
# A DRIVER is a folder of test/conformance, or any folder (a path) that holds a testdriver.yaml
# (make bench-volumeperf's, in test/bench/volumeperf). The driver is the one its DriverInfo.Name
# names. It is a PavProvisioner deployed by make e2e-setup, or whatever the folder's setup.sh
# installs (a peer of ../shared/peers, for instance): after setup.sh, its CSIDriver must exist.
#
# Needs the cluster up with pav and the provisioners deployed (make e2e-setup). Builds what
# only this needs, once: e2e.test, ginkgo and agnhost (hack/build-tools.sh e2e), and the
# suite's images (hack/images/build.sh --import e2e-*), which test/conformance/repo-list.yaml
# names through KUBE_TEST_REPO_LIST (the volume populator's two images keep their upstream
# names: test-only stand-ins, test/hello-populator and test/volume-data-source-validator).
# Then one ginkgo run over every driver's specs
# ("External Storage [Driver: NAME]"), in parallel, writes to _output/conformance/:
#   report.json, junit.xml   Ginkgo's reports (every spec, with its failure or skip message)
#   e2e.log                  the suite's output
#   summary.md               per driver: passed/failed/skipped, every failure, every skip
#                            grouped by why (test/conformance/summary)
# and prints one line per driver and a last line `conformance: N passed, N failed, N skipped`.
# Exits non-zero when a spec failed.
#
# Settings (environment):
#   CONFORMANCE_FOCUS   a regular expression the specs must also match (the smoke subset)
#   CONFORMANCE_SKIP    more specs to leave out, as REGEXP=REASON lines (the summary names
#                       the reason of every spec left out). Always left out (LEFT_OUT below):
#                       [Disruptive] and the features this cluster lacks, each with its reason
#   CONFORMANCE_PROCS   parallel ginkgo processes (default 4: the specs mostly wait on pods)
#   CONFORMANCE_TIMEOUT the whole run's limit (default 3h)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${PAV_BIN_DIR:-$ROOT/_output/bin}"
CLUSTER_DIR="${PAV_CLUSTER_DIR:-$ROOT/_output/cluster}"
OUT="${CONFORMANCE_OUT:-$ROOT/_output/conformance}"
KUBECONFIG="${KUBECONFIG:-$CLUSTER_DIR/kubeconfig}"
FOCUS="${CONFORMANCE_FOCUS:-}"
# What the run leaves out, REGEXP=REASON (split at the first "="): a reason starting
# "feature absent: " counts as such in the summary. Nothing is left out for failing: a failing
# spec is a product bug.
LEFT_OUT=(
  '\[Disruptive\]=disruptive: they restart the kubelet or kill the node'"'"'s processes, which pav'"'"'s own fault tests (make e2e) do to pav'
  '\[Feature:Windows\]=feature absent: no Windows nodes'
  '\[Feature:SELinux\]=feature absent: the node'"'"'s kernel runs no SELinux'
)
# Growing a mounted ext4 (resize2fs online: EXT4_IOC_RESIZE_FS) takes CAP_SYS_RESOURCE, which
# no process on a node without it in its bounding set has, privileged containers included.
capbnd=$(awk '/^CapBnd:/ { print $2 }' /proc/self/status)
if (( ((16#$capbnd) >> 24 & 1) == 0 )); then
  online='feature absent: growing a mounted ext4 takes CAP_SYS_RESOURCE, which this node'"'"'s root lacks (loop-block'"'"'s Block volumes grow online; its ext4 grows when next staged)'
  LEFT_OUT+=(
    '\[Driver: loop-block\].*\(default fs\)\(allowExpansion\).*should resize volume when PVC is edited while pod is using it='"$online"
    '\[Driver: loop-block\].*Generic Ephemeral-volume \(default fs\).*should support expansion of pvcs created for ephemeral pvcs='"$online"
  )
fi
# The volumegroupsnapshottable spec restores every member of a group into one pod. loop-block's
# volumes are node-local and a StatefulSet's pods spread over the nodes, so on several nodes its
# members live on different nodes, each restore on its member's node, and no node can run that
# pod. (pav-e2e, whose snapshots every node sees, runs the spec on several nodes; loop-block's
# group snapshots are proven there by TestGroupSnapshotRestoresEveryMember, each member
# restored on its own node.)
if [ -f "$KUBECONFIG" ] && [ "$("$BIN/kubectl" --kubeconfig "$KUBECONFIG" get nodes --no-headers 2>/dev/null | wc -l)" -gt 1 ]; then
  LEFT_OUT+=('\[Driver: loop-block\].*volumegroupsnapshottable \[Feature:volumegroupsnapshot\] VolumeGroupSnapshottable=does not apply: on several nodes the spec needs every restored member in one pod, and loop-block'"'"'s node-local members restore on their own nodes')
fi
while IFS= read -r line; do [ -z "$line" ] || LEFT_OUT+=("$line"); done <<< "${CONFORMANCE_SKIP:-}"
SKIP=$(for l in "${LEFT_OUT[@]}"; do printf '%s|' "${l%%=*}"; done); SKIP="${SKIP%|}"
PROCS="${CONFORMANCE_PROCS:-4}"
TIMEOUT="${CONFORMANCE_TIMEOUT:-3h}"
export KUBECONFIG

log() { echo "conformance: $*" >&2; }
k() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG" "$@"; }

drivers=("$@")
if [ "${#drivers[@]}" -eq 0 ]; then
  for f in "$ROOT"/test/conformance/*/testdriver.yaml; do
    d="${f%/testdriver.yaml}"; drivers+=("${d##*/}")
  done
fi

# dir_of DRIVER: the folder of a driver argument, relative to the repository when inside it.
dir_of() {
  local d="$1" abs
  if [[ "$d" != */* ]]; then echo "test/conformance/$d"; return; fi
  abs="$(cd "$ROOT" && realpath -m "$d")"
  case "$abs" in "$ROOT"/*) echo "${abs#"$ROOT"/}";; *) echo "$abs";; esac
}
# name_of FILE: DriverInfo.Name of a testdriver file (its first "Name:" under DriverInfo).
name_of() {
  awk '/^DriverInfo:/ { in_di = 1; next } /^[^ #]/ { in_di = 0 } in_di && $1 == "Name:" { print $2; exit }' "$1" | tr -d '"'"'"
}

[ -f "$KUBECONFIG" ] || { log "no cluster ($KUBECONFIG): run make e2e-setup first"; exit 1; }

# One run at a time on a cluster. The suite's [Serial] specs assume nothing else runs, and two
# runs at once break each other: "any volume data source" creates the VolumePopulator CRD when
# it finds none and deletes it when done, while the other run's spec uses it (or creates it
# too), and always creates hello-populator's CRD, which the other's already holds;
# volumelimits counts the volumes on a node. A second run waits for the first (fd 9 stays
# open, and the lock held, until this script exits).
LOCK="$(dirname "$KUBECONFIG")/conformance.lock"
exec 9>>"$LOCK"
if ! flock -n 9; then
  log "another make conformance runs on this cluster ($(cat "$LOCK.who" 2>/dev/null || echo unknown)): waiting for it to end"
  flock 9
fi
echo "pid $$, drivers ${drivers[*]}, since $(date -u +%FT%TZ)" > "$LOCK.who"

rm -rf "$OUT"; mkdir -p "$OUT"

start=$SECONDS
"$ROOT/hack/build-tools.sh" e2e
"$ROOT/hack/images/build.sh" --import conformance
log "tools and images ready in $((SECONDS - start)) s"

# What a driver needs besides its PavProvisioner (a store, a pool…), or the driver itself (a
# peer): setup.sh before the run, teardown.sh after it, whatever happens, so that nothing holds
# a provisioner afterwards. They get KUBECTL, PAV_CLUSTER_DIR and PAV_BIN_DIR.
hook() { KUBECTL="$BIN/kubectl" PAV_CLUSTER_DIR="$CLUSTER_DIR" PAV_BIN_DIR="$BIN" "$@"; }
torn=() # "folder|driver" pairs, the last set up first
# A driver's PVs go before its teardown: their deletion pods may need what teardown.sh
# removes (an interrupted run leaves claims whose deletion is still under way).
driver_pvs() { k get pv -o jsonpath="{range .items[?(@.spec.csi.driver==\"$1\")]}{.metadata.name}{\" \"}{end}"; }
teardown() {
  local t dir d i
  for t in "${torn[@]}"; do
    dir="${t%|*}" d="${t##*|}"
    for i in $(seq 180); do [ -z "$(driver_pvs "$d")" ] && break; sleep 1; done
    [ -z "$(driver_pvs "$d")" ] || log "$d: PVs still there after 3 minutes: $(driver_pvs "$d")"
    log "$d: ${dir#"$ROOT"/}/teardown.sh"
    hook "$dir/teardown.sh" || log "$d: teardown failed"
  done
}
trap teardown EXIT

args=() names=()
for arg in "${drivers[@]}"; do
  dir="$(dir_of "$arg")"
  abs="$(cd "$ROOT" && realpath -m "$dir")"
  f="$abs/testdriver.yaml"
  [ -f "$f" ] || { log "no testdriver $dir/testdriver.yaml"; exit 2; }
  d="$(name_of "$f")"
  [ -n "$d" ] || { log "$dir/testdriver.yaml: no DriverInfo.Name"; exit 2; }
  if ! k get pav "$d" >/dev/null 2>&1 && [ ! -x "$abs/setup.sh" ]; then
    log "PavProvisioner $d is not deployed (run make e2e-setup), and $dir has no setup.sh that installs driver $d"; exit 1
  fi
  [ ! -x "$abs/teardown.sh" ] || torn=("$abs|$d" "${torn[@]}")
  if [ -x "$abs/setup.sh" ]; then
    log "$d: $dir/setup.sh"
    hook "$abs/setup.sh"
  fi
  k get csidriver "$d" >/dev/null || { log "driver $d: no CSIDriver $d (run make e2e-setup, or $dir/setup.sh did not install it)"; exit 1; }
  # ginkgo runs e2e.test in e2e.test's directory, and the suite reads some of a testdriver's
  # files (its VolumeSnapshotClass) relative to that, not to -repo-root: each testdriver is
  # given with its files' paths made absolute.
  mkdir -p "$OUT/testdrivers"
  sed "s#^\( *FromFile: *\)\([^/]\)#\1$ROOT/\2#" "$f" > "$OUT/testdrivers/$d.yaml"
  args+=("-storage.testdriver=$OUT/testdrivers/$d.yaml")
  names+=("$d")
done
# Driver names are regular expressions in the focus: a peer's name has dots.
focus="External.Storage.*\[Driver: ($(IFS='|'; echo "${names[*]//./\\.}"))\]"
[ -z "$FOCUS" ] || focus="$focus.*($FOCUS)"

log "drivers ${names[*]}: $PROCS processes, focus '$focus', skip '$SKIP'; output in ${OUT#"$ROOT"/}"
run_start=$SECONDS
rc=0
(cd "$ROOT" && KUBE_TEST_REPO_LIST="$ROOT/test/conformance/repo-list.yaml" \
  "$BIN/ginkgo" --procs="$PROCS" --timeout="$TIMEOUT" --no-color --silence-skips \
    --focus="$focus" --skip="$SKIP" \
    --output-dir="$OUT" --json-report=report.json --junit-report=junit.xml \
    "$BIN/e2e.test" -- \
    -kubeconfig="$KUBECONFIG" -repo-root="$ROOT" -report-dir="$OUT" \
    -allowed-not-ready-nodes=0 "${args[@]}") > "$OUT/e2e.log" 2>&1 || rc=$?
log "suite ran in $((SECONDS - run_start)) s (exit $rc); its output: ${OUT#"$ROOT"/}/e2e.log"

pairs=()
for d in "${names[@]}"; do pairs+=("$d=$OUT/report.json"); done
if [ ! -s "$OUT/report.json" ]; then
  tail -n 40 "$OUT/e2e.log" >&2
  log "no report written: the suite did not run"
  exit 1
fi
lo=()
for l in "${LEFT_OUT[@]}"; do lo+=(-left-out "$l"); done
(cd "$ROOT" && go run ./test/conformance/summary -o "$OUT/summary.md" "${lo[@]}" "${pairs[@]}") || rc=1
log "summary: ${OUT#"$ROOT"/}/summary.md; whole run $((SECONDS - start)) s"
exit "$rc"
