#!/usr/bin/env bash
# Builds the real Kubernetes control plane from Go modules for the tests, the benchmarks and the lab:
#   kube-apiserver, kube-scheduler, kube-controller-manager  (k8s/go.mod: k8s.io/kubernetes, pinned once)
#   gpufleet-scheduler                                       (kube-scheduler + the GPUScore plugin, same module)
#   etcd                                                     (k8s/etcd/go.mod: its own module, so its
#                                                             dependencies never move the Kubernetes build)
# into $1 (default build/k8s/bin). Binaries are never committed.
#
# Rebuilds only when what they are built from changes: a stamp file holds the hash of both modules' go.mod and
# go.sum and of the project's own Go sources; when it matches and every binary is there, nothing runs.
set -euo pipefail
command -v go >/dev/null || { echo "k8s-assets: Go is required (go 1.26 or newer on PATH) to build the control plane" >&2; exit 1; }
here=$(cd "$(dirname "$0")" && pwd)
out=$(mkdir -p "${1:-$here/../build/k8s/bin}" && cd "${1:-$here/../build/k8s/bin}" && pwd)
stamp="$out/.built-from"

# Go's own settings for a reproducible build: no toolchain download, static binaries, no VCS stamping
# (the checkout may not be a git repository: a tarball, a worktree).
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false

k8s_version=$(cd "$here" && go list -m -f '{{.Version}}' k8s.io/kubernetes)   # e.g. v1.36.3
minor=${k8s_version#v1.}
minor=${minor%%.*}
# kube-* binaries report this in --version and /version; without it they say v0.0.0-master.
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version \
  -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor \
  -X k8s.io/component-base/version.gitTreeState=clean \
  -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"

binaries=(kube-apiserver kube-scheduler kube-controller-manager etcd)
has_plugin=false
[[ -f "$here/cmd/gpufleet-scheduler/main.go" ]] && has_plugin=true && binaries+=(gpufleet-scheduler)

wanted=$(cd "$here" && { cat go.mod go.sum etcd/go.mod etcd/go.sum; find . -name '*.go' -not -path './etcd/*' | sort | xargs -r cat; } | sha256sum | cut -d' ' -f1)
missing=()
for b in "${binaries[@]}"; do [[ -x "$out/$b" ]] || missing+=("$b"); done
if [[ ${#missing[@]} -eq 0 && -f "$stamp" && "$(cat "$stamp")" == "$wanted" ]]; then
  echo "k8s-assets: up to date in $out (${binaries[*]}; Kubernetes $k8s_version)"
  exit 0
fi

# One build per machine: every checkout (CI's fresh clone, a worktree) takes the binaries from a machine-wide cache
# keyed by the same hash, so only the first checkout with these sources compiles them. GPUFLEET_K8S_CACHE=off
# builds without it.
cache_root=${GPUFLEET_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpufleet/k8s-assets}
cached="$cache_root/$wanted"
rm -f "$stamp"
if [[ "$cache_root" != off && -f "$cached/.built-from" ]]; then
  for b in "${binaries[@]}"; do cp --reflink=auto -f "$cached/$b" "$out/$b"; done
  echo "$wanted" >"$stamp"
  echo "k8s-assets: ${binaries[*]} (Kubernetes $k8s_version) copied into $out from this machine's build cache $cached"
  exit 0
fi
started=$SECONDS
echo "k8s-assets: building Kubernetes $k8s_version control plane into $out (a cold build takes several minutes)"
packages=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-controller-manager)
$has_plugin && packages+=(./cmd/gpufleet-scheduler)
(cd "$here" && go build -trimpath -ldflags "$ldflags" -o "$out/" "${packages[@]}")
echo "k8s-assets: building etcd $(cd "$here/etcd" && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)"
(cd "$here/etcd" && go build -trimpath -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3)
echo "$wanted" >"$stamp"
echo "k8s-assets: built ${binaries[*]} in $((SECONDS - started)) s"
if [[ "$cache_root" != off ]]; then
  # Filled under a temporary name and renamed, so a checkout building beside this one never sees half a cache; the
  # three newest builds are kept (a branch switch back and forth stays warm, the disk use stays bounded).
  mkdir -p "$cache_root"
  filling=$(mktemp -d "$cache_root/.filling.XXXXXX")
  for b in "${binaries[@]}"; do cp --reflink=auto "$out/$b" "$filling/$b"; done
  cp "$stamp" "$filling/.built-from"
  mv -T "$filling" "$cached" 2>/dev/null || rm -rf "$filling"
  ls -1dt "$cache_root"/*/ | tail -n +4 | xargs -r rm -rf
  echo "k8s-assets: kept in this machine's build cache $cached"
fi
