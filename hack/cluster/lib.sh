# shellcheck shell=bash disable=SC2034
# hack/cluster/lib.sh — shared settings of hack/cluster/up.sh and down.sh (sourced, not run).
#
# Environment (all optional):
#   PAV_CLUSTER_DIR   state directory (default <repo>/_output/cluster)
#   PAV_BIN_DIR       binaries from hack/build-tools.sh (default <repo>/_output/bin)
#   PAV_KUBELET_ROOT  kubelet --root-dir (default /var/lib/kubelet: the conventional CSI layout)
#   PAV_NODE_NAME     node name (default: lower-cased hostname)
#   PAV_NODE_IP       node IP (default: source address of the default route, else 127.0.0.1)

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
D="${PAV_CLUSTER_DIR:-$ROOT/_output/cluster}"
mkdir -p "$D"
D="$(cd "$D" && pwd -P)"                     # absolute: ctr v2 needs an absolute --address
BIN="${PAV_BIN_DIR:-$ROOT/_output/bin}"
KUBELET_ROOT="${PAV_KUBELET_ROOT:-/var/lib/kubelet}"

PKI="$D/pki"
RUN="$D/run"
LOGS="$D/logs"
CONF="$D/config"
ETCD_DATA="$D/etcd"
CTRD_ROOT="$D/containerd/root"
CTRD_STATE="$D/containerd/state"
CTRD_SOCK="$RUN/containerd/containerd.sock"
CNI_CONF="$D/cni/net.d"
CNI_DATA="$D/cni/networks"
CNI_BIN="${PAV_CNI_BIN:-/usr/lib/cni}"
RUNC_ROOT="$RUN/runc"
POD_LOGS="$D/pod-logs"
KUBECONFIG_ADMIN="$D/kubeconfig"
# Host directories the cluster creates outside $D (kubelet root; the kubelet's
# /var/log/containers symlinks and /var/log/pods; libcni's result cache; the shims' sockets).
HOST_DIRS=("$KUBELET_ROOT" /var/log/containers /var/log/pods /var/lib/cni /run/containerd)
HOST_DIRS_CREATED="$D/host-dirs-created"

BRIDGE=pav0
POD_CIDR=10.88.0.0/16
SERVICE_CIDR=10.0.0.0/24
APISERVER_PORT=6443
ETCD_CLIENT=http://127.0.0.1:2379
ETCD_PEER=http://127.0.0.1:2380

# Daemons in start order; down.sh stops them in reverse.
DAEMONS=(containerd etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)

log() { printf '%s %s\n' "$(date +%T)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# pid_of NAME: the pid in NAME's pid file if that process is alive and runs NAME's binary.
pid_of() {
  local f="$RUN/$1.pid" pid exe
  [ -f "$f" ] || return 1
  pid="$(cat "$f" 2>/dev/null)" || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  exe="$(readlink "/proc/$pid/exe" 2>/dev/null)" || return 1
  exe="${exe% (deleted)}"                     # the binary may have been rebuilt since
  [ "$exe" = "$BIN/$1" ] || [ "$exe" = "$(readlink -f "$BIN/$1")" ] || return 1
  echo "$pid"
}

kubectl_admin() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }
ctr_() { "$BIN/ctr" --address "$CTRD_SOCK" "$@"; }
