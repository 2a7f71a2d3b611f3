#!/usr/bin/env bash
# hack/cluster/node.sh — the local cluster's extra nodes: kind-shaped nodes made of namespaces.
#
# Usage (as root; the control plane of hack/cluster/up.sh must be running):
#   hack/cluster/node.sh start NAME       boot node NAME (vm-2, vm-3, …: <node 1>-N, N = 2..9)
#   hack/cluster/node.sh stop NAME        power it off: every process of the node, containers
#                                         included, is killed; its mounts go as at a reboot;
#                                         its disk (/var/lib, /var/log) stays
#   hack/cluster/node.sh remove NAME      stop, then delete everything the node had: network
#                                         namespace, veth, route, cgroups, loop devices, disk
#   hack/cluster/node.sh exec NAME CMD…   run CMD in the node's namespaces (findmnt, ls, …)
#   hack/cluster/node.sh list             the extra nodes that have a state directory
# up.sh starts nodes 2..PAV_NODES with `start`; down.sh removes them all with `remove`.
#
# What a node is (the shape of a kind node, without a container engine):
#   - network: its own network namespace pav-NAME, whose eth0 (NODE_NET.N/24) is a veth on
#     the host bridge pavnodes (NODE_NET.1); its pods get 10.89.N.0/24 on a bridge of its own,
#     routed by the host (which also routes node 1's pods, 10.88.0.0/16);
#   - PID and UTS: its own PID namespace (the node's init is PID 1 there: killing it kills
#     every process of the node) and hostname NAME;
#   - mounts: its own mount namespace, private, in which /var/lib and /var/log are the node's
#     own disk (<state dir>/nodes/NAME/var-lib and var-log on the host): the kubelet root
#     /var/lib/kubelet (rshared, for Bidirectional mounts), pav's node state and every hostPath
#     under /var/lib are per node, as on separate machines; everything else (/tmp, /srv, /dev,
#     this repository) is the host's, shared by all nodes. /sys is the node's network
#     namespace's sysfs, with the host's cgroup hierarchies;
#   - daemons: containerd, kubelet and kube-proxy of their own (logs in nodes/NAME/logs),
#     pods under the cgroup /pav-NAME/kubepods, the daemons under /pav-NAME/system.
# Loop devices and /dev are the kernel's, shared: `remove` detaches the loop devices whose
# backing file lies on the node's disk.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[ "$(id -u)" -eq 0 ] || die "must run as root"
NODE1="$(node1_name)"

usage() { sed -n '3,13p' "$0" >&2; exit 2; }
[ $# -ge 1 ] || usage
cmd="$1"; shift

if [ "$cmd" = list ]; then
  for d in "$D"/nodes/*/; do [ -d "$d" ] && basename "$d"; done
  exit 0
fi
[ $# -ge 1 ] || usage
NAME="$1"; shift
[[ "$NAME" =~ ^$NODE1-([2-9])$ ]] || die "node $NAME: extra nodes are named $NODE1-2 … $NODE1-9"
N="${BASH_REMATCH[1]}"

ND="$D/nodes/$NAME"
NETNS="pav-$NAME"
VETH="pav-$NAME"                     # the host's end of the node's eth0
NODE_IP="$NODE_NET.$N"
NODE_POD_CIDR="10.89.$N.0/24"
CGROUP="pav-$NAME"
N_PKI="$ND/pki"
N_CONF="$ND/config"
N_LOGS="$ND/logs"
N_RUN="$ND/run"
N_SOCK="$N_RUN/containerd/containerd.sock"
INIT_PID="$N_RUN/init.pid"           # the unshare process; its child is the node's PID 1
LOGDIR="$N_LOGS"

# init_pid: the host pid of the node's PID 1 (the child of the unshare process), if it runs.
init_pid() {
  local u c
  u="$(cat "$INIT_PID" 2>/dev/null)" || return 1
  [[ "$u" =~ ^[0-9]+$ ]] && [ -d "/proc/$u" ] || return 1
  [ "$(readlink "/proc/$u/exe" 2>/dev/null)" = "$(readlink -f "$(command -v unshare)")" ] || return 1
  c="$(cat "/proc/$u/task/$u/children" 2>/dev/null)"; c="${c%% *}"
  [[ "$c" =~ ^[0-9]+$ ]] || return 1
  echo "$c"
}

in_node() { local p; p="$(init_pid)" || die "node $NAME is not running"; nsenter -t "$p" -m -u -n -p -- "$@"; }

# cgroup_dirs: the node's cgroup in every v1 hierarchy (and the v2 one, if mounted).
cgroup_dirs() {
  local h
  for h in /sys/fs/cgroup/*/; do
    [ -d "$h" ] && [ -e "$h/cgroup.procs" ] && echo "${h%/}/$CGROUP"
  done
}
node_pids() {
  local d
  for d in $(cgroup_dirs); do
    [ -d "$d" ] && find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null
  done | sort -un
}

network_up() {
  if ! ip link show "$NODE_BRIDGE" >/dev/null 2>&1; then
    # (nodes starting at once may both get here: the second add fails, and finds the bridge)
    ip link add "$NODE_BRIDGE" type bridge 2>/dev/null || ip link show "$NODE_BRIDGE" >/dev/null
    ip addr replace "$NODE_NET.1/24" dev "$NODE_BRIDGE"
    ip link set "$NODE_BRIDGE" up
  fi
  [ -e "/run/netns/$NETNS" ] || ip netns add "$NETNS"
  if ! ip link show "$VETH" >/dev/null 2>&1; then
    ip link add "$VETH" type veth peer name eth0 netns "$NETNS"
    ip link set "$VETH" master "$NODE_BRIDGE" up
  fi
  ip -n "$NETNS" addr replace "$NODE_IP/24" dev eth0
  ip -n "$NETNS" link set lo up
  ip -n "$NETNS" link set eth0 up
  ip -n "$NETNS" route replace default via "$NODE_NET.1"
  ip route replace "$NODE_POD_CIDR" via "$NODE_IP" dev "$NODE_BRIDGE"
  # As on node 1: the node forwards its pods' traffic, and bridged pod traffic traverses
  # iptables (kube-proxy's Service rules). Both settings belong to the network namespace.
  ip netns exec "$NETNS" sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward
    [ ! -e /proc/sys/net/bridge/bridge-nf-call-iptables ] || echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables'
}

configure() {
  local lock
  mkdir -p "$N_PKI" "$N_CONF" "$N_LOGS" "$N_RUN/containerd" "$ND/var-lib/kubelet" "$ND/var-log" \
           "$ND/containerd/root" "$ND/containerd/state" "$ND/cni/net.d" "$ND/cni/networks" \
           "$ND/pod-logs" "$ND/cgroup-hold"
  chmod 700 "$N_PKI"
  if [ "$(cat "$N_PKI/identity" 2>/dev/null)" != "$NAME $NODE_IP $(sha256sum < "$PKI/ca.crt")" ]; then
    # one node at a time: signing rewrites the CA's serial file (ca.srl)
    exec {lock}>"$PKI/.sign.lock"
    flock "$lock"
    cert "$N_PKI" kubelet-client "/O=system:nodes/CN=system:node:$NAME" clientAuth
    cert "$N_PKI" kubelet-serving "/CN=$NAME" serverAuth "DNS:$NAME,DNS:localhost,IP:$NODE_IP,IP:127.0.0.1"
    exec {lock}>&-
    echo "$NAME $NODE_IP $(sha256sum < "$PKI/ca.crt")" > "$N_PKI/identity"
  fi
  [ -s "$ND/machine-id" ] || od -An -N16 -tx1 /dev/urandom | tr -d ' \n' > "$ND/machine-id"
  # The API server, as the node reaches it: node 1's address, routed by the host.
  local server="https://$API_IP:$APISERVER_PORT"
  kubeconfig "$N_CONF/kubelet.kubeconfig" kubelet-client "$N_PKI" "$server"
  kubeconfig "$N_CONF/kube-proxy.kubeconfig" kube-proxy "$PKI" "$server"
  containerd_config "$N_CONF/containerd.toml" "$ND/containerd/root" "$ND/containerd/state" \
    "$N_SOCK" "$N_RUN/runc" "$ND/cni/net.d"
  cni_config "$ND/cni/net.d/10-pav.conflist" "$NODE_POD_CIDR" "$ND/cni/networks"
  kubelet_config "$N_CONF/kubelet.yaml" "$N_SOCK" "$N_PKI" "$ND/pod-logs" "/$CGROUP"
  kube_proxy_config "$N_CONF/kube-proxy.yaml" "$N_CONF/kube-proxy.kubeconfig" "$NAME"
  # the kubelet wants its cgroup root to exist; a v1 cpuset cgroup starts with no CPUs
  local d
  for d in $(cgroup_dirs); do
    mkdir -p "$d/system"
    if [ -e "$d/cpuset.cpus" ]; then
      cat "$(dirname "$d")/cpuset.cpus" > "$d/cpuset.cpus"; cat "$(dirname "$d")/cpuset.mems" > "$d/cpuset.mems"
      cat "$d/cpuset.cpus" > "$d/system/cpuset.cpus"; cat "$d/cpuset.mems" > "$d/system/cpuset.mems"
    fi
  done
}

# The node's PID 1 (node.sh _init NAME, run by `start` inside the new namespaces): sets up
# the node's mounts and hostname, starts its daemons and reaps its orphans until killed.
node_init() {
  local d
  for d in $(cgroup_dirs); do echo $$ > "$d/system/cgroup.procs"; done
  hostname "$NAME"
  mount --make-rprivate /
  # this network namespace's sysfs, with the host's cgroup hierarchies put back under it
  mount --rbind /sys/fs/cgroup "$ND/cgroup-hold"
  mount -t sysfs sysfs /sys
  mount --rbind "$ND/cgroup-hold" /sys/fs/cgroup
  umount -l "$ND/cgroup-hold"
  # The copies of node 1's mounts this namespace was born with: its kubelet's volumes, its
  # containers' root filesystems and network namespaces. Kept, they would pin node 1's
  # volumes (a loop device could not be detached while a copy of its mount lives here), and
  # containerd would take the hidden /var/lib/kubelet for this node's.
  local m
  awk '{print $5}' /proc/self/mountinfo | sort -ru | while read -r m; do
    m="$(printf '%b' "$m")"
    case "$m" in
      /var/lib|/var/lib/*|/var/log|/var/log/*|"$KUBELET_ROOT"|"$KUBELET_ROOT"/*|"$D"|"$D"/*|/run/netns|/run/netns/*|/run/containerd|/run/containerd/*)
        umount -l "$m" 2>/dev/null || true ;;
    esac
  done
  mount --bind "$ND/var-lib" /var/lib
  mount --bind "$ND/var-log" /var/log
  mount --make-rshared /var/lib
  mount --bind /var/lib/kubelet /var/lib/kubelet
  mount --make-rshared /var/lib/kubelet
  [ ! -e /etc/machine-id ] || mount --bind "$ND/machine-id" /etc/machine-id
  mkdir -p /var/log/pods /var/log/containers

  daemon() { # NAME ARGS...: run $BIN/NAME in the background, log to nodes/NAME/logs
    local n="$1"; shift
    echo "==== $(date -Is) start" >> "$N_LOGS/$n.log"
    PATH="$BIN:$PATH" "$BIN/$n" "$@" >> "$N_LOGS/$n.log" 2>&1 < /dev/null &
    echo $! > "$N_RUN/$n.pid"
  }
  daemon containerd --config "$N_CONF/containerd.toml" --log-level warn
  for _ in $(seq 150); do "$BIN/ctr" --address "$N_SOCK" version >/dev/null 2>&1 && break; sleep 0.2; done
  import_images "$N_SOCK"
  echo "images imported" >&2
  daemon kubelet --config="$N_CONF/kubelet.yaml" --kubeconfig="$N_CONF/kubelet.kubeconfig" \
    --root-dir=/var/lib/kubelet --hostname-override="$NAME" --node-ip="$NODE_IP" --v=1
  daemon kube-proxy --config="$N_CONF/kube-proxy.yaml" --v=1
  # PID 1 of the namespace: reap whatever is re-parented here, forever.
  # (bash reaps any child on SIGCHLD; the sleep keeps it from spinning once none is left)
  trap '' TERM INT HUP
  while true; do wait; sleep 5; done
}

start() {
  local p since
  if p="$(init_pid)"; then log "node $NAME: already running (pid $p)"; return 0; fi
  [ -S "$CTRD_SOCK" ] || die "node $NAME: the control plane is not up (hack/cluster/up.sh)"
  # what a machine keeps in tmpfs (/run) does not survive a power-off
  rm -rf --one-file-system "$ND/containerd/state" "$N_RUN"
  network_up
  configure
  log "node $NAME: starting ($NODE_IP, pods $NODE_POD_CIDR, logs $N_LOGS)"
  since="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "==== $(date -Is) boot" >> "$N_LOGS/init.log"
  # setsid: the node outlives this script; --kill-child: killing the unshare process kills
  # the node's PID 1, and with it every process in the node's PID namespace. No descriptor
  # of this script's caller is kept (CLOSE_FDS_EXEC).
  API_IP="$API_IP" setsid bash -c "$CLOSE_FDS_EXEC" close-fds nsenter --net="/run/netns/$NETNS" \
    unshare --mount --uts --pid --fork --mount-proc --propagation private --kill-child=SIGKILL \
    "$ROOT/hack/cluster/node.sh" _init "$NAME" >> "$N_LOGS/init.log" 2>&1 < /dev/null &
  echo $! > "$INIT_PID"
  wait_for "node $NAME's init" 20 init_pid
  # Ready with a heartbeat from this boot; a node whose init died (containerd did not start,
  # an image did not import) fails at once. Either failure prints what the node's logs say,
  # since CI keeps only its own output.
  local end=$((SECONDS + 180))
  until node_ready "$NAME" "$since"; do
    init_pid >/dev/null || { boot_report "$since"; die "node $NAME: its init exited during the boot"; }
    [ $SECONDS -lt $end ] || { boot_report "$since"; die "timed out after 180s waiting for node $NAME Ready (heartbeat ≥ $since; logs in $N_LOGS)"; }
    sleep 0.2
  done
  log "node $NAME: Ready"
}

# boot_report SINCE: why node NAME is not Ready, on stderr: its Ready condition as the API
# server has it, its init's output since the boot, and the last errors and warnings its
# kubelet and containerd logged since they were started by it.
boot_report() {
  local cond
  cond="$(kubectl_admin get node "$NAME" -o jsonpath='{range .status.conditions[?(@.type=="Ready")]}{.status} {.lastHeartbeatTime} {.reason}: {.message}{end}' 2>&1)" || true
  log "node $NAME: Ready condition (boot at $1): ${cond:-none}"
  log "node $NAME: init.log since the boot:"
  since_marker boot "$N_LOGS/init.log" | tail -n 20 | sed 's/^/  /' >&2
  log "node $NAME: kubelet.log, last errors and warnings:"
  since_marker start "$N_LOGS/kubelet.log" | grep -E '^[EW][0-9]{4} ' | tail -n 25 | cut -c1-400 | sed 's/^/  /' >&2
  log "node $NAME: containerd.log, last errors:"
  since_marker start "$N_LOGS/containerd.log" | grep -E 'level=(error|fatal)' | tail -n 10 | cut -c1-400 | sed 's/^/  /' >&2
}

# since_marker WORD FILE: FILE's lines after its last "==== <date> WORD" line (node_init's
# daemon and start write one per run), nothing if FILE is missing.
since_marker() {
  awk -v w="$1" '$1 == "====" && $3 == w {n = 0; delete l; next} {l[++n] = $0} END {for (i = 1; i <= n; i++) print l[i]}' "$2" 2>/dev/null || true
}

stop() {
  local u
  u="$(cat "$INIT_PID" 2>/dev/null || true)"
  if init_pid >/dev/null; then
    kill -KILL "$u" 2>/dev/null || true
    log "node $NAME: powered off"
  fi
  rm -f "$INIT_PID"
  # PID 1's death kills the namespace's processes; wait until the last one is gone
  local i
  for i in $(seq 100); do [ -z "$(node_pids)" ] && break; sleep 0.1; done
  [ -z "$(node_pids)" ] || { kill -9 $(node_pids) 2>/dev/null || true; sleep 0.5; }
  [ -z "$(node_pids)" ] || die "node $NAME: processes left: $(node_pids | tr '\n' ' ')"
}

# loop_devices: the loop devices whose backing file is on the node's disk (by device and
# inode: the path a loop device reports is the one seen from the node).
loop_devices() {
  [ -d "$ND/var-lib" ] || return 0
  local dev; dev="$(stat -c '%Hd:%Ld' "$ND/var-lib")"
  losetup -l -n -O NAME,BACK-MAJ:MIN,BACK-INO 2>/dev/null | while read -r name mm ino; do
    [ "$mm" = "$dev" ] || continue
    [ -n "$(find "$ND/var-lib" "$ND/var-log" -xdev -inum "$ino" -print -quit 2>/dev/null)" ] && echo "$name"
  done
  return 0
}

remove() {
  stop
  local l d
  for l in $(loop_devices); do losetup -d "$l" && log "node $NAME: detached $l"; done
  ip route del "$NODE_POD_CIDR" 2>/dev/null || true
  ip link delete "$VETH" 2>/dev/null || true
  [ ! -e "/run/netns/$NETNS" ] || ip netns delete "$NETNS"
  for d in $(cgroup_dirs); do
    [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
  done
  rm -rf --one-file-system "$ND/var-lib" "$ND/var-log" "$ND/containerd" "$ND/cni" "$ND/pod-logs" "$N_RUN"
  # the node object: the node is gone, not just down
  kubectl_admin --request-timeout=5s delete node "$NAME" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  local left=""
  [ -n "$(loop_devices)" ] && left+=" loop-devices"
  ip link show "$VETH" >/dev/null 2>&1 && left+=" veth"
  [ -e "/run/netns/$NETNS" ] && left+=" netns"
  for d in $(cgroup_dirs); do [ -d "$d" ] && left+=" cgroup:$d"; done
  [ -z "$left" ] || die "node $NAME: left:$left"
  log "node $NAME: removed"
}

# API_IP: where nodes reach the API server (node 1's address, routed by the host bridge).
API_IP="${API_IP:-$(cat "$RUN/node-ip" 2>/dev/null || true)}"
case "$cmd" in
  _init)  node_init ;;
  start)  [ -n "$API_IP" ] || die "no $RUN/node-ip: start the control plane with hack/cluster/up.sh"
          start ;;
  stop)   stop ;;
  remove) remove ;;
  exec)   [ $# -ge 1 ] || usage; in_node "$@" ;;
  *)      usage ;;
esac
