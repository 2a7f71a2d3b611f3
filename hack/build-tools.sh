#!/usr/bin/env bash
# hack/build-tools.sh — build the local cluster's binaries from the Go module proxy.
#
# Usage: hack/build-tools.sh [--force] [GROUP...]          (make tools)
#
# GROUPs: kubernetes csi-provisioner csi-sanity snapshotter containerd etcd rclone kwok helm
# e2e (csi: both csi-provisioner and csi-sanity); without any, every group but e2e (what the
# local cluster, make e2e, the benchmarks and the chart's tests use). e2e is built only for
# make conformance: it is the largest build here. make demo builds only the groups it uses
# (kubernetes containerd etcd csi-provisioner; hack/demo.sh), make test only helm.
#
# Builds into _output/bin/ (or $PAV_BIN_DIR):
#   kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl
#                                  k8s.io/kubernetes v1.36.3          (hack/tools/go.mod)
#   csi-provisioner                external-provisioner v6.3.0        (hack/tools/csi)
#   csi-sanity                     csi-test v5.6.0                    (hack/tools/csi; the e2e
#                                  suite runs it against the drivers on the cluster)
#   csi-snapshotter snapshot-controller
#                                  external-snapshotter v8.7.0        (hack/tools/snapshotter:
#                                  a module of its own, it pins k8s v0.37.0, csi pins v0.36.1)
#   containerd containerd-shim-runc-v2 ctr
#                                  containerd v2.4.2                  (hack/tools/containerd)
#   etcd                           etcd v3.6.11                       (hack/tools/etcd)
#   rclone                         rclone v1.76.0, the subset the object-bucket example uses
#                                  (hack/tools/rclone: local and S3 backends, serve s3, mount),
#                                  with the example's patch (examples/object-bucket/
#                                  rclone-close-to-open.patch, applied to a copy of the module's
#                                  source in _output/src by hack/tools/rclone/patched-source.sh)
#   kwok                           kwok v0.8.0, the controller that simulates nodes and pods
#                                  (hack/tools/kwok; test/scale, make bench-scale)
#   helm                           helm v4.3.1, the CLI (hack/tools/helm): the chart charts/pav
#                                  (make test: helm lint, helm template; the e2e suite: helm
#                                  install, upgrade, uninstall)
#   e2e.test ginkgo agnhost        k8s.io/kubernetes v1.36.3's end-to-end suite (go test -c
#                                  k8s.io/kubernetes/test/e2e), the ginkgo v2 CLI, and the
#                                  program of the suite's agnhost image (hack/tools/e2e)
# All are static (CGO_ENABLED=0). Idempotent: a group is rebuilt only when one of its
# binaries is missing or its stamp (hash of go.mod, go.sum, Go version and flags) changed;
# --force (or FORCE=1) rebuilds everything. Groups build one after another under `nice -n 10`;
# a group's commands build in one `go build`, whose links overlap the other commands'
# compiles. Each group says what it builds and how long it took; a summary closes the run.
# Respects GOCACHE/GOMODCACHE/GOFLAGS from the environment. Needs ≈ 7 GB for the Go caches.
# Debian packages (runc, CNI plugins, iptables, …) come from hack/install-deps.sh instead.
# Runs at once build each group once: a lock per group (_output/bin/.stamps/GROUP.lock).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${PAV_BIN_DIR:-$ROOT/_output/bin}"
STAMPS="$BIN/.stamps"
TOOLS="$ROOT/hack/tools"
FORCE="${FORCE:-0}"
ALL_GROUPS=(kubernetes csi-provisioner csi-sanity snapshotter containerd etcd rclone kwok helm e2e)
groups=()
for a in "$@"; do
  case "$a" in
    --force) FORCE=1 ;;
    csi) groups+=(csi-provisioner csi-sanity) ;;  # the group's name before it was split
    *) [[ " ${ALL_GROUPS[*]} " == *" $a "* ]] || { echo "build-tools: unknown group $a (known: ${ALL_GROUPS[*]} csi)" >&2; exit 2; }
       groups+=("$a") ;;
  esac
done
[ "${#groups[@]}" -gt 0 ] || groups=(kubernetes csi-provisioner csi-sanity snapshotter containerd etcd rclone kwok helm)
wanted() { [[ " ${groups[*]} " == *" $1 "* ]]; }
mkdir -p "$BIN" "$STAMPS"

export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:-$(go env GOFLAGS)} -trimpath -buildvcs=false"
NICE=(nice -n 10)

K8S_VERSION=v1.36.3
CONTAINERD_VERSION=v2.4.2
ETCD_VERSION=v3.6.11
HELM_VERSION=v4.3.1

log() { echo "build-tools: $*" >&2; }
T0=$SECONDS
summary=()

# build GROUP MODULE_DIR "LDFLAGS" "TAGS" PKG=BINARY...: go build the PKGs, or with
# PKG@test, go test -c it (a test binary: e2e.test). The commands whose binary is named
# after their package's directory (kube-apiserver, kubelet, ...) build in one `go build -o
# DIR/`: two cores then link one command while compiling the next, instead of idling a
# core through each link (the kubernetes group's six links are minutes of it).
build() {
  local group="$1" dir="$2" ldflags="$3" tags="$4"; shift 4
  wanted "$group" || return 0
  # One build of a group at a time (make ci builds helm for the unit tests while
  # e2e-prebuild builds every group): the second waits, then finds the group up to date.
  local lock
  exec {lock}>"$STAMPS/$group.lock"
  flock "$lock"
  build_locked "$group" "$dir" "$ldflags" "$tags" "$@"
  exec {lock}>&-
}

build_locked() {
  local group="$1" dir="$2" ldflags="$3" tags="$4"; shift 4
  local stamp want missing=0 spec
  want="$( { cat "$dir/go.mod" "$dir/go.sum"; go version; echo "$ldflags|$tags|$GOFLAGS|$*"; } | sha256sum | cut -d' ' -f1)"
  for spec in "$@"; do [ -x "$BIN/${spec#*=}" ] || missing=1; done
  stamp="$(cat "$STAMPS/$group" 2>/dev/null || true)"
  if [ "$FORCE" != 1 ] && [ "$missing" = 0 ] && [ "$stamp" = "$want" ]; then
    log "$group: up to date"
    return 0
  fi
  local start=$SECONDS together=() alone=() outs=() pkg out
  for spec in "$@"; do
    pkg="${spec%%=*}" out="${spec#*=}"
    if [[ "$pkg" != *@test && "${pkg##*/}" == "$out" ]]; then
      together+=("$pkg"); outs+=("$out")
    else
      alone+=("$spec")
    fi
  done
  if [ "${#together[@]}" -gt 0 ]; then
    local tmp="$BIN/.build-$group"
    rm -rf "$tmp"; mkdir -p "$tmp"
    log "$group: building ${outs[*]} (${together[*]})"
    (cd "$dir" && "${NICE[@]}" go build -tags "$tags" -ldflags "$ldflags" -o "$tmp/" "${together[@]}")
    for out in "${outs[@]}"; do mv -f "$tmp/$out" "$BIN/$out"; done
    rm -rf "$tmp"
  fi
  for spec in ${alone[@]+"${alone[@]}"}; do
    pkg="${spec%%=*}" out="${spec#*=}"
    log "$group: building $out ($pkg)"
    if [[ "$pkg" == *@test ]]; then
      (cd "$dir" && "${NICE[@]}" go test -c -tags "$tags" -ldflags "$ldflags" -o "$BIN/$out.tmp" "${pkg%@test}")
    else
      (cd "$dir" && "${NICE[@]}" go build -tags "$tags" -ldflags "$ldflags" -o "$BIN/$out.tmp" "$pkg")
    fi
    mv -f "$BIN/$out.tmp" "$BIN/$out"
  done
  echo "$want" > "$STAMPS/$group"
  log "$group: done in $((SECONDS - start)) s"
  summary+=("$(printf '%6d s  %s' $((SECONDS - start)) "$group")")
}

KV=k8s.io/component-base/version
CV=k8s.io/client-go/pkg/version
K8S_LDFLAGS="-s -w"
for v in "$KV" "$CV"; do
  K8S_LDFLAGS+=" -X $v.gitVersion=$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=36"
  K8S_LDFLAGS+=" -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z"
done

build kubernetes "$TOOLS" "$K8S_LDFLAGS" "" \
  k8s.io/kubernetes/cmd/kube-apiserver=kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager=kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler=kube-scheduler \
  k8s.io/kubernetes/cmd/kubelet=kubelet \
  k8s.io/kubernetes/cmd/kube-proxy=kube-proxy \
  k8s.io/kubernetes/cmd/kubectl=kubectl

build csi-provisioner "$TOOLS/csi" "-s -w -X main.version=v6.3.0" "" \
  github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner=csi-provisioner

build csi-sanity "$TOOLS/csi" "-s -w" "" \
  github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity=csi-sanity

build snapshotter "$TOOLS/snapshotter" "-s -w -X main.version=v8.7.0" "" \
  github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter=csi-snapshotter \
  github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller=snapshot-controller

CD=github.com/containerd/containerd/v2/version
build containerd "$TOOLS/containerd" \
  "-s -w -X $CD.Version=$CONTAINERD_VERSION -X $CD.Revision=proxy -X $CD.Package=github.com/containerd/containerd/v2" \
  "no_btrfs no_devmapper no_zfs" \
  github.com/containerd/containerd/v2/cmd/containerd=containerd \
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2=containerd-shim-runc-v2 \
  github.com/containerd/containerd/v2/cmd/ctr=ctr

build etcd "$TOOLS/etcd" "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION" "" \
  go.etcd.io/etcd/server/v3=etcd

if wanted rclone; then
  # The patched source's go.mod (-modfile): its path names the patch's version, which the
  # group's stamp (GOFLAGS) then follows.
  rclone_mod="$("$TOOLS/rclone/patched-source.sh" "$ROOT/_output/src")"
  GOFLAGS="$GOFLAGS -modfile=$rclone_mod" build rclone "$TOOLS/rclone" "-s -w -X github.com/rclone/rclone/fs.VersionSuffix=pav" "" \
    .=rclone
fi

build kwok "$TOOLS/kwok" "-s -w" "" \
  sigs.k8s.io/kwok/cmd/kwok=kwok

HV=helm.sh/helm/v4/internal/version
build helm "$TOOLS/helm" "-s -w -X $HV.version=$HELM_VERSION -X $HV.metadata= -X $HV.gitTreeState=clean" "" \
  helm.sh/helm/v4/cmd/helm=helm

# e2e.test reports the version it was built from (its -version flag, and the suite checks
# some specs against the server's version), as the cluster's binaries do.
build e2e "$TOOLS/e2e" "$K8S_LDFLAGS" "" \
  k8s.io/kubernetes/test/e2e@test=e2e.test \
  github.com/onsi/ginkgo/v2/ginkgo=ginkgo \
  k8s.io/kubernetes/test/images/agnhost=agnhost

log "binaries in $BIN; $((SECONDS - T0)) s in all"
for line in ${summary[@]+"${summary[@]}"}; do log "$line"; done
