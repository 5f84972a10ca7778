"""The collection under test: running a playbook or a role the way a user does, the collection importable as
ansible_collections.gpufleet.mig, the system tools a test needs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

import pytest
import yaml

# The checkout: this package is installed editable from testsupport/src (`make venv`).
REPO = Path(__file__).resolve().parents[3]


def require_tool(name: str, package: str, override: str = "") -> str:
    """The path of a system tool a test needs (Debian package `package`, installed by tests/setup-system.sh);
    `override` names an environment variable that may point at another binary. Missing, it is a skip on a
    developer's machine and a failure in CI (CI set) or with GPUFLEET_REQUIRE_PROMETHEUS=1, where a skip would hide
    that the check never ran."""
    binary = (os.environ.get(override) if override else None) or shutil.which(name) or f"/usr/bin/{name}"
    if not Path(binary).is_file():
        message = f"{name} not found ({binary}): Debian's {package} package ships it (tests/setup-system.sh)"
        if os.environ.get("GPUFLEET_REQUIRE_PROMETHEUS") == "1" or os.environ.get("CI", "false") not in ("", "false"):
            pytest.fail(message + ", and CI / GPUFLEET_REQUIRE_PROMETHEUS=1 needs it")
        pytest.skip(message)
    return binary


@cache
def collections_path(root: Path = REPO) -> str:
    """A private collections tree (a symlink to the repo) that makes the collection importable as
    ansible_collections.gpufleet.mig, so tests do not depend on `make collection-link` having run. Made once per
    process and put on sys.path; tests that run `ansible` point ANSIBLE_COLLECTIONS_PATH at it. `root`: the
    collection to link, this checkout unless a copy of it passes its own (the mutation run's scratch copy)."""
    tree = Path(tempfile.mkdtemp(prefix="gpufleet-collections-"))
    (tree / "ansible_collections" / "gpufleet").mkdir(parents=True)
    (tree / "ansible_collections" / "gpufleet" / "mig").symlink_to(root)
    if str(tree) not in sys.path:
        sys.path.insert(0, str(tree))
    return str(tree)


# The lab as `make lab` runs it: the Hong Kong inventory as it is, the simulation overrides on top as extra vars.
# "<inventory>+lab" is any inventory run that way.
LAB = "inventories/hongkong+lab"
LAB_VARS = REPO / "playbooks/vars/lab.yml"


def inventory_args(inventory: str) -> list[str]:
    """ansible-playbook's arguments for an inventory: `-i <path>`; for "<path>+lab" the lab's overrides on top."""
    if inventory.endswith("+lab"):
        return ["-i", str(REPO / inventory.removesuffix("+lab")), "-e", f"@{LAB_VARS}"]
    return ["-i", str(REPO / inventory)]


def run_playbook(
    playbook: str, inventory: str, extra_vars: dict, tmp_path: Path, args: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    """Run a playbook from the repo root with the repo's ansible.cfg; extra vars passed as a JSON file, `args`
    (e.g. `--limit`) added to the command line."""
    vars_file = tmp_path / "extra-vars.json"
    vars_file.write_text(json.dumps(extra_vars))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    ansible_playbook = Path(sys.executable).with_name("ansible-playbook")
    return subprocess.run(
        [str(ansible_playbook), *inventory_args(inventory), playbook, "-e", f"@{vars_file}", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def write_inventory(tmp_path: Path, inventory: dict) -> str:
    """Write an inventory (the YAML shape as a dict) to tmp_path/inventory.yml; return its path."""
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inventory, sort_keys=False))
    return str(path)


def try_render(
    roles: list[str], tmp_path: Path, inventory: str = "inventories/hongkong+lab", extra_vars=None
) -> tuple[subprocess.CompletedProcess, Path]:
    """Run the given roles on localhost in render mode; return the run and the manifests directory.

    For tests that expect a refusal: they assert on the run's output and that nothing was rendered."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    manifests = tmp_path / "manifests"
    playbook = tmp_path / "render.yml"
    playbook.write_text(
        yaml.safe_dump(
            [{"name": "Render for tests", "hosts": "localhost", "gather_facts": False, "roles": roles}],
            sort_keys=False,
        )
    )
    all_vars = {
        "gpufleet_k8s_mode": "render",
        "gpufleet_manifests_dir": str(manifests),
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
    }
    all_vars.update(extra_vars or {})
    return run_playbook(str(playbook), inventory, all_vars, tmp_path), manifests


def render_roles(
    roles: list[str], tmp_path: Path, inventory: str = "inventories/hongkong+lab", extra_vars=None
) -> Path:
    """Run the given roles on localhost in render mode; return the manifests directory (the test fails if it fails)."""
    result, manifests = try_render(roles, tmp_path, inventory, extra_vars)
    if result.returncode != 0:
        pytest.fail(f"rendering {roles} failed:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}")
    return manifests


def run_role(
    tmp_path: Path, role: str, inventory: dict, extra_vars: dict, tasks_from: str | None = None
) -> subprocess.CompletedProcess:
    """Run one of the collection's roles (or one of its task files) on localhost, with a hand-made inventory."""
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    include = {"name": f"gpufleet.mig.{role}", **({"tasks_from": tasks_from} if tasks_from else {})}
    playbook = tmp_path / f"{role}.yml"
    playbook.write_text(
        yaml.safe_dump(
            [{"hosts": "localhost", "gather_facts": False, "tasks": [{"ansible.builtin.include_role": include}]}]
        )
    )
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    return run_playbook(str(playbook), str(tmp_path / "inventory.yml"), {**local, **extra_vars}, tmp_path)


def run_refresh(
    tmp_path: Path,
    kubeconfig: Path,
    namespace: str,
    changed: dict[str, bool],
    layouts: dict[str, list],
    retries: int = 3,
    delay: int = 1,
    tenants: dict[str, str] | None = None,
    extra_vars: dict | None = None,
) -> subprocess.CompletedProcess:
    """The gpu_device_plugin role's after-repartition refresh in apply mode, for hand-made GPU hosts (one GPU each):
    `changed` says whose layout changed, `layouts` gives each host's mig_partition_config, `tenants` a host's
    gpufleet_tenant (its pool's sharing then counts, given in extra_vars' gpufleet_tenants)."""
    hosts = {h: {"mig_partition_config": layouts[h], "mig_partition_layout_changed": c} for h, c in changed.items()}
    for host, tenant in (tenants or {}).items():
        hosts[host]["gpufleet_tenant"] = tenant
    inventory = {
        "all": {
            "vars": {
                "gpufleet_namespace": namespace,
                "gpufleet_node_agents_namespace": namespace,
                "gpufleet_gpus_per_node": 1,
            },
            "children": {"gpu_nodes": {"hosts": hosts}},
        }
    }
    extra = {
        "gpufleet_k8s_mode": "apply",
        "gpufleet_kubeconfig": str(kubeconfig),
        "gpu_device_plugin_allocatable_retries": retries,
        "gpu_device_plugin_allocatable_delay": delay,
        **(extra_vars or {}),
    }
    return run_role(tmp_path, "gpu_device_plugin", inventory, extra, tasks_from="refresh.yml")
