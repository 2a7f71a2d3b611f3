# shellcheck shell=bash disable=SC2034
# hack/cluster/lib.sh — shared settings of hack/cluster/up.sh and down.sh (sourced, not run).
#
# Environment (all optional):
#   PAV_CLUSTER_DIR   state directory (default <repo>/_output/cluster)
#   PAV_BIN_DIR       binaries from hack/build-tools.sh (default <repo>/_output/bin)
#   PAV_KUBELET_ROOT  kubelet --root-dir (default /var/lib/kubelet: the conventional CSI layout)
#   PAV_NODE_NAME     node name (default: lower-cased hostname)
#   PAV_NODE_IP       node IP (default: source address of the default route, else 127.0.0.1)
#   PAV_NODES         nodes in the cluster (default 1): node 1 is this machine; nodes 2..N are
#                     kind-shaped nodes in namespaces (hack/cluster/node.sh), named <node 1>-N

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
# Every node's pods: node 1 has POD_CIDR, node N (2..) 10.89.N.0/24 (node.sh).
CLUSTER_CIDR=10.88.0.0/15
NODES="${PAV_NODES:-1}"
[[ "$NODES" =~ ^[1-9]$ ]] || { echo "PAV_NODES=$NODES: want 1 to 9" >&2; exit 2; }
# Extra nodes: each a veth on this host bridge, node N at NODE_NET.N, the host at NODE_NET.1.
NODE_BRIDGE=pavnodes
NODE_NET=172.30.0
SERVICE_CIDR=10.0.0.0/24
APISERVER_PORT=6443
ETCD_CLIENT=http://127.0.0.1:2379
ETCD_PEER=http://127.0.0.1:2380

# Daemons in start order; down.sh stops them in reverse.
DAEMONS=(containerd etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)

log() { printf '%s %s\n' "$(date +%T)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# supervisor_of NAME: the pid of the loop that restarts daemon NAME (up.sh's start), if it runs.
supervisor_of() {
  local f="$RUN/$1.supervisor.pid" pid
  [ -f "$f" ] || return 1
  pid="$(cat "$f" 2>/dev/null)" || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF " $RUN/$1.pid " || return 1
  echo "$pid"
}

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

node1_name() { echo "${PAV_NODE_NAME:-$(hostname | tr 'A-Z' 'a-z')}"; }

# CLOSE_FDS_EXEC: a `bash -c` script that closes every inherited descriptor beyond 0-2, then
# execs its arguments (same pid). A node booted under a caller's lock (the e2e suite's
# TestNodeDown restarts one under `flock /tmp/pav-cluster.lock`) would otherwise hold the
# lock for as long as the node runs.
# shellcheck disable=SC2016
CLOSE_FDS_EXEC='for fd in /proc/$$/fd/*; do fd=${fd##*/}
  if [ "$fd" -gt 2 ] && [ -e "/proc/$$/fd/$fd" ]; then eval "exec $fd>&-"; fi; done; exec "$@"'

# put FILE: write stdin to FILE only if the content changed (kube-proxy exits when its
# config file changes, so a second up.sh must not rewrite it).
put() {
  local tmp="$1.tmp.$$"
  cat > "$tmp"
  if cmp -s "$tmp" "$1"; then rm -f "$tmp"; else mv -f "$tmp" "$1"; fi
}

# cert DIR NAME SUBJECT EKU [SANS]: DIR/NAME.{key,crt}, signed by the cluster CA in $PKI.
cert() {
  local dir="$1" name="$2" subj="$3" eku="$4" sans="${5:-}" ext
  openssl ecparam -name prime256v1 -genkey -noout -out "$dir/$name.key" 2>/dev/null
  ext="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=$eku"
  [ -n "$sans" ] && ext+="
subjectAltName=$sans"
  openssl req -new -key "$dir/$name.key" -subj "$subj" 2>/dev/null |
    openssl x509 -req -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial -days 3650 \
      -extfile <(echo "$ext") -out "$dir/$name.crt" 2>/dev/null
  chmod 600 "$dir/$name.key"
}

# kubeconfig FILE USER [CERT_DIR] [SERVER]: a kubeconfig with USER's client certificate.
kubeconfig() {
  local dir="${3:-$PKI}" server="${4:-https://127.0.0.1:$APISERVER_PORT}"
  put "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: pav-local
  cluster:
    certificate-authority: $PKI/ca.crt
    server: $server
users:
- name: $2
  user:
    client-certificate: $dir/$2.crt
    client-key: $dir/$2.key
contexts:
- name: pav-local
  context: {cluster: pav-local, user: $2}
current-context: pav-local
EOF
}

# containerd_config FILE ROOT STATE SOCK RUNC_ROOT CNI_CONF_DIR
containerd_config() {
  put "$1" <<EOF
version = 3
root = "$2"
state = "$3"

[grpc]
  address = "$4"

[ttrpc]
  address = "$4.ttrpc"

[plugins]
  [plugins.'io.containerd.cri.v1.runtime']
    # root here may not lower oom_score_adj (no CAP_SYS_RESOURCE): runc would fail every sandbox.
    restrict_oom_score_adj = true
    # keep network namespaces under the state dir instead of /var/run/netns
    netns_mounts_under_state_dir = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = "$(command -v runc)"
          Root = "$5"
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ["$CNI_BIN"]
      conf_dir = "$6"
      max_conf_num = 1
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = "registry.k8s.io/pause:3.10"
EOF
}

# cni_config FILE SUBNET DATA_DIR: the node's pod network (bridge $BRIDGE in its netns).
cni_config() {
  put "$1" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "pav",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$2"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$3"
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
}

# kubelet_config FILE CTRD_SOCK CERT_DIR POD_LOGS [CGROUP_ROOT]
kubelet_config() {
  local cgroot=""
  [ -n "${5:-}" ] && cgroot="cgroupRoot: $5"
  put "$1" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$2
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization:
  mode: Webhook
tlsCertFile: $3/kubelet-serving.crt
tlsPrivateKeyFile: $3/kubelet-serving.key
address: 0.0.0.0
port: 10250
healthzBindAddress: 127.0.0.1
healthzPort: 10248
cgroupDriver: cgroupfs
$cgroot
failCgroupV1: false
failSwapOn: false
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
podLogsDir: $4
staticPodPath: ""
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "50Mi"
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
evictionPressureTransitionPeriod: 10s
maxPods: 110
rotateCertificates: false
serverTLSBootstrap: false
nodeStatusUpdateFrequency: 5s
syncFrequency: 10s
EOF
}

# kube_proxy_config FILE KUBECONFIG NODE_NAME
kube_proxy_config() {
  put "$1" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $2
mode: iptables
hostnameOverride: $3
clusterCIDR: $CLUSTER_CIDR
bindAddress: 0.0.0.0
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
nodePortAddresses: [primary]
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF
}

# import_images SOCK: import every image archive into the containerd at SOCK, with the local
# aliases that let the examples' public busybox image (imagePullPolicy IfNotPresent) run
# unmodified on this registry-less cluster; then the stock sidecars (import_sidecars).
BUSYBOX_ALIASES=(docker.io/library/busybox:1.36)
import_images() {
  local sock="$1" t out alias
  for t in "$ROOT"/_output/images/*.tar; do
    out="$("$BIN/ctr" --address "$sock" -n k8s.io images import --platform linux/amd64 "$t" 2>&1)" || die "importing $t: $out"
  done
  for alias in "${BUSYBOX_ALIASES[@]}"; do
    out="$("$BIN/ctr" --address "$sock" -n k8s.io images tag --force pav.local/busybox:dev "$alias" 2>&1)" || die "tagging $alias: $out"
  done
  import_sidecars "$sock"
}

# SIDECARS: the stock kubernetes-csi sidecars the Go module proxy does not serve
# (node-driver-registrar, external-resizer, livenessprobe, external-snapshot-metadata), built
# from their release tags under their upstream names (registry.k8s.io/sig-storage/...:TAG)
# in ../shared/sidecars beside this repository (its README.md), as gzipped OCI archives. The
# manifests name those images, so importing them is all it takes; without the folder (a
# clone elsewhere) nothing is imported, and the cluster pulls the same images.
SIDECARS="${PAV_SIDECARS_DIR:-$ROOT/../shared/sidecars}"
# The registrar under the name ../shared/peers' manifests give it (they were written when a
# stand-in of this repository stood for it).
REGISTRAR_ALIAS=pav.local/registrar:dev

# import_sidecars SOCK: import the archives of $SIDECARS (checked against its SHA256SUMS once
# per run of this shell) into the containerd at SOCK.
import_sidecars() {
  local sock="$1" t out ref
  [ -f "$SIDECARS/SHA256SUMS" ] || { log "sidecars: no $SIDECARS/SHA256SUMS: the stock sidecars will be pulled"; return 0; }
  if [ -z "${SIDECARS_CHECKED:-}" ]; then
    out="$(cd "$SIDECARS" && sha256sum --quiet -c SHA256SUMS 2>&1)" || die "sidecars: $SIDECARS does not match its SHA256SUMS: $out"
    SIDECARS_CHECKED=1
  fi
  for t in "$SIDECARS"/*/*.tar.gz; do
    out="$(gunzip -c "$t" | "$BIN/ctr" --address "$sock" -n k8s.io images import --platform linux/amd64 - 2>&1)" || die "importing $t: $out"
  done
  ref="$("$BIN/ctr" --address "$sock" -n k8s.io images ls -q | grep '^registry.k8s.io/sig-storage/csi-node-driver-registrar:' | head -n 1)" || true
  if [ -n "$ref" ]; then
    out="$("$BIN/ctr" --address "$sock" -n k8s.io images tag --force "$ref" "$REGISTRAR_ALIAS" 2>&1)" || die "tagging $REGISTRAR_ALIAS: $out"
  fi
}

# wait_for WHAT SECONDS CMD...: poll CMD every 0.2 s.
wait_for() {
  local what="$1" secs="$2"; shift 2
  local end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $end ] || die "timed out after ${secs}s waiting for $what (logs in ${LOGDIR:-$LOGS})"
    sleep 0.2
  done
}

# node_ready NAME SINCE: node NAME is Ready with a heartbeat not older than SINCE (UTC,
# RFC 3339), so that a stale Ready left in etcd by an earlier kubelet does not count.
node_ready() {
  local out st hb
  out="$(kubectl_admin get node "$1" -o jsonpath='{range .status.conditions[?(@.type=="Ready")]}{.status} {.lastHeartbeatTime}{end}' 2>/dev/null)" || return 1
  st="${out%% *}"; hb="${out#* }"
  [ "$st" = True ] && [[ ! "$hb" < "$2" ]]
}

kubectl_admin() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }
ctr_() { "$BIN/ctr" --address "$CTRD_SOCK" "$@"; }
