#!/usr/bin/env bash
# Source this file before running molecule: it points podman at the containers.conf that works on our CI
# machines (Debian podman 4.x, cgroups v1/hybrid, no registry):
#   - runc, not crun: crun fails to start systemd containers on cgroups hybrid hosts;
#   - cgroupfs manager: there is no systemd on the host to delegate cgroups to;
#   - ulimits capped at what the host grants (higher values are refused at container start);
#   - conmon gets CONTAINERS_CONF/CONTAINERS_STORAGE_CONF, otherwise each `run --rm` hangs ~20 s on cleanup.
_gpufleet_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
_gpufleet_podman_dir="$_gpufleet_repo/build/podman"
mkdir -p "$_gpufleet_podman_dir"
export CONTAINERS_CONF="$_gpufleet_podman_dir/containers.conf"
_gpufleet_conmon_env="\"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\", \"CONTAINERS_CONF=$CONTAINERS_CONF\""
if [ -n "${CONTAINERS_STORAGE_CONF:-}" ]; then
  _gpufleet_conmon_env="$_gpufleet_conmon_env, \"CONTAINERS_STORAGE_CONF=$CONTAINERS_STORAGE_CONF\""
fi
cat > "$CONTAINERS_CONF" <<CONF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
conmon_env_vars = [$_gpufleet_conmon_env]
CONF
# Molecule and the scenarios find the collection and its roles through the repo's ansible.cfg paths.
export ANSIBLE_CONFIG="$_gpufleet_repo/ansible.cfg"
export GPUFLEET_REPO="$_gpufleet_repo"
unset _gpufleet_conmon_env _gpufleet_podman_dir _gpufleet_repo
