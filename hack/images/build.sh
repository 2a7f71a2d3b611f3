#!/usr/bin/env bash
# hack/images/build.sh — build the local cluster's container images without Docker.
#
# Usage: hack/images/build.sh [--import] [IMAGE...]        (make images)
#   IMAGE is any of: pause busybox csi-provisioner csi-snapshotter snapshot-controller pav
#                    loop-block encryption encrypted-fs object-bucket
#                    snapshot-metadata-client (default: all these)
#                    e2e-agnhost e2e-busybox e2e-nginx e2e-glibc-dns-testing
#                    e2e-hello-populator e2e-volume-data-source-validator (make conformance;
#                    never by default; "conformance" names these six)
#   --import   also load them into the local cluster's containerd (every node's)
#              (needs hack/cluster/up.sh to have started it; PAV_CLUSTER_DIR as for up.sh)
#   all        the default list (the first three lines above), e.g. `all conformance`
# Images are built IMAGE_JOBS at a time (default: the number of CPUs): most of an image's time
# is one process (a link, dpkg-deb, tar, sha256sum), so idle cores build the next ones (beside
# other builds, as in make ci's prebuild, the cores are busy anyway).
# Progress: each image says when it starts and how long it took; a summary closes the run.
# make demo builds only the images it uses: pause busybox csi-provisioner pav.
# The stock sidecars the Go module proxy does not serve (node-driver-registrar, external-resizer,
# livenessprobe) are not built here: hack/cluster imports them from ../shared/sidecars.
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
#   pav.local/csi-snapshotter:dev  /csi-snapshotter (from hack/build-tools.sh)
#   pav.local/snapshot-metadata-client:dev
#                                  /snapshot-metadata-client (hack/tools/snapshot-metadata: the
#                                  e2e suite's backup application, external-snapshot-metadata's
#                                  pkg/iterator) over busybox, /etc/nsswitch.conf "files dns"
#   pav.local/snapshot-controller:dev
#                                  /snapshot-controller (from hack/build-tools.sh)
#   pav.local/pav:dev              busybox + /usr/local/bin/pav, pav-driver and pav-report
#                                  (CGO_ENABLED=0 go build ./cmd/pav ./cmd/pav-driver ./cmd/pav-report)
# The examples' images (examples/<name>/Dockerfile is what a user builds elsewhere, FROM
# debian:bookworm-slim; here the same Debian packages go on top of busybox):
#   pav.local/loop-block:dev       Debian mount util-linux e2fsprogs coreutils (cp --sparse)
#                                  perl-base (the snapshotMetadata pod: SEEK_DATA/SEEK_HOLE)
#   pav.local/encryption:dev       Debian cryptsetup-bin dmsetup util-linux jq
#   pav.local/encrypted-fs:dev     Debian gocryptfs fuse3 util-linux
#   pav.local/object-bucket:dev    Debian fuse3 + /usr/local/bin/rclone (hack/tools/rclone, built
#                                  by hack/build-tools.sh)
# Kubernetes' end-to-end suite's images, under the registry test/conformance/repo-list.yaml
# gives the suite (KUBE_TEST_REPO_LIST: promoterE2eRegistry), with the suite's tags:
#   pav.local/e2e-test-images/agnhost:2.63.0
#                                  /agnhost (k8s.io/kubernetes/test/images/agnhost, built by
#                                  hack/build-tools.sh e2e; entrypoint /agnhost pause, as
#                                  upstream's) over busybox for the shell the specs exec, and
#                                  an nsenter that reaches the node's mount namespace where
#                                  PID 1's cannot be opened (hack/images/e2e-agnhost/nsenter)
#   pav.local/e2e-test-images/busybox:1.37.0-1
#                                  busybox with Debian's bash as sh and GNU coreutils over it:
#                                  the specs use busybox 1.37's options (dd oflag=nocache),
#                                  which Debian's busybox 1.35 lacks and GNU's tools have, and
#                                  its shell's `let`, which dash lacks
#   pav.local/e2e-test-images/nginx:1.15-4, pav.local/e2e-test-images/glibc-dns-testing:2.0.0
#                                  the same, under the names of the images that the storage
#                                  specs run a shell command in (exec, multi-pod volumes): a
#                                  stand-in, not nginx or glibc; its default command serves
#                                  HTTP on port 80 (busybox httpd) or sleeps
# The images the storage suite's "any volume data source" spec deploys, under their upstream
# names (registry.k8s.io/sig-storage: the suite's default for them), test-only stand-ins built
# from this repository because the Go module proxy refuses their source:
#   registry.k8s.io/sig-storage/hello-populator:v1.0.1
#                                  /hello-populator = test/hello-populator (lib-volume-populator's
#                                  example hello-populator); the spec deploys it as the controller,
#                                  which runs it again (--image-name, IfNotPresent) as populator pods
#   registry.k8s.io/sig-storage/volume-data-source-validator:v1.0.0
#                                  /volume-data-source-validator = test/volume-data-source-validator
# Such an image is a merged-/usr tree (/bin, /sbin, /lib, /lib64 link into /usr, as in
# debian:bookworm) with Debian's dash (bash for the suite's images) as /bin/sh (Debian's
# busybox shell runs its own applets before PATH), busybox applets for the small tools, and
# the Depends/Pre-Depends closure of its package list unpacked over it: `apt-cache depends` (first alternative; a
# virtual package's first provider), `apt-get download` into _output/images/debs (kept and
# reused), `dpkg-deb --fsys-tarfile | tar -x`. Maintainer scripts never run, so packages that
# only they need (adduser, debconf, perl-base, …: DEB_EXCLUDE) are left out; a busybox applet
# is dropped where a Debian binary of the same name exists; each image's tools run once in a
# chroot of it (DEB_SMOKE) before it is written.
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
  [csi-snapshotter]=pav.local/csi-snapshotter:dev
  [snapshot-controller]=pav.local/snapshot-controller:dev
  [pav]=pav.local/pav:dev
  [loop-block]=pav.local/loop-block:dev
  [snapshot-metadata-client]=pav.local/snapshot-metadata-client:dev
  [encryption]=pav.local/encryption:dev
  [encrypted-fs]=pav.local/encrypted-fs:dev
  [object-bucket]=pav.local/object-bucket:dev
  [e2e-agnhost]=pav.local/e2e-test-images/agnhost:2.63.0
  [e2e-busybox]=pav.local/e2e-test-images/busybox:1.37.0-1
  [e2e-nginx]=pav.local/e2e-test-images/nginx:1.15-4
  [e2e-glibc-dns-testing]=pav.local/e2e-test-images/glibc-dns-testing:2.0.0
  [e2e-hello-populator]=registry.k8s.io/sig-storage/hello-populator:v1.0.1
  [e2e-volume-data-source-validator]=registry.k8s.io/sig-storage/volume-data-source-validator:v1.0.0
)
ALL=(pause busybox csi-provisioner csi-snapshotter snapshot-controller pav loop-block encryption encrypted-fs object-bucket snapshot-metadata-client)
# The argument "conformance" stands for the images of make conformance (hack/conformance.sh).
CONFORMANCE=(e2e-agnhost e2e-busybox e2e-nginx e2e-glibc-dns-testing e2e-hello-populator e2e-volume-data-source-validator)

# The examples' images: their Debian packages, and the smoke test run in each one's chroot.
declare -A DEB_PKGS=(
  [loop-block]="dash mount util-linux e2fsprogs coreutils perl-base"
  [encryption]="dash cryptsetup-bin dmsetup util-linux jq"
  [encrypted-fs]="dash gocryptfs fuse3 util-linux"
  [object-bucket]="dash fuse3"
  [e2e-busybox]="bash coreutils"
  [e2e-nginx]="bash coreutils"
  [e2e-glibc-dns-testing]="bash coreutils"
)
# The suite's images stand in for busybox 1.37, whose sh (ash) has bash's `let`, `echo -n`
# and arithmetic: its volume I/O specs write their test file with `let i+=1` in a loop, which
# under dash never ends. Their /bin/sh is bash.
E2E_SH_SMOKE='i=0; let i+=1; [ "$(echo -n x; echo $((i + 1)))" = x2 ]'
declare -A DEB_SMOKE=(
  [loop-block]="losetup --version && mkfs.ext4 -V && e2fsck -V && blockdev --version && mountpoint --version && findmnt --version && cp --sparse=always --version >/dev/null && truncate --version >/dev/null && perl -e 'use POSIX qw(ENXIO); sysseek(STDIN, 0, 3); exit 0' </dev/null"
  [encryption]="cryptsetup --version && command -v dmsetup && jq --version && blockdev --version && wipefs --version"
  [encrypted-fs]="gocryptfs -version && fusermount3 --version && mountpoint --version"
  [object-bucket]="rclone version && fusermount3 --version"
  [e2e-busybox]="$E2E_SH_SMOKE && dd if=/dev/zero of=/dev/null oflag=nocache bs=512 count=1 && blockdev --help 2>&1 | grep -q getss && sha256sum /dev/null && base64 /dev/null"
  [e2e-nginx]="$E2E_SH_SMOKE && dd if=/dev/zero of=/dev/null oflag=nocache bs=512 count=1 && httpd --help 2>&1 | grep -q -- -f"
  [e2e-glibc-dns-testing]="$E2E_SH_SMOKE && dd if=/dev/zero of=/dev/null oflag=nocache bs=512 count=1"
)
# Left out of every closure: needed only by maintainer scripts, or busybox does their job
# (unless an image names one in DEB_PKGS: loop-block's copies need GNU cp --sparse, and its
# snapshotMetadata pod perl).
DEB_EXCLUDE=" adduser passwd debconf cdebconf dpkg install-info debianutils base-files base-passwd bash coreutils sed tar perl-base libpam-modules libpam-modules-bin libpam-runtime "


do_import=0
images=()
for a in "$@"; do
  case "$a" in
    --import) do_import=1 ;;
    all) images+=("${ALL[@]}") ;;
    conformance) images+=("${CONFORMANCE[@]}") ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/!p}' "$0"; exit 0 ;;
    *) [ -n "${REF[$a]:-}" ] || { echo "unknown image $a (known: ${ALL[*]} ${CONFORMANCE[*]}; all for the first ${#ALL[@]}, conformance for the last six)" >&2; exit 2; }
       images+=("$a") ;;
  esac
done
[ "${#images[@]}" -gt 0 ] || images=("${ALL[@]}")
# each once (they build at once: two builds of one image would share its directories)
declare -A listed=(); uniq=()
for i in "${images[@]}"; do [ -n "${listed[$i]:-}" ] || { listed[$i]=1; uniq+=("$i"); }; done
images=("${uniq[@]}")

IMAGE_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin  # every image's PATH

log() { echo "images: $*" >&2; }
mkdir -p "$OUT"

gobuild() { # OUT PKG...: OUT a file, or a directory (ending in /) for several commands
  local out="$1"; shift
  (cd "$ROOT" && CGO_ENABLED=0 nice -n 10 go build -trimpath -buildvcs=false -ldflags "-s -w" -o "$out" "$@")
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

# deb_closure PKG...: the packages to unpack for PKG..., one a line (breadth first, one
# apt-cache call per level). DEB_EXCLUDE drops dependencies, never a PKG asked for.
deb_closure() {
  local -A seen=() asked=()
  local level=("$@") next p
  for p in "$@"; do asked[$p]=1; done
  while [ "${#level[@]}" -gt 0 ]; do
    next=()
    for p in "${level[@]}"; do
      [ -z "${seen[$p]:-}" ] || continue
      [ -n "${asked[$p]:-}" ] || case "$DEB_EXCLUDE" in *" $p "*) continue ;; esac
      seen[$p]=1
      echo "$p"
      next+=("$p")
    done
    [ "${#next[@]}" -gt 0 ] || break
    mapfile -t level < <(apt-cache depends --important "${next[@]}" | awk '
      /^[^ ]/ { in_alt = 0; want_provider = 0; next }       # a package of this level
      /^    / { if (want_provider) { print $1; want_provider = 0 } next }
      {
        alt = ($0 ~ /^ \|/)         # " |Depends: a" is followed by its alternatives
        sub(/^ *\|? *(Pre)?Depends: /, "")
        take = !in_alt
        in_alt = alt
        if (!take) next
        if ($0 ~ /^</) { want_provider = 1; next }   # virtual: its first provider follows
        print $0
      }' | sort -u)
  done
}

# rootfs_debs DIR NAME: merged /usr, busybox, and the Debian packages DEB_PKGS[NAME].
rootfs_debs() {
  local r="$1" name="$2" debs="$OUT/debs" p v f link a d pkgs=() files=()
  mkdir -p "$r"/usr/{bin,sbin,lib,lib64}
  for p in bin sbin lib lib64; do ln -s "usr/$p" "$r/$p"; done
  rootfs_busybox "$r"
  # shellcheck disable=SC2086 # a word list
  mapfile -t pkgs < <(deb_closure ${DEB_PKGS[$name]})
  mkdir -p "$debs"
  local -A cand=()
  while read -r p v; do cand[$p]="$v"; done < <(apt-cache policy "${pkgs[@]}" | awk '
    /^[^ ]/ { sub(/:$/, ""); p = $0 } /^  Candidate:/ { print p, $2 }')
  # One download at a time (images build at once): a .deb being downloaded for one image
  # must not be found, half written, by another.
  exec {lock}>"$debs/.download.lock"
  flock "$lock"
  for p in "${pkgs[@]}"; do
    v="${cand[$p]:-}"
    if [ -z "$v" ] || [ "$v" = "(none)" ]; then echo "no Debian package $p" >&2; exit 1; fi
    f="$(ls "$debs/${p}_${v//:/%3a}_"*.deb 2>/dev/null | head -1 || true)"
    if [ -z "$f" ]; then
      (cd "$debs" && apt-get download -qq "$p=$v" 2>/dev/null) || { echo "apt-get download $p=$v failed" >&2; exit 1; }
      f="$(ls "$debs/${p}_${v//:/%3a}_"*.deb | head -1)"
    fi
    files+=("$f")
  done
  exec {lock}>&-
  for f in "${files[@]}"; do
    dpkg-deb --fsys-tarfile "$f" | tar -x --keep-directory-symlink --no-same-owner -C "$r"
  done
  for link in $(find "$r/usr/bin" "$r/usr/sbin" -maxdepth 1 -type l -lname /bin/busybox); do
    a="${link##*/}"
    for d in usr/sbin usr/bin; do
      f="$r/$d/$a"
      if [ "$f" != "$link" ] && { [ -e "$f" ] || [ -L "$f" ]; } && [ "$(readlink "$f")" != /bin/busybox ]; then
        rm -f "$link"; break
      fi
    done
  done
  # /bin/sh: the first package's shell (dash; bash for the suite's images, below)
  ln -sf "${DEB_PKGS[$name]%% *}" "$r/usr/bin/sh"
  rm -rf "$r"/usr/share/{doc,man,info,locale,lintian,bug}
  log "$name: busybox + ${#pkgs[@]} Debian packages: ${pkgs[*]}"
}

# smoke NAME ROOTFS: run the image's tools once, in a chroot of it with the host's /dev
# (bound in a private mount namespace, so it goes away with the command).
smoke() {
  local out
  out="$(unshare --mount --propagation private sh -c 'mount --bind /dev "$1/dev" && exec chroot "$1" /usr/bin/env -i PATH="$2" /bin/sh -c "$3"' \
    _ "$2" "$IMAGE_PATH" "${DEB_SMOKE[$1]}" 2>&1)" ||
    { echo "$1: smoke test failed: ${DEB_SMOKE[$1]}"$'\n'"$out" >&2; exit 1; }
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
{"architecture":"amd64","os":"linux","created":"1970-01-01T00:00:00Z","config":{"Env":["PATH=$IMAGE_PATH"],"Entrypoint":$entrypoint,"Cmd":$cmd,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:$ld"]},"history":[{"created":"1970-01-01T00:00:00Z","created_by":"hack/images/build.sh $name"}]}
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

# deb_stamp NAME: what an example image is made of (this script, its package list, the
# Debian package lists, the rclone binary); the image is rebuilt only when it changes.
deb_stamp() {
  { cat "${BASH_SOURCE[0]}"; echo "${DEB_PKGS[$1]}"
    stat -c '%n %s %Y' /var/lib/apt/lists/*_Packages* 2>/dev/null || true
    if [ "$1" = object-bucket ]; then sha256sum "$BIN/rclone" 2>/dev/null || echo no-rclone; fi
  } | sha256sum | cut -d' ' -f1
}

build_one() {
  local name="$1" r="$OUT/$1.rootfs"
  if [ -n "${DEB_PKGS[$name]:-}" ] && [ -f "$OUT/$name.tar" ] && [ "$(cat "$OUT/$name.stamp" 2>/dev/null)" = "$(deb_stamp "$name")" ]; then
    log "${REF[$name]}: up to date"
    return 0
  fi
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
    csi-provisioner|csi-snapshotter|snapshot-controller)
      [ -x "$BIN/$name" ] || { echo "$BIN/$name missing: run make tools" >&2; exit 1; }
      cp "$BIN/$name" "$r/$name"
      write_image "$name" "${REF[$name]}" "$r" "[\"/$name\"]" 'null' ;;
    pav)
      rootfs_busybox "$r"
      # One go build for the three commands: one links while the others compile.
      gobuild "$BIN/" ./cmd/pav ./cmd/pav-driver ./cmd/pav-report
      mkdir -p "$r/usr/local/bin"; cp "$BIN/pav" "$BIN/pav-driver" "$BIN/pav-report" "$r/usr/local/bin/"
      write_image pav "${REF[pav]}" "$r" '["/usr/local/bin/pav"]' 'null' ;;
    snapshot-metadata-client)
      # A module of its own (pav's go.mod never carries external-snapshot-metadata).
      (cd "$ROOT/hack/tools/snapshot-metadata" && CGO_ENABLED=0 nice -n 10 go build -trimpath -buildvcs=false -ldflags "-s -w" \
        -o "$BIN/snapshot-metadata-client" .)
      rootfs_busybox "$r"
      cp "$BIN/snapshot-metadata-client" "$r/snapshot-metadata-client"
      # Go's resolver: /etc/hosts (the pod's hostAliases) before DNS.
      echo 'hosts: files dns' > "$r/etc/nsswitch.conf"
      write_image "$name" "${REF[$name]}" "$r" '["/snapshot-metadata-client"]' 'null' ;;
    e2e-agnhost)
      [ -x "$BIN/agnhost" ] || { echo "$BIN/agnhost missing: run hack/build-tools.sh e2e" >&2; exit 1; }
      rootfs_busybox "$r"
      cp "$BIN/agnhost" "$r/agnhost"; ln -s agnhost "$r/agnhost-2"
      mkdir -p "$r/usr/local/bin"; cp "$ROOT/hack/images/e2e-agnhost/nsenter" "$r/usr/local/bin/nsenter"
      write_image "$name" "${REF[$name]}" "$r" '["/agnhost"]' '["pause"]' ;;
    e2e-busybox|e2e-nginx|e2e-glibc-dns-testing)
      rootfs_debs "$r" "$name"
      local cmd='["sh"]'
      if [ "$name" = e2e-nginx ]; then
        mkdir -p "$r/usr/share/nginx/html"; cmd='["httpd","-f","-p","80","-h","/usr/share/nginx/html"]'
      fi
      [ "$name" != e2e-glibc-dns-testing ] || cmd='["sleep","2147483647"]'
      smoke "$name" "$r"
      write_image "$name" "${REF[$name]}" "$r" 'null' "$cmd"
      deb_stamp "$name" > "$OUT/$name.stamp" ;;
    e2e-hello-populator|e2e-volume-data-source-validator)
      local cmd="${name#e2e-}"
      gobuild "$BIN/$cmd" "./test/$cmd"
      cp "$BIN/$cmd" "$r/$cmd"
      write_image "$name" "${REF[$name]}" "$r" "[\"/$cmd\"]" 'null' ;;
    loop-block|encryption|encrypted-fs|object-bucket)
      rootfs_debs "$r" "$name"
      if [ "$name" = object-bucket ]; then
        [ -x "$BIN/rclone" ] || { echo "$BIN/rclone missing: run make tools" >&2; exit 1; }
        mkdir -p "$r/usr/local/bin"; cp "$BIN/rclone" "$r/usr/local/bin/rclone"
      fi
      smoke "$name" "$r"
      write_image "$name" "${REF[$name]}" "$r" 'null' '["sh"]'
      deb_stamp "$name" > "$OUT/$name.stamp" ;;
  esac
  rm -rf "$r"
}

# build_timed N NAME: build_one NAME (a job of the loop below), then its summary line.
build_timed() {
  local start=$SECONDS
  log "[$1/${#images[@]}] $2 (${REF[$2]})"
  build_one "$2"
  printf '%6d s  %s\n' $((SECONDS - start)) "$2" > "$OUT/.built.$2"
}

T0=$SECONDS
# apt's package lists, once, before images that read them build at once.
for i in "${images[@]}"; do
  if [ -n "${DEB_PKGS[$i]:-}" ]; then apt-cache show libc6 >/dev/null 2>&1 || apt-get update -qq; break; fi
done
jobs_max="${IMAGE_JOBS:-$(nproc)}"
running=0 failed=0 n=0
for i in "${images[@]}"; do
  if [ "$running" -ge "$jobs_max" ]; then
    wait -n || failed=1
    running=$((running - 1))
  fi
  [ "$failed" = 0 ] || break  # what runs ends; nothing more starts
  n=$((n + 1)); rm -f "$OUT/.built.$i"
  build_timed "$n" "$i" &
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do wait -n || failed=1; running=$((running - 1)); done
[ "$failed" = 0 ] || { rm -f "$OUT"/.built.*; echo "images: building failed (see above)" >&2; exit 1; }
summary=()
for i in "${images[@]}"; do summary+=("$(cat "$OUT/.built.$i")"); rm -f "$OUT/.built.$i"; done

if [ "$do_import" = 1 ]; then
  start=$SECONDS
  sock="$CLUSTER_DIR/run/containerd/containerd.sock"
  [ -S "$sock" ] || { echo "containerd socket $sock not found: run hack/cluster/up.sh" >&2; exit 1; }
  # node 1's containerd and every extra node's (hack/cluster/node.sh)
  socks=("$sock")
  for s in "$CLUSTER_DIR"/nodes/*/run/containerd/containerd.sock; do [ -S "$s" ] && socks+=("$s"); done
  for sock in "${socks[@]}"; do
    for i in "${images[@]}"; do
      # (ctr's output is shown only on failure: it warns about cgroup v1 on every call)
      out="$("$BIN/ctr" --address "$(realpath "$sock")" -n k8s.io images import --platform linux/amd64 "$OUT/$i.tar" 2>&1)" ||
        { echo "$out" >&2; exit 1; }
      if [ "$i" = busybox ]; then  # same local alias as hack/cluster/up.sh makes
        out="$("$BIN/ctr" --address "$(realpath "$sock")" -n k8s.io images tag --force "${REF[busybox]}" docker.io/library/busybox:1.36 2>&1)" ||
          { echo "$out" >&2; exit 1; }
      fi
    done
    log "imported ${#images[@]} images into $(realpath "$sock")"
  done
  summary+=("$(printf '%6d s  %s' $((SECONDS - start)) "import into the cluster")")
fi
log "$((SECONDS - T0)) s in all"
for line in "${summary[@]}"; do log "$line"; done
