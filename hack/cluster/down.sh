#!/usr/bin/env bash
# hack/cluster/down.sh — stop the local cluster of hack/cluster/up.sh and clean up after it.
#
# Usage: hack/cluster/down.sh [--purge]          (make cluster-down; as root)
#   --purge   also delete the whole state directory (certificates, configs and logs too)
#
# Safe to run twice, and after a crash. It touches only what up.sh made:
#   1. kills the containers of its containerd (ctr tasks kill -9), then the processes
#      still in the kubelet's pod cgroups (kubepods), and the shims whose command line
#      names its containerd socket;
#   2. stops its daemons, newest first, by pid file only (TERM, then KILL after 10 s);
#   3. unmounts everything under the state dir and the kubelet root (/var/lib/kubelet);
#   4. removes iptables KUBE-* and CNI-* chains (filter, nat, mangle; IPv4 and IPv6) and the
#      rules that jump to them, the CNI bridge pav0, and the kubepods cgroups;
#   5. restores net.ipv4.ip_forward, deletes the runtime data (etcd, containerd, CNI, pod
#      logs) and the kubelet root. Keeps pki/, config/ and logs/ unless --purge.
# Env: as up.sh (hack/cluster/lib.sh).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PURGE=0
[ "${1:-}" = "--purge" ] && PURGE=1
[ "$(id -u)" -eq 0 ] || die "must run as root"
T0=$SECONDS

# 1. containers -------------------------------------------------------------------------------
if pid_of containerd >/dev/null && [ -S "$CTRD_SOCK" ]; then
  tasks="$(timeout 10 "$BIN/ctr" --address "$CTRD_SOCK" -n k8s.io tasks ls -q 2>/dev/null || true)"
  for t in $tasks; do
    timeout 5 "$BIN/ctr" --address "$CTRD_SOCK" -n k8s.io tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true
  done
  [ -n "$tasks" ] && log "killed $(echo "$tasks" | wc -w) container tasks"
fi

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
for i in 1 2 3; do
  pids="$(pod_pids)"
  [ -z "$pids" ] && break
  kill -9 $pids 2>/dev/null || true
  sleep 0.5
done

# 2. daemons ----------------------------------------------------------------------------------
stop_daemon() {
  local name="$1" pid i
  pid="$(pid_of "$name")" || { rm -f "$RUN/$name.pid"; return 0; }
  if [ "$name" = kube-proxy ]; then
    # remove kube-proxy's rules while the API is still there (best effort)
    timeout 20 "$BIN/kube-proxy" --config="$CONF/kube-proxy.yaml" --cleanup >>"$LOGS/kube-proxy.log" 2>&1 || true
  fi
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    log "$name: did not stop on TERM, sending KILL"
    kill -KILL "$pid" 2>/dev/null || true
    for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$RUN/$name.pid"
  log "$name: stopped (pid $pid)"
}
for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do stop_daemon "${DAEMONS[$i]}"; done

# shims of this containerd: their command line names its socket (never matched by name)
for p in /proc/[0-9]*; do
  pid="${p#/proc/}"
  exe="$(readlink "$p/exe" 2>/dev/null)" || continue
  exe="${exe% (deleted)}"
  [ "$exe" = "$BIN/containerd-shim-runc-v2" ] || continue
  if tr '\0' ' ' < "$p/cmdline" 2>/dev/null | grep -qF -- "$CTRD_SOCK"; then
    kill -9 "$pid" 2>/dev/null && log "killed shim $pid"
  fi
done
pids="$(pod_pids)"; [ -n "$pids" ] && kill -9 $pids 2>/dev/null

# 3. mounts -----------------------------------------------------------------------------------
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

# 4. network and cgroups ----------------------------------------------------------------------
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

# 5. host settings and data -------------------------------------------------------------------
if [ -f "$RUN/ip_forward.orig" ]; then
  cat "$RUN/ip_forward.orig" > /proc/sys/net/ipv4/ip_forward
  rm -f "$RUN/ip_forward.orig"
fi
if [ -z "$(our_mounts)" ]; then
  rm -rf --one-file-system "$ETCD_DATA" "$D/containerd" "$D/cni/networks" "$POD_LOGS" "$RUN"
  rm -rf --one-file-system "$KUBELET_ROOT"
  [ "$PURGE" = 1 ] && rm -rf --one-file-system "$D"
else
  log "WARNING: mounts remain; data not deleted"
fi
rmdir /run/containerd/s /run/containerd 2>/dev/null || true   # shim sockets' directory, if empty

# report what is left
left=""
for n in "${DAEMONS[@]}"; do [ -f "$RUN/$n.pid" ] && left+=" $n"; done
[ -n "$(our_mounts)" ] && left+=" mounts"
iptables -w -S 2>/dev/null | grep -qE '^-N (KUBE|CNI)-' && left+=" iptables-chains"
iptables -w -t nat -S 2>/dev/null | grep -qE '^-N (KUBE|CNI)-' && left+=" nat-chains"
ip link show "$BRIDGE" >/dev/null 2>&1 && left+=" bridge"
[ -n "$(pod_pids)" ] && left+=" pod-processes"
if [ -n "$left" ]; then
  log "down finished in $((SECONDS - T0)) s, but left:$left"
  exit 1
fi
log "cluster down in $((SECONDS - T0)) s; nothing left behind"
