"""Shared test helpers: catalogs, a fresh simulator, and the bench-mig benchmark (benchmarks/bench_mig.py)."""

from __future__ import annotations

import json
from itertools import product
from pathlib import Path

from ansible_collections.gpufleet.mig.benchmarks import bench_mig as bench  # noqa: F401  (the tests' import)
from ansible_collections.gpufleet.mig.plugins.module_utils.nvml_sim import SimulatedNvml, new_state
from ansible_collections.gpufleet.mig.plugins.module_utils.planner import Catalog
from ansible_collections.gpufleet.mig.plugins.module_utils.profile_tables import H100_80GB, H200_141GB

REPO = Path(__file__).resolve().parents[3]
H100 = Catalog.from_table(H100_80GB)
H200 = Catalog.from_table(H200_141GB)


def every_count_combination(catalog: Catalog):
    """All {profile: count} requests within each profile's maximum (the empty one excluded)."""
    names = catalog.names()
    for counts in product(*(range(catalog.by_name[n].instance_count + 1) for n in names)):
        wanted = {n: c for n, c in zip(names, counts, strict=True) if c}
        if wanted:
            yield wanted


def new_sim(tmp_path: Path, gpus: int = 2, product_name: str = "NVIDIA H100 80GB HBM3") -> SimulatedNvml:
    path = tmp_path / "nvml-sim.json"
    path.write_text(json.dumps(new_state(gpus=gpus, product=product_name)))
    return SimulatedNvml(str(path))


def layout(counts: dict, devices="all") -> list[dict]:
    return [{"devices": devices, "mig_enabled": True, "mig_devices": counts}]
