#!/usr/bin/env bash
# hack/cluster/up.sh — start a real single-node Kubernetes v1.36.3 on this machine.
#
# Usage: hack/cluster/up.sh                      (make cluster-up; as root)
#        export KUBECONFIG=$(hack/cluster/up.sh)  # it prints the admin kubeconfig path on stdout
#
# Needs: hack/install-deps.sh (runc, CNI plugins, iptables, conntrack, openssl, busybox-static)
# and hack/build-tools.sh (_output/bin). Builds the images (hack/images/build.sh) if their
# archives are missing, and imports them into containerd on every start.
#
# Everything lives under one state directory, $PAV_CLUSTER_DIR (default _output/cluster):
#   pki/ certificates (openssl; kept across runs)   config/ kubeconfigs and daemon configs
#   run/ pid files, containerd socket, runc root      logs/ one log per daemon
#   etcd/ containerd/ cni/ pod-logs/ runtime data (wiped by down.sh)
#   kubeconfig  the admin kubeconfig (O=system:masters)
# except the kubelet root, /var/lib/kubelet (PAV_KUBELET_ROOT), kept conventional for CSI,
# and what the daemons put in /var/log/containers, /var/log/pods, /var/lib/cni and
# /run/containerd (down.sh removes those of them that up.sh found missing).
# Other settings: see hack/cluster/lib.sh. Stop and clean up with hack/cluster/down.sh.
#
# Idempotent: daemons already running (by pid file) are left alone; only missing ones start.
# Start order: containerd → images → etcd → kube-apiserver → controller-manager, scheduler,
# kubelet → node Ready (heartbeat newer than this kubelet's start) → kube-proxy →
# the `default` ServiceAccount. Daemons run in their own session, started as
# `setsid bash -c 'echo $$ > PIDFILE; exec "$@"'` so the pid file is the daemon's own pid.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

T0=$SECONDS
[ "$(id -u)" -eq 0 ] || die "must run as root"
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl \
         containerd containerd-shim-runc-v2 ctr etcd; do
  [ -x "$BIN/$b" ] || die "$BIN/$b missing: run hack/build-tools.sh (make tools)"
done
for c in runc openssl iptables conntrack; do
  command -v "$c" >/dev/null || die "$c missing: run hack/install-deps.sh"
done
[ -x "$CNI_BIN/bridge" ] || die "CNI plugins missing in $CNI_BIN: run hack/install-deps.sh"

NODE_NAME="$(node1_name)"
if [ -z "${PAV_NODE_IP:-}" ]; then
  PAV_NODE_IP="$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p' | head -1)"
fi
NODE_IP="${PAV_NODE_IP:-127.0.0.1}"
# Host directories that the daemons create outside the state dir: remember those that did
# not exist before, so that down.sh removes exactly these (the list survives down.sh).
for hd in "${HOST_DIRS[@]}"; do
  [ -e "$hd" ] || grep -qxF "$hd" "$HOST_DIRS_CREATED" 2>/dev/null || echo "$hd" >> "$HOST_DIRS_CREATED"
done
mkdir -p "$PKI" "$RUN" "$LOGS" "$CONF" "$ETCD_DATA" "$CTRD_ROOT" "$CTRD_STATE" \
         "$(dirname "$CTRD_SOCK")" "$CNI_CONF" "$CNI_DATA" "$RUNC_ROOT" "$POD_LOGS" "$KUBELET_ROOT"
chmod 700 "$ETCD_DATA" "$PKI"

# ---------------------------------------------------------------------------------------------
# Host settings (recorded so that down.sh can restore them).
if [ ! -f "$RUN/ip_forward.orig" ]; then
  cat /proc/sys/net/ipv4/ip_forward > "$RUN/ip_forward.orig"
fi
echo 1 > /proc/sys/net/ipv4/ip_forward
# bridged pod traffic must traverse iptables (Service DNAT between pods on the bridge)
modprobe br_netfilter 2>/dev/null || true
[ "$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null)" = 1 ] ||
  log "WARNING: net.bridge.bridge-nf-call-iptables is not 1: pod-to-Service-to-pod traffic may fail"

# ---------------------------------------------------------------------------------------------
# Certificates.
identity="$NODE_NAME $NODE_IP"
if [ "$(cat "$PKI/identity" 2>/dev/null)" != "$identity" ]; then
  log "pki: generating certificates for node $NODE_NAME ($NODE_IP)"
  rm -f "$PKI"/*
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/ca.key" 2>/dev/null
  openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=pav-local-ca" -days 3650 -out "$PKI/ca.crt" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"
  cert "$PKI" apiserver "/CN=kube-apiserver" serverAuth \
    "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:$NODE_NAME,IP:127.0.0.1,IP:$NODE_IP,IP:10.0.0.1"
  cert "$PKI" apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
  cert "$PKI" admin "/O=system:masters/CN=kubernetes-admin" clientAuth
  cert "$PKI" controller-manager "/CN=system:kube-controller-manager" clientAuth
  cert "$PKI" scheduler "/CN=system:kube-scheduler" clientAuth
  cert "$PKI" kubelet-client "/O=system:nodes/CN=system:node:$NODE_NAME" clientAuth
  cert "$PKI" kube-proxy "/CN=system:kube-proxy" clientAuth
  cert "$PKI" kubelet-serving "/CN=$NODE_NAME" serverAuth "DNS:$NODE_NAME,DNS:localhost,IP:$NODE_IP,IP:127.0.0.1"
  openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
  openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  chmod 600 "$PKI"/*.key
  echo "$identity" > "$PKI/identity"
fi

kubeconfig "$KUBECONFIG_ADMIN" admin
for u in controller-manager scheduler kubelet-client kube-proxy; do kubeconfig "$CONF/$u.kubeconfig" "$u"; done

# ---------------------------------------------------------------------------------------------
# Configuration files.
containerd_config "$CONF/containerd.toml" "$CTRD_ROOT" "$CTRD_STATE" "$CTRD_SOCK" "$RUNC_ROOT" "$CNI_CONF"
cni_config "$CNI_CONF/10-pav.conflist" "$POD_CIDR" "$CNI_DATA"
kubelet_config "$CONF/kubelet.yaml" "$CTRD_SOCK" "$PKI" "$POD_LOGS"
kube_proxy_config "$CONF/kube-proxy.yaml" "$CONF/kube-proxy.kubeconfig" "$NODE_NAME"

# ---------------------------------------------------------------------------------------------
# Daemons.
# start NAME ARGS...: start $BIN/NAME unless its pid file names a live NAME process.
start() {
  local name="$1"; shift
  local pid
  if pid="$(pid_of "$name")" || pid="$(supervisor_of "$name")"; then
    log "$name: already running (pid $pid)"
    return 1
  fi
  : >> "$LOGS/$name.log"
  echo "==== $(date -Is) start" >> "$LOGS/$name.log"
  # The daemon keeps no inherited descriptor beyond 0-2: one held by whoever ran this script
  # (say, `flock /tmp/pav-cluster.lock make e2e`'s lock) would stay held as long as the
  # cluster runs.
  local run='echo $$ > "$0"; exec "$@"'
  case "$name" in
    kube-scheduler|kube-controller-manager)
      # Restarted when they exit, as a real control plane's are (static pods, systemd): both
      # exit by design on an inconsistency they cannot repair, such as the scheduler's cache
      # after an API server crash lost a binding's answer. The supervisor's pid is in
      # NAME.supervisor.pid (down.sh stops it first), the daemon's in NAME.pid.
      # shellcheck disable=SC2016
      run='echo $$ > "${0%.pid}.supervisor.pid"; trap "kill -TERM \$child 2>/dev/null; wait; exit 0" TERM
        while :; do
          "$@" & child=$!; echo "$child" > "$0"; wait "$child"; rc=$?
          echo "==== $(date -Is) exited ($rc): restarting in 1 s"; sleep 1
        done' ;;
  esac
  PATH="$BIN:$PATH" setsid bash -c 'for fd in /proc/$$/fd/*; do fd=${fd##*/}
      if [ "$fd" -gt 2 ] && [ -e "/proc/$$/fd/$fd" ]; then eval "exec $fd>&-"; fi; done
    '"$run" "$RUN/$name.pid" "$BIN/$name" "$@" \
    >> "$LOGS/$name.log" 2>&1 < /dev/null &
  local i
  for i in $(seq 50); do [ -s "$RUN/$name.pid" ] && pid_of "$name" >/dev/null && break; sleep 0.1; done
  pid="$(pid_of "$name")" || die "$name did not start; see $LOGS/$name.log"
  log "$name: started (pid $pid, log $LOGS/$name.log)"
  return 0
}


# 1. containerd
start containerd --config "$CONF/containerd.toml" --log-level warn || true
wait_for "containerd" 30 ctr_ version

# 2. images
need=()
for i in pause busybox csi-provisioner pav; do
  [ -f "$ROOT/_output/images/$i.tar" ] || need+=("$i")
done
if [ "${#need[@]}" -gt 0 ]; then
  log "images: building ${need[*]}"
  "$ROOT/hack/images/build.sh" "${need[@]}"
fi
import_images "$CTRD_SOCK"
log "images: imported $(ls "$ROOT"/_output/images/*.tar | wc -l) archives, and the stock sidecars of ${SIDECARS}"

# 3. etcd
start etcd --name pav --data-dir "$ETCD_DATA" \
  --listen-client-urls "$ETCD_CLIENT" --advertise-client-urls "$ETCD_CLIENT" \
  --listen-peer-urls "$ETCD_PEER" --initial-advertise-peer-urls "$ETCD_PEER" \
  --initial-cluster "pav=$ETCD_PEER" --listen-metrics-urls http://127.0.0.1:2381 \
  --unsafe-no-fsync --log-level warn || true
etcd_ok() { curl -sf "$ETCD_CLIENT/health" | grep -q '"health":"true"'; }
wait_for "etcd /health" 30 etcd_ok

# 4. kube-apiserver
start kube-apiserver \
  --etcd-servers="$ETCD_CLIENT" \
  --bind-address=0.0.0.0 --secure-port="$APISERVER_PORT" --advertise-address="$NODE_IP" \
  --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
  --client-ca-file="$PKI/ca.crt" \
  --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
  --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
  --kubelet-certificate-authority="$PKI/ca.crt" \
  --kubelet-preferred-address-types=InternalIP,Hostname \
  --service-account-key-file="$PKI/sa.pub" \
  --service-account-signing-key-file="$PKI/sa.key" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
  --allow-privileged=true --service-cluster-ip-range="$SERVICE_CIDR" \
  --profiling=false --v=1 || true
api_ok() {
  curl -sf --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
    "https://127.0.0.1:$APISERVER_PORT/readyz" | grep -q '^ok'
}
wait_for "kube-apiserver /readyz" 90 api_ok
log "kube-apiserver: ready"

# 5. controller-manager, scheduler, kubelet
start kube-controller-manager \
  --kubeconfig="$CONF/controller-manager.kubeconfig" \
  --authentication-kubeconfig="$CONF/controller-manager.kubeconfig" \
  --authorization-kubeconfig="$CONF/controller-manager.kubeconfig" \
  --bind-address=127.0.0.1 --controllers='*' --use-service-account-credentials=true \
  --leader-elect=false --allocate-node-cidrs=false --service-cluster-ip-range="$SERVICE_CIDR" \
  --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
  --root-ca-file="$PKI/ca.crt" --service-account-private-key-file="$PKI/sa.key" \
  --profiling=false --v=1 || true
start kube-scheduler \
  --kubeconfig="$CONF/scheduler.kubeconfig" \
  --authentication-kubeconfig="$CONF/scheduler.kubeconfig" \
  --authorization-kubeconfig="$CONF/scheduler.kubeconfig" \
  --bind-address=127.0.0.1 --leader-elect=false --profiling=false --v=1 || true

start kubelet --config="$CONF/kubelet.yaml" --kubeconfig="$CONF/kubelet-client.kubeconfig" \
  --root-dir="$KUBELET_ROOT" --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --v=1 || true
# The kubelet's start time (whole seconds, UTC), to reject a stale Ready left in etcd.
kpid="$(pid_of kubelet)"
KUBELET_START="$(date -u -d "@$(( $(date +%s) - $(ps -o etimes= -p "$kpid") ))" +%Y-%m-%dT%H:%M:%SZ)"
kubelet_ok() { curl -sf http://127.0.0.1:10248/healthz | grep -q ok; }
wait_for "kubelet /healthz" 60 kubelet_ok

# 6. node Ready with a heartbeat from this kubelet
wait_for "node $NODE_NAME Ready (heartbeat ≥ $KUBELET_START)" 90 node_ready "$NODE_NAME" "$KUBELET_START"
log "node $NODE_NAME: Ready"

# 7. kube-proxy
start kube-proxy --config="$CONF/kube-proxy.yaml" --v=1 || true
proxy_ok() { curl -sf http://127.0.0.1:10256/healthz >/dev/null; }
wait_for "kube-proxy /healthz" 60 proxy_ok

# 8. the default ServiceAccount (pods cannot be created before it exists)
wait_for "ServiceAccount default/default" 60 kubectl_admin -n default get serviceaccount default

# 9. extra nodes (PAV_NODES > 1): each in namespaces of its own, reaching the API server at
# node 1's address (hack/cluster/node.sh)
echo "$NODE_IP" > "$RUN/node-ip"
if [ "$NODES" -gt 1 ]; then
  [ "$NODE_IP" != 127.0.0.1 ] || die "PAV_NODES=$NODES: extra nodes reach node 1 by its address; set PAV_NODE_IP (this machine has no default route)"
  for n in $(seq 2 "$NODES"); do "$ROOT/hack/cluster/node.sh" start "$NODE_NAME-$n"; done
fi
log "cluster up in $((SECONDS - T0)) s ($NODES node(s)); export KUBECONFIG=$KUBECONFIG_ADMIN"
echo "$KUBECONFIG_ADMIN"
