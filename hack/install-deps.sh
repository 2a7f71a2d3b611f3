#!/usr/bin/env bash
# hack/install-deps.sh — install the Debian packages the local cluster needs.
#
# Usage: hack/install-deps.sh            (as root; idempotent: installs only what is missing)
#
# Packages: runc (OCI runtime), containernetworking-plugins (bridge/host-local/portmap/loopback
# in /usr/lib/cni), iptables, conntrack (kube-proxy), busybox-static (busybox image),
# openssl (cluster certificates), util-linux/mount (losetup, mount, nsenter, unshare),
# iproute2 (ip: the extra nodes' network namespaces, veths and routes), procps, curl, kmod,
# ca-certificates, patch (hack/tools/rclone/patched-source.sh applies object-bucket's rclone
# patch). Go and the Go module proxy are used by hack/build-tools.sh instead.
set -euo pipefail

pkgs=(runc containernetworking-plugins iptables conntrack busybox-static openssl
      util-linux mount iproute2 procps curl kmod ca-certificates patch)

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: need root to install: ${missing[*]}" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
