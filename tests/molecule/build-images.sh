#!/usr/bin/env bash
# Build the images molecule scenarios run on, once (cached in podman's store; rerunning is a no-op):
#   localhost/gpufleet-debian-base:bookworm    debootstrap minbase + python3, imported (no registry is reachable);
#                                              also the base of `make images`' extender image
#   localhost/gpufleet-molecule-systemd:bookworm  + systemd as PID 1, dbus, python3-venv/pip
# The Debian mirror is read from this machine's apt sources at run time, never written into the repo.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/molecule/podman-env.sh
source "$here/podman-env.sh"
# One build at a time on this checkout: make test's lanes may ask for the base at once (molecule, make images).
exec 9>"$here/../../build/podman/build-images.lock"
flock 9
base=localhost/gpufleet-debian-base:bookworm
image=localhost/gpufleet-molecule-systemd:bookworm

apt_mirror() {
  # First Debian archive URI (deb822 .sources files or one-line sources.list), excluding the security archive.
  local uri
  uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/ {print $2}' | grep -v -- '-security' | head -n1 || true)
  if [ -z "$uri" ]; then
    uri=$(grep -hE '^deb\s' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
      | awk '{for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' | grep -v -- '-security' | head -n1 || true)
  fi
  [ -n "$uri" ] || { echo "build-images: no Debian mirror found in the apt sources" >&2; exit 1; }
  echo "$uri"
}

if ! podman image exists "$base"; then
  mirror=$(apt_mirror)
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  echo "build-images: debootstrap bookworm (minbase + python3) from the machine's apt mirror"
  debootstrap --variant=minbase --include=python3 bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
    || { tail -n 30 "$work/debootstrap.log" >&2; exit 1; }
  tar -C "$work/rootfs" -c . | podman import --change 'CMD ["/bin/bash"]' - "$base"
fi

if ! podman image exists "$image"; then
  echo "build-images: building $image"
  podman build --network host --tag "$image" --file "$here/Containerfile.systemd" "$here"
fi
echo "build-images: $base and $image are ready"
