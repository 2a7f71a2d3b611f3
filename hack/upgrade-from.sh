#!/usr/bin/env bash
# hack/upgrade-from.sh — the last release of pav, built as it was, for the upgrade test
# (make e2e-upgrade; test/e2e/upgrade_test.go runs it).
#
# Usage: hack/upgrade-from.sh [--import]
#
# The release is test/e2e/upgrade/last-release's: its tag, else (a clone without the tag)
# its commit. From a git worktree of it (removed afterwards) it runs that release's own
# hack/images/build.sh for the images the repository builds (pav, and the registrar
# stand-in), and renders that release's local install (test/e2e/install, as its make
# install applied it). The images keep the release's name, not :dev, so that they do not
# replace the working tree's: their archives are retagged pav.local/<image>:<release>, and
# the install names those. Everything goes to _output/upgrade/<release>/:
#   pav.tar, registrar.tar   the images (OCI archives)
#   install.yaml             kubectl apply -f it to install the release
# A second run reuses them (the release does not change); --import also loads the images
# into the local cluster's containerd (every node's).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CLUSTER_DIR="${PAV_CLUSTER_DIR:-$ROOT/_output/cluster}"
BIN="$ROOT/_output/bin"
# shellcheck source=../test/e2e/upgrade/last-release
. "$ROOT/test/e2e/upgrade/last-release"
OUT="$ROOT/_output/upgrade/$LAST_RELEASE"
WT="$ROOT/_output/upgrade/worktree-$LAST_RELEASE"
IMAGES=(pav registrar)
log() { echo "upgrade-from: $*" >&2; }

do_import=0
for a in "$@"; do
  case "$a" in
    --import) do_import=1 ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/!p}' "$0"; exit 0 ;;
    *) echo "unknown argument $a" >&2; exit 2 ;;
  esac
done

# The tag if this clone has it (it must name the recorded commit), else the commit.
commit=$(git -C "$ROOT" rev-parse -q --verify "refs/tags/$LAST_RELEASE^{commit}" || true)
if [ -n "$commit" ] && [ "$commit" != "$LAST_RELEASE_COMMIT" ]; then
  echo "tag $LAST_RELEASE names $commit, but test/e2e/upgrade/last-release says $LAST_RELEASE_COMMIT: fix one of them" >&2
  exit 1
fi
if [ -z "$commit" ]; then
  git -C "$ROOT" cat-file -e "$LAST_RELEASE_COMMIT^{commit}" 2>/dev/null ||
    { echo "neither tag $LAST_RELEASE nor commit $LAST_RELEASE_COMMIT is in this clone: git fetch --tags" >&2; exit 1; }
  commit=$LAST_RELEASE_COMMIT
  log "no tag $LAST_RELEASE here: using its commit ${commit:0:12}"
fi

built() {
  [ "$(cat "$OUT/commit" 2>/dev/null)" = "$commit" ] || return 1
  for i in "${IMAGES[@]}"; do [ -f "$OUT/$i.tar" ] || return 1; done
  [ -f "$OUT/install.yaml" ]
}

if built; then
  log "$LAST_RELEASE (${commit:0:12}) already built in ${OUT#"$ROOT"/}"
else
  start=$SECONDS
  rm -rf "$OUT"; mkdir -p "$OUT"
  git -C "$ROOT" worktree remove --force "$WT" 2>/dev/null || rm -rf "$WT"
  git -C "$ROOT" worktree prune
  git -C "$ROOT" worktree add --detach --quiet "$WT" "$commit"
  trap 'git -C "$ROOT" worktree remove --force "$WT" 2>/dev/null || true' EXIT
  log "building $LAST_RELEASE's images (${IMAGES[*]}) with its own hack/images/build.sh"
  (cd "$WT" && PAV_BIN_DIR="$WT/_output/bin" hack/images/build.sh "${IMAGES[@]}")
  for i in "${IMAGES[@]}"; do
    # The same image under the release's tag: only index.json names it.
    d=$(mktemp -d)
    tar -xf "$WT/_output/images/$i.tar" -C "$d"
    sed -i "s|\"io.containerd.image.name\":\"pav.local/$i:dev\"|\"io.containerd.image.name\":\"pav.local/$i:$LAST_RELEASE\"|; s|\"org.opencontainers.image.ref.name\":\"dev\"|\"org.opencontainers.image.ref.name\":\"$LAST_RELEASE\"|" "$d/index.json"
    grep -q "pav.local/$i:$LAST_RELEASE" "$d/index.json" || { echo "$i.tar: no pav.local/$i:dev in its index.json" >&2; exit 1; }
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$d" -cf "$OUT/$i.tar" oci-layout index.json blobs
    rm -rf "$d"
    log "pav.local/$i:$LAST_RELEASE -> ${OUT#"$ROOT"/}/$i.tar"
  done
  # The release's local install, naming those images.
  inst="$WT/test/e2e/install"
  sed -i "s|pav.local/pav:dev|pav.local/pav:$LAST_RELEASE|; s|pav.local/registrar:dev|pav.local/registrar:$LAST_RELEASE|" "$inst/config.yaml"
  sed -i "s|newTag: dev|newTag: $LAST_RELEASE|" "$inst/kustomization.yaml"
  "$BIN/kubectl" kustomize "$inst" > "$OUT/install.yaml"
  grep -q "image: pav.local/pav:$LAST_RELEASE" "$OUT/install.yaml" ||
    { echo "the rendered install does not name pav.local/pav:$LAST_RELEASE" >&2; exit 1; }
  echo "$commit" > "$OUT/commit"
  log "$LAST_RELEASE built in $((SECONDS - start)) s"
fi

if [ "$do_import" = 1 ]; then
  sock="$CLUSTER_DIR/run/containerd/containerd.sock"
  [ -S "$sock" ] || { echo "containerd socket $sock not found: run make cluster-up" >&2; exit 1; }
  socks=("$sock")
  for s in "$CLUSTER_DIR"/nodes/*/run/containerd/containerd.sock; do [ -S "$s" ] && socks+=("$s"); done
  for s in "${socks[@]}"; do
    for i in "${IMAGES[@]}"; do
      out="$("$BIN/ctr" --address "$(realpath "$s")" -n k8s.io images import --platform linux/amd64 "$OUT/$i.tar" 2>&1)" ||
        { echo "$out" >&2; exit 1; }
    done
    log "imported pav.local/{${IMAGES[*]// /,}}:$LAST_RELEASE into $(realpath "$s")"
  done
fi
