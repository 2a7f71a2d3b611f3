#!/usr/bin/env bash
# hack/cluster/smoke.sh — prove that the local cluster of hack/cluster/up.sh works.
#
# Usage: hack/cluster/smoke.sh [--keep-mount]      (as root, cluster up)
#   1. a busybox pod (pav.local/busybox:dev) runs to Succeeded;
#   2. a privileged pod with a hostPath volume under the kubelet root, mounted with
#      mountPropagation: Bidirectional, mounts a tmpfs; the mount and a file in it are
#      visible on the host. The host mount is removed afterwards unless --keep-mount
#      (then hack/cluster/down.sh must clean it up).
# Exits non-zero on the first failure. Env: as up.sh (hack/cluster/lib.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
KEEP=0; [ "${1:-}" = "--keep-mount" ] && KEEP=1
K() { kubectl_admin "$@"; }
NS=default
HOSTDIR="$KUBELET_ROOT/pav-smoke"

K -n $NS delete pod pav-smoke-busybox pav-smoke-mount --ignore-not-found --wait=true >/dev/null

# 1. busybox to Succeeded
t0=$(date +%s.%N)
K -n $NS apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: pav-smoke-busybox}
spec:
  restartPolicy: Never
  containers:
  - name: c
    image: pav.local/busybox:dev
    imagePullPolicy: Never
    command: ["sh", "-c", "echo hello from \$(hostname); ls /bin | wc -l"]
EOF
K -n $NS wait --for=jsonpath='{.status.phase}'=Succeeded pod/pav-smoke-busybox --timeout=60s >/dev/null ||
  { K -n $NS describe pod pav-smoke-busybox; die "busybox pod did not succeed"; }
log "busybox pod Succeeded in $(echo "$(date +%s.%N) - $t0" | bc 2>/dev/null || echo '?') s; log: $(K -n $NS logs pav-smoke-busybox | tr '\n' ' ')"
K -n $NS delete pod pav-smoke-busybox --wait=false >/dev/null

# 2. Bidirectional mount propagation
mkdir -p "$HOSTDIR"
K -n $NS apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: pav-smoke-mount}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: pav.local/busybox:dev
    imagePullPolicy: Never
    securityContext: {privileged: true}
    command: ["sh", "-c", "mkdir -p /host/m && mount -t tmpfs -o size=1m pav-smoke /host/m && echo propagated > /host/m/hello.txt && touch /host/ready && exec sleep 3600"]
    volumeMounts:
    - {name: host, mountPath: /host, mountPropagation: Bidirectional}
  volumes:
  - name: host
    hostPath: {path: $HOSTDIR, type: DirectoryOrCreate}
EOF
K -n $NS wait --for=condition=Ready pod/pav-smoke-mount --timeout=60s >/dev/null ||
  { K -n $NS describe pod pav-smoke-mount; die "mount pod not Ready"; }
for _ in $(seq 50); do [ -e "$HOSTDIR/ready" ] && break; sleep 0.2; done
line="$(awk -v m="$HOSTDIR/m" '$5 == m' /proc/self/mountinfo | head -1)"
[ -n "$line" ] || die "the pod's mount is not visible on the host at $HOSTDIR/m"
[ "$(cat "$HOSTDIR/m/hello.txt")" = propagated ] || die "file in the pod's mount not visible on the host"
log "host sees the pod's mount: $line"
log "host reads $HOSTDIR/m/hello.txt: $(cat "$HOSTDIR/m/hello.txt")"
K -n $NS delete pod pav-smoke-mount --wait=true >/dev/null
if [ "$KEEP" = 0 ]; then
  while awk -v m="$HOSTDIR/m" '$5 == m {f=1} END {exit !f}' /proc/self/mountinfo; do umount "$HOSTDIR/m"; done
  rm -rf "$HOSTDIR"
else
  log "left the mount at $HOSTDIR/m for down.sh to clean up"
fi
log "smoke test passed"
