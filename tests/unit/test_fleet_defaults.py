"""The fleet-wide settings are defaulted once (roles/gpufleet/defaults/main.yml) and every role reads them from there:
each role depends on gpufleet.mig.gpufleet, and no role, template or playbook repeats a default of its own."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DEFAULTS = yaml.safe_load((REPO / "roles" / "gpufleet" / "defaults" / "main.yml").read_text())
# Roles that are not the fleet's components: the defaults themselves, and the manifest delivery every role includes.
NOT_COMPONENTS = {"gpufleet", "k8s_manifests"}


def test_every_component_role_depends_on_the_fleet_defaults():
    missing = []
    for role in sorted(p for p in (REPO / "roles").iterdir() if p.is_dir() and p.name not in NOT_COMPONENTS):
        meta = (
            yaml.safe_load((role / "meta" / "main.yml").read_text()) if (role / "meta" / "main.yml").is_file() else {}
        )
        dependencies = [d["role"] if isinstance(d, dict) else d for d in (meta or {}).get("dependencies") or []]
        if "gpufleet.mig.gpufleet" not in dependencies:
            missing.append(role.name)
    assert missing == []


def test_no_second_default_for_a_fleet_wide_setting():
    names = "|".join(map(re.escape, DEFAULTS))
    second = re.compile(rf"\b({names})\s*\|\s*default\(")
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in sorted([*(REPO / "roles").rglob("*"), *(REPO / "playbooks").rglob("*.yml")])
        if path.is_file() and path.suffix in (".yml", ".j2")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if second.search(line)
    ]
    assert found == []


def test_the_argument_specs_state_the_defaults_as_they_are():
    specs = yaml.safe_load((REPO / "roles" / "gpufleet" / "meta" / "argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    assert {name: spec.get("default") for name, spec in options.items()} == DEFAULTS
