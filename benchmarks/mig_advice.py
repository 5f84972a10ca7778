#!/usr/bin/env python3
"""The MIG layout advisor on the Hong Kong pools: how much demand it serves, what it changes, how long it takes.

For each pool (its inventory layout, about half of the instances held by pods, seeded) and each demand it prints
whether the search was exact, the demand served against the demand and the upper bound (compute slices), the
instances destroyed and created, the largest number of count vectors held, and the time. It checks, and exits 1
otherwise, that no allocated instance is destroyed and that every changed GPU destroys exactly the brute-force
minimum for its new layout (placement.minimum_destroyed_keeping, the reference `make bench-mig` uses).

    PYTHONPATH=build/collections python3 benchmarks/mig_advice.py [--seed 1] [--max-states 200]
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from ansible_collections.gpufleet.mig.plugins.module_utils.advisor import CurrentInstance, GpuNow, advise
from ansible_collections.gpufleet.mig.plugins.module_utils.placement import Catalog, minimum_destroyed_keeping
from ansible_collections.gpufleet.mig.plugins.module_utils.profile_tables import H100_80GB

H100 = Catalog.from_table(H100_80GB)
IMAGEGEN_3G = [("3g.40gb", 0), ("3g.40gb", 4)]
IMAGEGEN_2G = [("2g.20gb", 0), ("2g.20gb", 2), ("2g.20gb", 4), ("1g.10gb", 6)]
FINNLP = [("1g.10gb", s) for s in range(7)]
POOLS = {
    "tenant_imagegen": (range(11, 17), lambda gpu: IMAGEGEN_3G if gpu < 4 else IMAGEGEN_2G),
    "tenant_finnlp": (range(17, 21), lambda gpu: FINNLP),
}
DEMANDS = {
    "tenant_imagegen": {
        "night: previews (1g.10gb)": {"1g.10gb": 30},
        "day: SDXL (3g.40gb)": {"3g.40gb": 16},
        "mixed": {"1g.10gb": 20, "2g.20gb": 10, "3g.40gb": 8},
    },
    "tenant_finnlp": {
        "day: embeddings (2g.20gb)": {"2g.20gb": 12},
        "large models (3g.40gb)": {"3g.40gb": 8},
        "mixed": {"1g.10gb": 10, "2g.20gb": 6, "3g.40gb": 4},
    },
}


def pool(name: str, rng: random.Random, held: float) -> list[GpuNow]:
    nodes, layout = POOLS[name]
    return [
        GpuNow(
            f"hk-gpu-{n:02d}",
            g,
            H100,
            True,
            [CurrentInstance(p, s, allocated=rng.random() < held) for p, s in layout(g)],
        )
        for n in nodes
        for g in range(8)
    ]


def check(gpus: list[GpuNow], advice) -> list[str]:
    now = {(g.node, g.index): g for g in gpus}
    problems = []
    for gpu in advice.gpus:
        current = now[(gpu.node, gpu.index)]
        after = {(s.profile, s.start) for s in gpu.after}
        lost = [i for i in current.instances if i.allocated and (i.profile, i.start) not in after]
        if lost:
            problems.append(f"{gpu.node} GPU {gpu.index}: allocated instance(s) destroyed: {lost}")
        if gpu.changed:
            # The minimum among the layouts that keep every allocated instance: the advisor may not destroy
            # those, so the unconstrained minimum can be lower than any layout it may choose.
            held = {(i.profile, i.start) for i in current.instances if i.allocated}
            instances = [(i.profile, i.start) for i in current.instances]
            minimum = minimum_destroyed_keeping(instances, gpu.counts(), held, H100)
            if len(gpu.destroy) != minimum:
                problems.append(f"{gpu.node} GPU {gpu.index}: destroys {len(gpu.destroy)}, minimum {minimum}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--held", type=float, default=0.5, help="share of instances held by pods")
    parser.add_argument("--max-states", type=int, default=200)
    args = parser.parse_args()
    print(
        f"{'pool':16} {'demand':28} {'exact':>5} {'served':>6} {'demand':>6} {'bound':>5} {'destroy':>7} "
        f"{'create':>6} {'states':>6} {'seconds':>7}"
    )
    failures = []
    for name in POOLS:
        for label, demand in DEMANDS[name].items():
            gpus = pool(name, random.Random(args.seed), args.held)
            started = time.perf_counter()
            advice = advise(gpus, demand, max_states=args.max_states)
            elapsed = time.perf_counter() - started
            print(
                f"{name:16} {label:28} {advice.exact!s:>5} {advice.served_slices:6} {advice.demand_slices:6} "
                f"{advice.upper_bound_slices:5} {advice.destroyed:7} {advice.created:6} {advice.states:6} "
                f"{elapsed:7.2f}"
            )
            failures += check(gpus, advice)
    for problem in failures:
        print("FAIL", problem)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
