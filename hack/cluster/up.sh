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

NODE_NAME="${PAV_NODE_NAME:-$(hostname | tr 'A-Z' 'a-z')}"
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
  # cert NAME SUBJECT EKU [SANS]
  cert() {
    local name="$1" subj="$2" eku="$3" sans="${4:-}" ext
    openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/$name.key" 2>/dev/null
    ext="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=$eku"
    [ -n "$sans" ] && ext+="
subjectAltName=$sans"
    openssl req -new -key "$PKI/$name.key" -subj "$subj" 2>/dev/null |
      openssl x509 -req -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial -days 3650 \
        -extfile <(echo "$ext") -out "$PKI/$name.crt" 2>/dev/null
  }
  cert apiserver "/CN=kube-apiserver" serverAuth \
    "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:$NODE_NAME,IP:127.0.0.1,IP:$NODE_IP,IP:10.0.0.1"
  cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
  cert admin "/O=system:masters/CN=kubernetes-admin" clientAuth
  cert controller-manager "/CN=system:kube-controller-manager" clientAuth
  cert scheduler "/CN=system:kube-scheduler" clientAuth
  cert kubelet-client "/O=system:nodes/CN=system:node:$NODE_NAME" clientAuth
  cert kube-proxy "/CN=system:kube-proxy" clientAuth
  cert kubelet-serving "/CN=$NODE_NAME" serverAuth "DNS:$NODE_NAME,DNS:localhost,IP:$NODE_IP,IP:127.0.0.1"
  openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
  openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  chmod 600 "$PKI"/*.key
  echo "$identity" > "$PKI/identity"
fi

# put FILE: write stdin to FILE only if the content changed (kube-proxy exits when its
# config file changes, so a second up.sh must not rewrite it).
put() {
  local tmp="$1.tmp.$$"
  cat > "$tmp"
  if cmp -s "$tmp" "$1"; then rm -f "$tmp"; else mv -f "$tmp" "$1"; fi
}

kubeconfig() { # FILE USER
  put "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: pav-local
  cluster:
    certificate-authority: $PKI/ca.crt
    server: https://127.0.0.1:$APISERVER_PORT
users:
- name: $2
  user:
    client-certificate: $PKI/$2.crt
    client-key: $PKI/$2.key
contexts:
- name: pav-local
  context: {cluster: pav-local, user: $2}
current-context: pav-local
EOF
}
kubeconfig "$KUBECONFIG_ADMIN" admin
for u in controller-manager scheduler kubelet-client kube-proxy; do kubeconfig "$CONF/$u.kubeconfig" "$u"; done

# ---------------------------------------------------------------------------------------------
# Configuration files.
put "$CONF/containerd.toml" <<EOF
version = 3
root = "$CTRD_ROOT"
state = "$CTRD_STATE"

[grpc]
  address = "$CTRD_SOCK"

[ttrpc]
  address = "$CTRD_SOCK.ttrpc"

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
          Root = "$RUNC_ROOT"
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ["$CNI_BIN"]
      conf_dir = "$CNI_CONF"
      max_conf_num = 1
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = "registry.k8s.io/pause:3.10"
EOF

put "$CNI_CONF/10-pav.conflist" <<EOF
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
        "ranges": [[{"subnet": "$POD_CIDR"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$CNI_DATA"
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF

put "$CONF/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$CTRD_SOCK
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization:
  mode: Webhook
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
address: 0.0.0.0
port: 10250
healthzBindAddress: 127.0.0.1
healthzPort: 10248
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
podLogsDir: $POD_LOGS
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

put "$CONF/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $CONF/kube-proxy.kubeconfig
mode: iptables
hostnameOverride: $NODE_NAME
clusterCIDR: $POD_CIDR
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

# ---------------------------------------------------------------------------------------------
# Daemons.
# start NAME ARGS...: start $BIN/NAME unless its pid file names a live NAME process.
start() {
  local name="$1"; shift
  local pid
  if pid="$(pid_of "$name")"; then
    log "$name: already running (pid $pid)"
    return 1
  fi
  : >> "$LOGS/$name.log"
  echo "==== $(date -Is) start" >> "$LOGS/$name.log"
  # The daemon keeps no inherited descriptor beyond 0-2: one held by whoever ran this script
  # (say, `flock /tmp/pav-cluster.lock make e2e`'s lock) would stay held as long as the
  # cluster runs.
  PATH="$BIN:$PATH" setsid bash -c 'for fd in /proc/$$/fd/*; do fd=${fd##*/}
      if [ "$fd" -gt 2 ] && [ -e "/proc/$$/fd/$fd" ]; then eval "exec $fd>&-"; fi; done
    echo $$ > "$0"; exec "$@"' "$RUN/$name.pid" "$BIN/$name" "$@" \
    >> "$LOGS/$name.log" 2>&1 < /dev/null &
  local i
  for i in $(seq 50); do [ -s "$RUN/$name.pid" ] && pid_of "$name" >/dev/null && break; sleep 0.1; done
  pid="$(pid_of "$name")" || die "$name did not start; see $LOGS/$name.log"
  log "$name: started (pid $pid, log $LOGS/$name.log)"
  return 0
}

# wait_for WHAT SECONDS CMD...: poll CMD every 0.2 s.
wait_for() {
  local what="$1" secs="$2"; shift 2
  local end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $end ] || die "timed out after ${secs}s waiting for $what (logs in $LOGS)"
    sleep 0.2
  done
}

# 1. containerd
start containerd --config "$CONF/containerd.toml" --log-level warn || true
wait_for "containerd" 30 ctr_ version

# 2. images
need=()
for i in pause busybox csi-provisioner pav registrar; do
  [ -f "$ROOT/_output/images/$i.tar" ] || need+=("$i")
done
if [ "${#need[@]}" -gt 0 ]; then
  log "images: building ${need[*]}"
  "$ROOT/hack/images/build.sh" "${need[@]}"
fi
for t in "$ROOT"/_output/images/*.tar; do
  out="$(ctr_ -n k8s.io images import --platform linux/amd64 "$t" 2>&1)" || die "importing $t: $out"
done
# Local aliases, so that the examples' public busybox image (imagePullPolicy IfNotPresent)
# runs unmodified on this registry-less cluster.
BUSYBOX_ALIASES=(docker.io/library/busybox:1.36)
for alias in "${BUSYBOX_ALIASES[@]}"; do
  out="$(ctr_ -n k8s.io images tag --force pav.local/busybox:dev "$alias" 2>&1)" || die "tagging $alias: $out"
done
log "images: imported $(ls "$ROOT"/_output/images/*.tar | wc -l) archives"

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
node_ready() {
  local out st hb
  out="$(kubectl_admin get node "$NODE_NAME" -o jsonpath='{range .status.conditions[?(@.type=="Ready")]}{.status} {.lastHeartbeatTime}{end}' 2>/dev/null)" || return 1
  st="${out%% *}"; hb="${out#* }"
  [ "$st" = True ] && [[ ! "$hb" < "$KUBELET_START" ]]
}
wait_for "node $NODE_NAME Ready (heartbeat ≥ $KUBELET_START)" 90 node_ready
log "node $NODE_NAME: Ready"

# 7. kube-proxy
start kube-proxy --config="$CONF/kube-proxy.yaml" --v=1 || true
proxy_ok() { curl -sf http://127.0.0.1:10256/healthz >/dev/null; }
wait_for "kube-proxy /healthz" 60 proxy_ok

# 8. the default ServiceAccount (pods cannot be created before it exists)
wait_for "ServiceAccount default/default" 60 kubectl_admin -n default get serviceaccount default
log "cluster up in $((SECONDS - T0)) s; export KUBECONFIG=$KUBECONFIG_ADMIN"
echo "$KUBECONFIG_ADMIN"
