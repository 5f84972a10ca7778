"""What `make lab` runs after playbooks/site.yml, decided by the inventory and the settings the roles rendered.

Prints shell assignments (make lab sources them) and writes <lab>/extender-settings.yaml:
- REBALANCE_POOL, REBALANCE_DEMAND (JSON), REBALANCE_DEMAND_TEXT: the MIG re-layout's pool and demand. The pool is
  the inventory's MIG pool with the most instances per node (the smallest instances), and the demand asks it for
  larger ones of its own product: 4 x its 3-slice profile + 4 x its 2-slice profile. Empty when no pool has MIG.
- SHARE_EXCLUSIVE: `--share TENANT:RESOURCE=1` for every time-sliced resource of the inventory, for the placement
  simulator's exclusive-device runs (the fleet their goals were measured on); the time-sliced run uses the
  inventory's sharing as it is.
- extender-settings.yaml: the data of the extender ConfigMap the gpu_extender role rendered for this inventory, the
  decision settings only (thresholds, weights, strategy, time-slicing, interference, the shared-memory rule), so
  that every simulator run decides with the settings the fleet gets as deployed, not with values passed by hand.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

import yaml

from gpufleet_lab.mig_utils.exceptions import MigError
from gpufleet_lab.mig_utils.host_gpus import host_gpus
from gpufleet_lab.mig_utils.profile_tables import product_table
from gpufleet_lab.simulate.fleet import FleetError, read_inventory

# The extender settings that decide a placement (docs/gpu_extender.md); the others (Prometheus, files, the API) are
# the deployment's, and have no meaning in the simulator.
DECISION_SETTINGS = (
    "GPU_UTIL_THRESHOLD",
    "MEM_UTIL_THRESHOLD",
    "WEIGHT_GPU_UTIL",
    "WEIGHT_MEM_UTIL",
    "SCORING_STRATEGY",
    "PACK_TARGET_UTIL",
    "AUTO_PACK_BELOW",
    "AUTO_HYSTERESIS",
    "SHARED_RESOURCES",
    "INTERFERENCE_WEIGHT",
    "SHARED_MEM_FREE_MIN",
    "INFLIGHT_MAX_SECONDS",
)
DEMAND_PER_PROFILE = 4


def _tenants(hostvars: dict[str, Any]) -> dict[str, Any]:
    for values in hostvars.values():
        if isinstance(values.get("gpufleet_tenants"), dict):
            return dict(values["gpufleet_tenants"])
    return {}


def _group_hosts(data: dict[str, Any], group: str) -> list[str]:
    entry = data.get(group) or {}
    hosts = list(entry.get("hosts") or [])
    for child in entry.get("children") or []:
        hosts.extend(_group_hosts(data, child))
    return hosts


def rebalance(data: dict[str, Any]) -> tuple[str, dict[str, int]] | None:
    """(pool group, demand) for the re-layout, or None when no pool has MIG instances."""
    hostvars = (data.get("_meta") or {}).get("hostvars") or {}
    best: tuple[int, str, dict[str, int]] | None = None
    for spec in _tenants(hostvars).values():
        group = spec.get("group") if isinstance(spec, dict) else None
        hosts = _group_hosts(data, str(group)) if group else []
        if not hosts:
            continue
        facts = host_gpus(hosts[0], hostvars[hosts[0]])
        instances = sum(n for name, n in facts.instances().items() if name != "gpu")
        if instances == 0:
            continue
        rows = {row.slice_count: row.name for row in product_table(facts.product).profiles if "+" not in row.name}
        demand = {rows[3]: DEMAND_PER_PROFILE, rows[2]: DEMAND_PER_PROFILE}
        if best is None or instances > best[0]:
            best = (instances, str(group), demand)
    return None if best is None else (best[1], best[2])


def exclusive_shares(data: dict[str, Any]) -> list[str]:
    hostvars = (data.get("_meta") or {}).get("hostvars") or {}
    shares = []
    for tenant, spec in _tenants(hostvars).items():
        for resource in (spec or {}).get("sharing") or {}:
            shares += ["--share", f"{tenant}:{resource}=1"]
    return shares


def extender_settings(manifests: Path) -> dict[str, Any]:
    """The decision settings of the extender ConfigMap the gpu_extender role rendered."""
    for path in sorted((manifests / "gpu_extender").glob("*.y*ml")):
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if (
                isinstance(document, dict)
                and document.get("kind") == "ConfigMap"
                and "KUBE_API" in (document.get("data") or {})
            ):
                data = document["data"]
                return {key: data[key] for key in DECISION_SETTINGS if key in data}
    raise FileNotFoundError(f"no extender ConfigMap under {manifests}/gpu_extender/: did playbooks/site.yml run?")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpufleet-lab plan", description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--inventory", required=True)
    parser.add_argument("--lab-dir", required=True, type=Path)
    args = parser.parse_args(argv)
    try:
        data = read_inventory(args.inventory)
        chosen = rebalance(data)
        settings = extender_settings(args.lab_dir / "manifests")
    except (FleetError, MigError, FileNotFoundError) as exc:
        print(f"lab plan: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 1
    (args.lab_dir / "extender-settings.yaml").write_text(yaml.safe_dump(settings, sort_keys=True), encoding="utf-8")
    pool, demand = chosen if chosen else ("", {})
    text = " + ".join(f"{count} x {profile}" for profile, count in demand.items())
    for name, value in (
        ("REBALANCE_POOL", pool),
        ("REBALANCE_DEMAND", json.dumps(demand) if demand else ""),
        ("REBALANCE_DEMAND_TEXT", text),
        ("SHARE_EXCLUSIVE", " ".join(exclusive_shares(data))),
    ):
        print(f"{name}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
