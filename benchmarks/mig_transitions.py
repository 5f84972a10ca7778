#!/usr/bin/env python3
"""Replay random MIG layout transitions on the NVML simulator and count destroyed instances.

For each transition (layout A -> layout B on one GPU) it prints nothing; at the end it reports
- destroyed by gpufleet.mig.nvidia_mig's planner (through the real runner and the simulator),
- the theoretical minimum, by brute force over every valid placement of B (max overlap with A's instances),
- what mig-parted does: it rebuilds every GPU whose layout differs, destroying all of A's instances there.

    python3 benchmarks/mig_transitions.py [--transitions 500] [--seed 7] [--product "NVIDIA H200"]

Exit status 1 if the planner ever destroys more than the minimum (the goal is equality).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _import_collection():
    """Make ansible_collections.gpufleet.mig importable from this checkout (a symlink tree in a temp dir)."""
    tree = Path(tempfile.mkdtemp(prefix="gpufleet-bench-"))
    (tree / "ansible_collections" / "gpufleet").mkdir(parents=True)
    (tree / "ansible_collections" / "gpufleet" / "mig").symlink_to(REPO)
    sys.path.insert(0, str(tree))


try:
    import ansible_collections.gpufleet.mig  # noqa: F401  (already importable, e.g. under pytest)
except ImportError:
    _import_collection()

from ansible_collections.gpufleet.mig.plugins.module_utils import runner  # noqa: E402
from ansible_collections.gpufleet.mig.plugins.module_utils.nvml_sim import SimulatedNvml, new_state  # noqa: E402
from ansible_collections.gpufleet.mig.plugins.module_utils.planner import Catalog  # noqa: E402
from ansible_collections.gpufleet.mig.plugins.module_utils.profile_tables import product_table  # noqa: E402


def all_layouts(wanted: dict[str, int], catalog: Catalog):
    """Every valid full placement of `wanted` (sets of (profile, start)), by exhaustive enumeration.

    Deliberately naive and independent of the planner's search: it is the reference the planner is checked against.
    """
    items = [name for name in sorted(wanted) for _ in range(wanted[name])]

    def extend(i: int, used: frozenset, compute: int, chosen: tuple, min_start: int):
        if i == len(items):
            yield frozenset(chosen)
            return
        profile = catalog.by_name[items[i]]
        for start, size in profile.placements:
            cells = frozenset(range(start, start + size))
            if start < min_start or cells & used or compute + profile.slice_count > catalog.compute_slices:
                continue
            # Instances of one profile are interchangeable: take their starts in increasing order.
            same_next = i + 1 < len(items) and items[i + 1] == items[i]
            yield from extend(
                i + 1,
                used | cells,
                compute + profile.slice_count,
                (*chosen, (profile.name, start)),
                start + 1 if same_next else 0,
            )

    yield from extend(0, frozenset(), 0, (), 0)


def minimum_destroyed(current: list[tuple[str, int]], wanted: dict[str, int], catalog: Catalog) -> int:
    """Fewest existing instances any valid placement of `wanted` must destroy (instances are (profile, start))."""
    best_overlap = max((len(layout & set(current)) for layout in all_layouts(wanted, catalog)), default=None)
    if best_overlap is None:
        raise ValueError(f"no valid placement for {wanted}")
    return len(current) - best_overlap


def random_layout(rng: random.Random, catalog: Catalog) -> dict[str, int]:
    """A random valid layout: add random profiles while one still fits (sometimes stop early)."""
    counts: Counter = Counter()
    names = catalog.names()
    while rng.random() > 0.1:
        fitting = [
            n
            for n in names
            if counts[n] < catalog.by_name[n].instance_count
            and next(all_layouts(dict(counts + Counter({n: 1})), catalog), None) is not None
        ]
        if not fitting:
            break
        counts[rng.choice(fitting)] += 1
    return dict(counts)


def run(transitions: int, seed: int, product: str) -> dict:
    rng = random.Random(seed)
    catalog = Catalog.from_table(product_table(product))
    totals = Counter()
    worse = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "state.json")
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(new_state(gpus=1, product=product), handle)
        layout = random_layout(rng, catalog)
        runner.apply(SimulatedNvml(path), [{"devices": "all", "mig_enabled": True, "mig_devices": layout}])
        for _ in range(transitions):
            nvml = SimulatedNvml(path)
            current = [
                (i["profile"], i["start"])
                for i in runner.apply(nvml, _config(layout), check_mode=True)["gpus"][0]["after"]
            ]
            target = random_layout(rng, catalog)
            result = runner.apply(nvml, _config(target))
            destroyed = sum(1 for a in result["gpus"][0]["actions"] if a["op"] == "destroy")
            minimum = minimum_destroyed(current, target, catalog)
            differs = Counter(p for p, _ in current) != Counter(target)
            totals["transitions"] += 1
            totals["destroyed"] += destroyed
            totals["minimum"] += minimum
            totals["mig_parted_destroyed"] += len(current) if differs else 0
            totals["mig_parted_rebuilds"] += differs
            totals["kept"] += len(current) - destroyed
            if destroyed > minimum:
                worse.append({"from": current, "to": target, "destroyed": destroyed, "minimum": minimum})
            layout = target
    return {"totals": dict(totals), "worse_than_minimum": worse}


def _config(counts: dict[str, int]) -> list[dict]:
    return [{"devices": "all", "mig_enabled": True, "mig_devices": counts}]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transitions", type=int, default=500)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--product", default="NVIDIA H100 80GB HBM3")
    args = parser.parse_args()
    report = run(args.transitions, args.seed, args.product)
    t = report["totals"]
    print(f"product: {args.product}; transitions: {t['transitions']} (seed {args.seed})")
    print(f"instances destroyed by nvidia_mig:       {t['destroyed']}")
    print(f"theoretical minimum (brute force):       {t['minimum']}")
    print(f"transitions above the minimum:           {len(report['worse_than_minimum'])}")
    print(f"instances kept across transitions:       {t['kept']}")
    print(f"mig-parted: GPUs rebuilt / destroyed:    {t['mig_parted_rebuilds']} / {t['mig_parted_destroyed']}")
    for case in report["worse_than_minimum"][:5]:
        print(f"  above minimum: {case}")
    return 1 if report["worse_than_minimum"] else 0


if __name__ == "__main__":
    sys.exit(main())
