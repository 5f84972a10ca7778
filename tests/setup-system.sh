#!/usr/bin/env bash
# Install the system packages the suite needs, only those missing. Debian/Ubuntu (apt). Runs as root or via sudo.
#   podman + runc      molecule's container hosts (runc: Debian's default crun fails on cgroups hybrid hosts)
#   debootstrap        builds the base image (no container registry is reachable)
#   prometheus         a real Prometheus for the extender's PromQL source tests, promtool for the alert rules
set -euo pipefail
need=()
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v prometheus >/dev/null && command -v promtool >/dev/null || need+=(prometheus)
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "setup-system: installing ${need[*]}"
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${need[@]}" \
  fuse-overlayfs slirp4netns uidmap
