#!/usr/bin/env bash
# hack/images/build.sh — build the local cluster's container images without Docker.
#
# Usage: hack/images/build.sh [--import] [IMAGE...]        (make images)
#   IMAGE is any of: pause busybox csi-provisioner pav registrar (default: all)
#   --import   also load them into the local cluster's containerd
#              (needs hack/cluster/up.sh to have started it; PAV_CLUSTER_DIR as for up.sh)
#
# Each image is a single-layer OCI image layout (layer tar, config JSON, manifest,
# index.json with the io.containerd.image.name annotation) written with tar and
# sha256sum only, archived as _output/images/<IMAGE>.tar and imported with
# `ctr -n k8s.io images import`. Images and their contents:
#   registry.k8s.io/pause:3.10     /pause, static Go build of test/images/pause
#   pav.local/busybox:dev          Debian's busybox-static + applet symlinks (/bin/sh …);
#                                  on import also tagged docker.io/library/busybox:1.36 (the
#                                  examples' image) so that examples run unmodified
#   pav.local/csi-provisioner:dev  /csi-provisioner (from hack/build-tools.sh)
#   pav.local/pav:dev              busybox + /usr/local/bin/pav (CGO_ENABLED=0 go build ./cmd/pav)
#   pav.local/registrar:dev        /csi-node-driver-registrar = test/registrar (test-only stand-in)
# Pods must use imagePullPolicy Never or IfNotPresent: there is no registry.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="${PAV_BIN_DIR:-$ROOT/_output/bin}"
OUT="$ROOT/_output/images"
CLUSTER_DIR="${PAV_CLUSTER_DIR:-$ROOT/_output/cluster}"
BUSYBOX="${BUSYBOX:-/bin/busybox}"

declare -A REF=(
  [pause]=registry.k8s.io/pause:3.10
  [busybox]=pav.local/busybox:dev
  [csi-provisioner]=pav.local/csi-provisioner:dev
  [pav]=pav.local/pav:dev
  [registrar]=pav.local/registrar:dev
)
ALL=(pause busybox csi-provisioner pav registrar)

do_import=0
images=()
for a in "$@"; do
  case "$a" in
    --import) do_import=1 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) [ -n "${REF[$a]:-}" ] || { echo "unknown image $a (known: ${ALL[*]})" >&2; exit 2; }
       images+=("$a") ;;
  esac
done
[ "${#images[@]}" -gt 0 ] || images=("${ALL[@]}")

log() { echo "images: $*" >&2; }
mkdir -p "$OUT"

gobuild() { # OUT PKG
  (cd "$ROOT" && CGO_ENABLED=0 nice -n 10 go build -trimpath -buildvcs=false -ldflags "-s -w" -o "$1" "$2")
}

# rootfs_base DIR: directories and files every image gets.
rootfs_base() {
  local r="$1"
  mkdir -p "$r"/{etc,tmp,proc,sys,dev,root,var/run,run}
  chmod 1777 "$r/tmp"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' > "$r/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\n' > "$r/etc/group"
  : > "$r/etc/hosts"; : > "$r/etc/resolv.conf"
}

# rootfs_busybox DIR: Debian's static busybox with a symlink per applet.
rootfs_busybox() {
  local r="$1" applet
  [ -x "$BUSYBOX" ] || { echo "$BUSYBOX missing: run hack/install-deps.sh" >&2; exit 1; }
  mkdir -p "$r"/{bin,sbin,usr/bin,usr/sbin}
  cp "$BUSYBOX" "$r/bin/busybox"
  "$BUSYBOX" --list-full | while read -r applet; do
    [ "$applet" = bin/busybox ] && continue
    mkdir -p "$r/$(dirname "$applet")"
    ln -sf /bin/busybox "$r/$applet"
  done
  [ -e "$r/bin/sh" ] || ln -sf /bin/busybox "$r/bin/sh"
}

# write_image NAME REF ROOTFS ENTRYPOINT_JSON CMD_JSON
write_image() {
  local name="$1" ref="$2" rootfs="$3" entrypoint="$4" cmd="$5"
  local lay="$OUT/$name.layout"
  rm -rf "$lay"; mkdir -p "$lay/blobs/sha256"
  local layer="$lay/layer.tar"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=posix \
      --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
      -C "$rootfs" -cf "$layer" .
  local ld lsize; ld=$(sha256sum "$layer" | cut -d' ' -f1); lsize=$(stat -c %s "$layer")
  mv "$layer" "$lay/blobs/sha256/$ld"

  local cfg="$lay/config.json"
  cat > "$cfg" <<EOF
{"architecture":"amd64","os":"linux","created":"1970-01-01T00:00:00Z","config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Entrypoint":$entrypoint,"Cmd":$cmd,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:$ld"]},"history":[{"created":"1970-01-01T00:00:00Z","created_by":"hack/images/build.sh $name"}]}
EOF
  local cd csize; cd=$(sha256sum "$cfg" | cut -d' ' -f1); csize=$(stat -c %s "$cfg")
  mv "$cfg" "$lay/blobs/sha256/$cd"

  local man="$lay/manifest.json"
  cat > "$man" <<EOF
{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:$cd","size":$csize},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:$ld","size":$lsize}]}
EOF
  local md msize; md=$(sha256sum "$man" | cut -d' ' -f1); msize=$(stat -c %s "$man")
  mv "$man" "$lay/blobs/sha256/$md"

  echo '{"imageLayoutVersion":"1.0.0"}' > "$lay/oci-layout"
  cat > "$lay/index.json" <<EOF
{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:$md","size":$msize,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"$ref","org.opencontainers.image.ref.name":"${ref##*:}"}}]}
EOF
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$lay" -cf "$OUT/$name.tar.tmp" oci-layout index.json blobs
  mv "$OUT/$name.tar.tmp" "$OUT/$name.tar"
  rm -rf "$lay"
  log "$ref -> _output/images/$name.tar ($(( (lsize + 1023) / 1024 )) KiB, layer sha256:${ld:0:12})"
}

build_one() {
  local name="$1" r="$OUT/$1.rootfs"
  rm -rf "$r"; mkdir -p "$r"
  rootfs_base "$r"
  case "$name" in
    pause)
      gobuild "$BIN/pause" ./test/images/pause
      cp "$BIN/pause" "$r/pause"
      write_image pause "${REF[pause]}" "$r" '["/pause"]' 'null' ;;
    busybox)
      rootfs_busybox "$r"
      write_image busybox "${REF[busybox]}" "$r" 'null' '["sh"]' ;;
    csi-provisioner)
      [ -x "$BIN/csi-provisioner" ] || { echo "$BIN/csi-provisioner missing: run make tools" >&2; exit 1; }
      cp "$BIN/csi-provisioner" "$r/csi-provisioner"
      write_image csi-provisioner "${REF[csi-provisioner]}" "$r" '["/csi-provisioner"]' 'null' ;;
    pav)
      rootfs_busybox "$r"
      gobuild "$BIN/pav" ./cmd/pav
      mkdir -p "$r/usr/local/bin"; cp "$BIN/pav" "$r/usr/local/bin/pav"
      write_image pav "${REF[pav]}" "$r" '["/usr/local/bin/pav"]' 'null' ;;
    registrar)
      gobuild "$BIN/registrar" ./test/registrar
      cp "$BIN/registrar" "$r/csi-node-driver-registrar"
      write_image registrar "${REF[registrar]}" "$r" '["/csi-node-driver-registrar"]' 'null' ;;
  esac
  rm -rf "$r"
}

for i in "${images[@]}"; do build_one "$i"; done

if [ "$do_import" = 1 ]; then
  sock="$CLUSTER_DIR/run/containerd/containerd.sock"
  [ -S "$sock" ] || { echo "containerd socket $sock not found: run hack/cluster/up.sh" >&2; exit 1; }
  for i in "${images[@]}"; do
    # (ctr's output is shown only on failure: it warns about cgroup v1 on every call)
    out="$("$BIN/ctr" --address "$(realpath "$sock")" -n k8s.io images import --platform linux/amd64 "$OUT/$i.tar" 2>&1)" ||
      { echo "$out" >&2; exit 1; }
    log "imported ${REF[$i]}"
    if [ "$i" = busybox ]; then  # same local alias as hack/cluster/up.sh makes
      out="$("$BIN/ctr" --address "$(realpath "$sock")" -n k8s.io images tag --force "${REF[busybox]}" docker.io/library/busybox:1.36 2>&1)" ||
        { echo "$out" >&2; exit 1; }
    fi
  done
fi
