#!/usr/bin/env bash
# hack/tools/rclone/patched-source.sh DIR — rclone's module source with the object-bucket
# example's patch applied (examples/object-bucket/rclone-close-to-open.patch), in DIR, and a
# go.mod for this directory's build that replaces the module with it: prints that go.mod's
# path, for `go build -modfile` (hack/build-tools.sh). The source is prepared once per version
# of the patch (part of its sha256 is in the directory's name, so that a changed patch makes
# a new directory and a new build stamp); a failed preparation leaves nothing behind.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
patch="$(cd "$here/../../.." && pwd)/examples/object-bucket/rclone-close-to-open.patch"
out="$1"
version="$(sed -n 's|^require github.com/rclone/rclone \(v[^ ]*\)$|\1|p' "$here/go.mod")"
[ -n "$version" ] || { echo "patched-source: no 'require github.com/rclone/rclone vX' line in $here/go.mod" >&2; exit 1; }
command -v patch > /dev/null || { echo "patched-source: needs patch(1) (Debian: apt-get install patch)" >&2; exit 1; }
dest="$out/rclone@$version-pav-$(sha256sum "$patch" | cut -c1-12)"

if [ ! -f "$dest/.patched" ]; then
  src="$(cd "$here" && go mod download -json "github.com/rclone/rclone@$version" | sed -n 's|^	"Dir": "\(.*\)",$|\1|p')"
  [ -d "$src" ] || { echo "patched-source: go mod download found no source for rclone $version" >&2; exit 1; }
  mkdir -p "$out"
  rm -rf "$dest" "$dest.tmp"
  cp -R "$src" "$dest.tmp"
  chmod -R u+w "$dest.tmp"
  # patch(1), not git apply: under a git work tree (this repository's _output), git apply
  # would take the paths as the repository's.
  patch -d "$dest.tmp" -p1 --forward --quiet < "$patch"
  touch "$dest.tmp/.patched"
  mv "$dest.tmp" "$dest"
fi
cp "$here/go.mod" "$dest.mod"
echo "replace github.com/rclone/rclone => $dest" >> "$dest.mod"
cp "$here/go.sum" "$dest.sum"
echo "$dest.mod"
