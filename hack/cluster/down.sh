#!/usr/bin/env bash
# hack/cluster/down.sh — stop the local cluster of hack/cluster/up.sh and clean up after it.
#
# Usage: hack/cluster/down.sh [--purge]          (make cluster-down; as root)
#   --purge   also delete the whole state directory (certificates, configs and logs too)
#
# Safe to run twice, and after a crash. It touches only what up.sh made:
#   0. removes the extra nodes (hack/cluster/node.sh remove: their processes, network
#      namespaces, veths, routes, cgroups, loop devices and disks), then the host bridge
#      pavnodes;
#   1. stops the kubelet (daemons are stopped by pid file only: TERM, KILL after 10 s);
#   2. kills the containers of its containerd (ctr tasks kill -9) and the processes still
#      in the kubelet's pod cgroups (kubepods);
#   3. stops the control plane and kube-proxy (after `kube-proxy --cleanup`), then etcd,
#      then containerd, then kills the shims whose command line names its containerd
#      socket (never anything matched by name) and removes their sockets;
#   4. unmounts everything under the state dir and the kubelet root (/var/lib/kubelet);
#   5. removes iptables KUBE-* and CNI-* chains (filter, nat, mangle; IPv4 and IPv6) and the
#      rules that jump to them, the CNI bridge pav0, and the kubepods cgroups;
#   6. restores net.ipv4.ip_forward, deletes the runtime data (etcd, containerd, CNI, pod
#      logs) and the host directories that did not exist before up.sh (listed in
#      <state dir>/host-dirs-created: the kubelet root, /var/log/containers, /var/log/pods,
#      /var/lib/cni, /run/containerd). Keeps pki/, config/ and logs/ unless --purge.
# Exits 1 if anything is left (and says what).
# Env: as up.sh (hack/cluster/lib.sh).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PURGE=0
[ "${1:-}" = "--purge" ] && PURGE=1
[ "$(id -u)" -eq 0 ] || die "must run as root"
T0=$SECONDS

# alive PID: the process exists and is not a zombie
alive() { local st; st="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" && [ -n "$st" ] && [ "$st" != Z ]; }

# stop NAME...: TERM the named daemons (by pid file) together, KILL those still alive after 10 s.
stop() {
  local name pid pids=() names=() i
  for name in "$@"; do
    if pid="$(pid_of "$name")"; then
      if [ "$name" = kube-proxy ]; then  # remove kube-proxy's rules (best effort)
        timeout 20 "$BIN/kube-proxy" --config="$CONF/kube-proxy.yaml" --cleanup >>"$LOGS/kube-proxy.log" 2>&1 || true
      fi
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid"); names+=("$name")
    fi
  done
  for i in $(seq 100); do
    local any=0
    for pid in "${pids[@]}"; do alive "$pid" && any=1; done
    [ "$any" = 0 ] && break
    sleep 0.1
  done
  for i in "${!pids[@]}"; do
    if alive "${pids[$i]}"; then
      log "${names[$i]}: did not stop on TERM, sending KILL"
      kill -KILL "${pids[$i]}" 2>/dev/null || true
    fi
  done
  for i in "${!pids[@]}"; do
    for _ in $(seq 50); do alive "${pids[$i]}" || break; sleep 0.1; done
    rm -f "$RUN/${names[$i]}.pid"
    log "${names[$i]}: stopped (pid ${pids[$i]})"
  done
  for name in "$@"; do pid_of "$name" >/dev/null || rm -f "$RUN/$name.pid"; done
}

# pids in the kubelet's pod cgroups (cgroup v1 controllers and the v2 hierarchy)
kubepods_dirs() {
  local m
  for m in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/kubepods.slice /sys/fs/cgroup/kubepods.slice; do
    [ -d "$m" ] && echo "$m"
  done
}
pod_pids() {
  local d
  for d in $(kubepods_dirs); do
    find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null
  done | sort -un
}

# 0. extra nodes --------------------------------------------------------------------------------
for n in $("$ROOT/hack/cluster/node.sh" list); do
  "$ROOT/hack/cluster/node.sh" remove "$n" || log "WARNING: node $n not fully removed"
done
if ip link show "$NODE_BRIDGE" >/dev/null 2>&1; then
  ip link delete "$NODE_BRIDGE" && log "deleted bridge $NODE_BRIDGE"
fi

# 1. the kubelet first, so that it restarts no container ------------------------------------
stop kubelet

# 2. containers, before the apiserver (which waits for their API clients on shutdown) ------
if pid_of containerd >/dev/null && [ -S "$CTRD_SOCK" ]; then
  tasks="$(timeout 10 "$BIN/ctr" --address "$CTRD_SOCK" -n k8s.io tasks ls -q 2>/dev/null || true)"
  for t in $tasks; do
    timeout 5 "$BIN/ctr" --address "$CTRD_SOCK" -n k8s.io tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true
  done
  [ -n "$tasks" ] && log "killed $(echo "$tasks" | wc -w) container tasks"
fi
for _ in 1 2 3 4 5; do
  leftover="$(pod_pids)"
  [ -z "$leftover" ] && break
  kill -9 $leftover 2>/dev/null || true
  sleep 0.2
done

# 3. the control plane, kube-proxy, etcd, then containerd -------------------------------------
# (their supervisors first, which would restart them: up.sh's start)
for name in kube-scheduler kube-controller-manager; do
  if pid="$(supervisor_of "$name")"; then kill -TERM "$pid" 2>/dev/null || true; fi
done
stop kube-proxy kube-scheduler kube-controller-manager kube-apiserver
stop etcd   # after the apiserver, which otherwise waits for it on shutdown
stop containerd

# shims of this containerd: their command line names its socket (never matched by name)
for p in /proc/[0-9]*; do
  pid="${p#/proc/}"
  exe="$(readlink "$p/exe" 2>/dev/null)" || continue
  exe="${exe% (deleted)}"
  [ "$exe" = "$BIN/containerd-shim-runc-v2" ] || continue
  mapfile -d '' -t argv < "$p/cmdline" 2>/dev/null || continue
  addr="" ns="" id=""
  for ((j = 0; j < ${#argv[@]} - 1; j++)); do
    case "${argv[$j]}" in
      -address|--address) addr="${argv[$((j + 1))]}" ;;
      -namespace|--namespace) ns="${argv[$((j + 1))]}" ;;
      -id|--id) id="${argv[$((j + 1))]}" ;;
    esac
  done
  [ "$addr" = "$CTRD_SOCK" ] || continue
  kill -9 "$pid" 2>/dev/null && log "killed shim $pid"
  # its socket: /run/containerd/s/sha256(<containerd address>/<namespace>/<id>[/debug])
  for suffix in "" /debug; do
    rm -f "/run/containerd/s/$(printf '%s' "$addr/$ns/$id$suffix" | sha256sum | cut -d' ' -f1)"
  done
done
leftover="$(pod_pids)"; [ -n "$leftover" ] && kill -9 $leftover 2>/dev/null

# 4. mounts -----------------------------------------------------------------------------------
# mount points (mountinfo field 5, octal escapes decoded) under our directories, newest first
our_mounts() {
  awk '{print $5}' /proc/self/mountinfo | tac | while read -r m; do
    m="$(printf '%b' "$m")"
    case "$m" in
      "$D"|"$D"/*|"$KUBELET_ROOT"|"$KUBELET_ROOT"/*) echo "$m" ;;
    esac
  done
}
for pass in $(seq 10); do
  mounts="$(our_mounts)"
  [ -z "$mounts" ] && break
  while IFS= read -r m; do
    umount "$m" 2>/dev/null || { [ "$pass" -ge 3 ] && umount -l "$m" 2>/dev/null; } || true
  done <<< "$mounts"
done
left="$(our_mounts)"
[ -n "$left" ] && log "WARNING: still mounted: $(echo "$left" | tr '\n' ' ')"

# 5. network and cgroups ----------------------------------------------------------------------
clean_chains() { # iptables|ip6tables
  local ipt="$1" table rule chain
  command -v "$ipt" >/dev/null || return 0
  for table in filter nat mangle; do
    # rules in other chains that jump to our chains
    "$ipt" -w -t "$table" -S 2>/dev/null | grep -E '^-A ' | grep -E -- '-[jg] (KUBE|CNI)-' |
      grep -vE '^-A (KUBE|CNI)-' | while IFS= read -r rule; do
        eval "$ipt -w -t $table ${rule/#-A/-D}" 2>/dev/null || true
      done
    for chain in $("$ipt" -w -t "$table" -S 2>/dev/null | awk '/^-N (KUBE|CNI)-/ {print $2}'); do
      "$ipt" -w -t "$table" -F "$chain" 2>/dev/null || true
    done
    for chain in $("$ipt" -w -t "$table" -S 2>/dev/null | awk '/^-N (KUBE|CNI)-/ {print $2}'); do
      "$ipt" -w -t "$table" -X "$chain" 2>/dev/null || true
    done
  done
}
clean_chains iptables
clean_chains ip6tables
if ip link show "$BRIDGE" >/dev/null 2>&1; then
  ip link delete "$BRIDGE" && log "deleted bridge $BRIDGE"
fi
# conntrack entries of the pod network
conntrack -D -s "$POD_CIDR" >/dev/null 2>&1 || true

# kubepods cgroups, deepest first
for d in $(kubepods_dirs); do
  find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
done

# 6. host settings and data -------------------------------------------------------------------
if [ -f "$RUN/ip_forward.orig" ]; then
  cat "$RUN/ip_forward.orig" > /proc/sys/net/ipv4/ip_forward
  rm -f "$RUN/ip_forward.orig"
fi
if [ -z "$(our_mounts)" ]; then
  rm -rf --one-file-system "$ETCD_DATA" "$D/containerd" "$D/cni/networks" "$POD_LOGS" "$RUN"
  # host directories that up.sh found missing and the cluster created
  if [ -f "$HOST_DIRS_CREATED" ]; then
    while IFS= read -r hd; do
      [ -n "$hd" ] && [ -e "$hd" ] && rm -rf --one-file-system "$hd" && log "removed $hd"
    done < "$HOST_DIRS_CREATED"
  fi
  # entries of ours in pre-existing shared directories
  rm -f /var/lib/cni/results/pav-* 2>/dev/null
  find /var/log/containers -maxdepth 1 -type l -lname "$POD_LOGS/*" -delete 2>/dev/null
  [ "$PURGE" = 1 ] && rm -rf --one-file-system "$D"
else
  log "WARNING: mounts remain; data not deleted"
fi

# report what is left
left=""
for n in "${DAEMONS[@]}"; do [ -f "$RUN/$n.pid" ] && left+=" $n"; done
[ -n "$(our_mounts)" ] && left+=" mounts"
iptables -w -S 2>/dev/null | grep -qE '^-N (KUBE|CNI)-' && left+=" iptables-chains"
iptables -w -t nat -S 2>/dev/null | grep -qE '^-N (KUBE|CNI)-' && left+=" nat-chains"
ip link show "$BRIDGE" >/dev/null 2>&1 && left+=" bridge"
ip link show "$NODE_BRIDGE" >/dev/null 2>&1 && left+=" bridge:$NODE_BRIDGE"
for ns in $(ip netns list 2>/dev/null | awk '/^pav-/ {print $1}'); do left+=" netns:$ns"; done
for n in "$D"/nodes/*/; do
  [ -d "$n/var-lib" ] && left+=" node-disk:$(basename "$n")"
done
[ -n "$(pod_pids)" ] && left+=" pod-processes"
for p in /proc/[0-9]*; do   # any process still running one of our binaries
  exe="$(readlink "$p/exe" 2>/dev/null)" || continue
  case "${exe% (deleted)}" in "$BIN"/*) left+=" process:${p#/proc/}(${exe##*/})" ;; esac
done
if [ -n "$left" ]; then
  log "down finished in $((SECONDS - T0)) s, but left:$left"
  exit 1
fi
log "cluster down in $((SECONDS - T0)) s; nothing left behind"
