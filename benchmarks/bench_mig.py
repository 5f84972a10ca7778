#!/usr/bin/env python3
"""Replay random MIG layout transitions through nvidia_mig's runner on the NVML simulator and check the results.

The benchmark judges what is on the (simulated) GPU, never the plan. For each transition layout A -> layout B on
one GPU it reads the GPU's instances through NVML calls before and after the run and checks:
- the GPU now holds exactly B (profiles and counts), at valid, non-overlapping placements;
- the instances destroyed (A's MIG devices, by UUID, that are gone) equal the brute-force minimum, neither more
  (needless disruption) nor fewer (B cannot then be on the GPU);
- in about one transition of three, jobs run on one or two of A's instances. Those instances must survive: when a
  placement of B keeps them all, the minimum is taken among such placements; when none does, the run must refuse
  (BusyInstanceError) before any write and the GPU must be unchanged.
It prints the totals next to what mig-parted does (it rebuilds every GPU whose layout differs).

    PYTHONPATH=build/collections python3 benchmarks/bench_mig.py [--transitions 500] [--seed 7] [--product ...]

Exit status 1 on any failed check. `--runner creates-nothing` or `--runner ignores-busy` runs the same checks on a
deliberately broken runner, to show that the benchmark catches it (both exit 1).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass

try:
    from ansible_collections.gpufleet.mig.plugins.module_utils import runner
except ImportError:
    sys.exit("bench_mig: gpufleet.mig is not importable: run `make bench-mig`, or put build/collections on PYTHONPATH")
from ansible_collections.gpufleet.mig.plugins.module_utils.exceptions import BusyInstanceError, MigError
from ansible_collections.gpufleet.mig.plugins.module_utils.nvml_sim import SimulatedNvml, new_state
from ansible_collections.gpufleet.mig.plugins.module_utils.placement import (
    Catalog,
    all_layouts,
    minimum_destroyed_keeping,
)
from ansible_collections.gpufleet.mig.plugins.module_utils.profile_tables import product_table


def random_layout(rng: random.Random, catalog: Catalog, base: dict[str, int] | None = None) -> dict[str, int]:
    """A random valid layout: add random profiles to `base` while one still fits (sometimes stop early)."""
    counts: Counter = Counter(base or {})
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


@dataclass(frozen=True)
class Observed:
    """One MIG device as NVML lists it: the UUID tells a kept instance from a destroyed-and-recreated one."""

    uuid: str
    profile: str
    start: int
    pids: tuple[int, ...]


def observe(nvml, catalog: Catalog, index: int = 0) -> list[Observed]:
    """The GPU's instances read through NVML (instances, MIG devices, processes), sorted by start."""
    instances = {r.gi_id: r for r in nvml.gpu_instances(index, [p.id for p in catalog.profiles])}
    pids: dict[int, list[int]] = {}
    for process in nvml.running_processes(index):
        if process.gi_id is not None:
            pids.setdefault(process.gi_id, []).append(process.pid)
    seen = [
        Observed(
            device.uuid,
            catalog.by_id[instances[device.gi_id].profile_id].name,
            instances[device.gi_id].start,
            tuple(sorted(pids.get(device.gi_id, []))),
        )
        for device in nvml.mig_devices(index)
    ]
    return sorted(seen, key=lambda o: o.start)


def layout_problems(after: list[Observed], wanted: dict[str, int], catalog: Catalog) -> list[str]:
    problems = []
    counts = dict(Counter(o.profile for o in after))
    if counts != {n: c for n, c in wanted.items() if c}:
        problems.append(f"GPU holds {describe(counts)}, target {describe(wanted)}")
    cells = [m for o in after for m in range(o.start, o.start + catalog.by_name[o.profile].placements[0][1])]
    if len(cells) != len(set(cells)):
        problems.append("instances overlap")
    return problems


def describe(counts: dict[str, int]) -> str:
    return " + ".join(f"{c} x {n}" for n, c in sorted(counts.items()) if c) or "nothing"


def start_jobs(nvml, catalog: Catalog, before: list[Observed], rng: random.Random, first_pid: int) -> set[str]:
    """Run a job on one or two random instances (about one transition of three); their UUIDs."""
    if not before or rng.random() > 0.35:
        return set()
    chosen = rng.sample(before, min(len(before), rng.choice([1, 2])))
    gi_at = {r.start: r.gi_id for r in nvml.gpu_instances(0, [p.id for p in catalog.profiles])}
    for offset, instance in enumerate(chosen):
        nvml.add_process(0, first_pid + offset, gi_id=gi_at[instance.start], ci_id=0)
    return {o.uuid for o in chosen}


def end_jobs(path: str) -> None:
    """The jobs finish: empty every GPU's process list in the simulator's state file (see docs/nvml_simulator.md)."""
    with open(path, encoding="utf-8") as handle:
        state = json.load(handle)
    for gpu in state["gpus"]:
        gpu["processes"] = []
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(state, handle)


def check_transition(
    before: list[Observed], after: list[Observed], busy: set[str], target: dict[str, int], outcome, catalog: Catalog
) -> tuple[list[str], int | None]:
    """What went wrong in one transition, and the minimum it was held to (None: it had to refuse)."""
    current = [(o.profile, o.start) for o in before]
    busy_at = {(o.profile, o.start) for o in before if o.uuid in busy}
    minimum = minimum_destroyed_keeping(current, target, busy_at, catalog)
    survivors = {o.uuid for o in after}
    problems = [f"busy instance {o.profile}@{o.start} destroyed" for o in before if o.uuid in busy - survivors]
    if minimum is None:  # every placement of the target destroys a busy instance: refuse, touch nothing
        if not isinstance(outcome, BusyInstanceError):
            problems.append(f"had to refuse (busy instances in the way), got {outcome_name(outcome)}")
        if after != before:
            problems.append("GPU changed although the run had to refuse")
        return problems, None
    if isinstance(outcome, Exception):
        problems.append(f"failed: {outcome_name(outcome)}")
    problems += layout_problems(after, target, catalog)
    destroyed = len({o.uuid for o in before} - survivors)
    if destroyed != minimum:
        problems.append(f"destroyed {destroyed} instances, minimum {minimum}")
    return problems, minimum


def outcome_name(outcome) -> str:
    return f"{type(outcome).__name__}: {outcome}"[:200] if isinstance(outcome, Exception) else "success"


def run(transitions: int, seed: int, product: str, apply=None) -> dict:
    """`apply(nvml, config)` is the runner under test (nvidia_mig's, without force, by default)."""
    apply = apply or (lambda nvml, config: runner.apply(nvml, config))
    rng = random.Random(seed)
    catalog = Catalog.from_table(product_table(product))
    totals = Counter()
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "state.json")
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(new_state(gpus=1, product=product), handle)
        runner.apply(SimulatedNvml(path), _config(random_layout(rng, catalog)))
        for number in range(transitions):
            nvml = SimulatedNvml(path)
            before = observe(nvml, catalog)
            busy = start_jobs(nvml, catalog, before, rng, first_pid=10_000 + 2 * number)
            before = observe(SimulatedNvml(path), catalog)
            # Half the time the jobs' profiles stay wanted, so that keeping them is possible and must happen.
            keep = dict(Counter(o.profile for o in before if o.uuid in busy)) if rng.random() < 0.5 else None
            target = random_layout(rng, catalog, keep)
            try:
                outcome = apply(SimulatedNvml(path), _config(target))
            except MigError as exc:
                outcome = exc
            after = observe(SimulatedNvml(path), catalog)
            problems, minimum = check_transition(before, after, busy, target, outcome, catalog)
            end_jobs(path)
            destroyed = len({o.uuid for o in before} - {o.uuid for o in after})
            differs = Counter(o.profile for o in before) != Counter(target)
            totals["transitions"] += 1
            totals["with_busy"] += bool(busy)
            totals["refused"] += minimum is None
            totals["destroyed"] += destroyed
            totals["minimum"] += minimum or 0
            totals["kept"] += len(before) - destroyed
            totals["busy_survived"] += len(busy & {o.uuid for o in after})
            totals["busy"] += len(busy)
            totals["mig_parted_destroyed"] += len(before) if differs else 0
            totals["mig_parted_rebuilds"] += differs
            if problems:
                current = [f"{o.profile}@{o.start}{'*' if o.uuid in busy else ''}" for o in before]
                failures.append({"from": current, "to": target, "problems": problems})
    return {"totals": dict(totals), "failures": failures}


def _config(counts: dict[str, int]) -> list[dict]:
    return [{"devices": "all", "mig_enabled": True, "mig_devices": counts}]


def _creates_nothing(nvml, config):
    """Broken on purpose: destroys what the plan says, then skips every create (reports success)."""

    class NoCreate:
        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            return getattr(self._inner, name)

        def create_gpu_instance(self, *args):
            return 0

        def create_compute_instance(self, *args):
            return 0

    return runner.apply(NoCreate(nvml), config)


def _ignores_busy(nvml, config):
    """Broken on purpose: plans as if no process ran (as a runner that never asks NVML for processes would)."""

    class NoProcesses:
        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            return getattr(self._inner, name)

        def running_processes(self, index):
            return []

    return runner.apply(NoProcesses(nvml), config)


RUNNERS = {"nvidia_mig": None, "creates-nothing": _creates_nothing, "ignores-busy": _ignores_busy}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transitions", type=int, default=500)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--product", default="NVIDIA H100 80GB HBM3")
    parser.add_argument(
        "--runner", choices=sorted(RUNNERS), default="nvidia_mig", help="a broken runner shows the checks catch it"
    )
    args = parser.parse_args()
    report = run(args.transitions, args.seed, args.product, RUNNERS[args.runner])
    t = report["totals"]
    print(f"product: {args.product}; runner: {args.runner}; transitions: {t['transitions']} (seed {args.seed})")
    print(f"instances destroyed (read from the GPU):  {t['destroyed']}")
    print(f"theoretical minimum (brute force):        {t['minimum']}")
    print(f"instances kept across transitions:        {t['kept']}")
    print(f"transitions with jobs running:            {t['with_busy']} ({t['refused']} had to be refused)")
    print(f"busy instances that survived:             {t['busy_survived']} / {t['busy']}")
    print(f"mig-parted: GPUs rebuilt / destroyed:     {t['mig_parted_rebuilds']} / {t['mig_parted_destroyed']}")
    print(f"transitions failing a check:              {len(report['failures'])}")
    for case in report["failures"][:5]:
        print(f"  {' '.join(case['from']) or 'empty'} -> {describe(case['to'])}: {'; '.join(case['problems'])}")
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
