"""Every named config of the real mig-parted and GPU Operator files, on 8 x H100 80GB and 8 x H200: nvidia_mig does
what mig-parted itself would do - the same layout, nothing where no entry selects a GPU, or a refusal for the same
reason (nvidia_mig refuses before writing anything; mig-parted fails part-way).

The files live outside the repository, in ../shared/mig-parted-configs/ next to the checkout (SOURCES.md there
names the upstream commits); without them these tests skip. What mig-parted would do is modelled here on its own,
from its Go sources, not with the collection's code:

- selection (assert.go WalkSelectedMigConfigForEachGPU, helpers.go): entries in order; an entry applies to a GPU
  when no device-filter is given or one of its IDs equals the GPU's PCI device ID, and devices is "all" or lists
  the index; the last entry applied wins;
- an entry with mig-enabled: false turns MIG off, with no instances; with mig-enabled: true, every profile of
  mig-devices must be one the GPU has (go-nvlib ParseMigProfile), else mig-parted fails for that GPU;
- the instances must fit: mig-parted tries the orders of the profiles until NVML places them all; that succeeds
  exactly when some non-overlapping placement exists within the GPU's compute slices and per-profile maximums,
  which is searched here by brute force over the H100/H200 placement facts below.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml
from _helpers import new_sim
from ansible_collections.gpufleet.mig.plugins.module_utils import runner
from ansible_collections.gpufleet.mig.plugins.module_utils.exceptions import SpecError
from ansible_collections.gpufleet.mig.plugins.modules.nvidia_mig import load_mig_parted_file
from conftest import REPO

CONFIG_DIR = REPO.parent / "shared" / "mig-parted-configs"
FILES = sorted(CONFIG_DIR.glob("*.yaml")) if CONFIG_DIR.is_dir() else []
pytestmark = pytest.mark.skipif(not FILES, reason=f"no mig-parted config files in {CONFIG_DIR}")
GPUS = 8

# Facts of the two products (NVML names, PCI device ID, per profile: compute slices, max count, placements as
# start:size over the 8 memory slices). Written out here, independent of profile_tables.py.
_HOPPER = {  # suffix -> (compute slices, max count, starts, size)
    "1g": (1, 7, (0, 1, 2, 3, 4, 5, 6), 1),
    "1g+me": (1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
    "1g.wide": (1, 4, (0, 2, 4, 6), 2),
    "2g": (2, 3, (0, 2, 4), 2),
    "3g": (3, 2, (0, 4), 4),
    "4g": (4, 1, (0,), 4),
    "7g": (7, 1, (0,), 8),
}
# GPU-instance profile IDs (what placements and creation take), the same on H100 and H200.
PROFILE_IDS = {"1g": 19, "1g+me": 20, "1g.wide": 15, "2g": 14, "3g": 9, "4g": 5, "7g": 0}
PRODUCTS = {
    "NVIDIA H100 80GB HBM3": (
        0x233010DE,
        {
            "1g.10gb": "1g",
            "1g.10gb+me": "1g+me",
            "1g.20gb": "1g.wide",
            "2g.20gb": "2g",
            "3g.40gb": "3g",
            "4g.40gb": "4g",
            "7g.80gb": "7g",
        },
    ),
    "NVIDIA H200": (
        0x233510DE,
        {
            "1g.18gb": "1g",
            "1g.18gb+me": "1g+me",
            "1g.35gb": "1g.wide",
            "2g.35gb": "2g",
            "3g.71gb": "3g",
            "4g.71gb": "4g",
            "7g.141gb": "7g",
        },
    ),
}


def fits(counts: dict[str, int], names: dict[str, str]) -> bool:
    """Brute force: is there a placement of every instance, no memory slice twice, at most 7 compute slices?"""
    todo = []
    for name, count in counts.items():
        compute, maximum, starts, size = _HOPPER[names[name]]
        if count > maximum:
            return False
        todo += [(compute, starts, size)] * count
    if sum(compute for compute, _starts, _size in todo) > 7:
        return False

    def place(i: int, used: frozenset) -> bool:
        if i == len(todo):
            return True
        _compute, starts, size = todo[i]
        return any(
            place(i + 1, used | set(range(start, start + size)))
            for start in starts
            if not used & set(range(start, start + size))
        )

    return place(0, frozenset())


def mig_parted_would(entries: list[dict], product: str) -> tuple[str, object]:
    """("noop", None), ("refuse", (kind, detail)) or ("apply", {index: (mig_enabled, Counter)})."""
    device_id, names = PRODUCTS[product]
    chosen: dict[int, dict] = {}
    for entry in entries:
        device_filter = entry.get("device-filter")
        if device_filter is not None:
            ids = [device_filter] if isinstance(device_filter, str) else device_filter
            if not any(int(text, 16) == device_id for text in ids):
                continue
        for index in range(GPUS):
            if entry["devices"] == "all" or index in entry["devices"]:
                chosen[index] = entry  # the last entry applied wins
    if not chosen:
        return "noop", None
    layout = {}
    for index, entry in sorted(chosen.items()):
        if not entry["mig-enabled"]:
            layout[index] = (False, Counter())
            continue
        counts = {name: count for name, count in (entry.get("mig-devices") or {}).items() if count}
        unknown = sorted(name for name in counts if name not in names)
        if unknown:
            return "refuse", ("unknown profile", unknown)
        if not fits(counts, names):
            return "refuse", ("does not fit", counts)
        layout[index] = (True, Counter(counts))
    return "apply", layout


def named_configs():
    for path in FILES:
        for name in yaml.safe_load(path.read_text())["mig-configs"]:
            yield pytest.param(path, name, id=f"{path.stem.split('_', 1)[0]}:{path.stem[-12:]}:{name}")


def test_the_files_hold_254_named_configs():
    assert len(FILES) == 6
    assert sum(len(yaml.safe_load(p.read_text())["mig-configs"]) for p in FILES) == 254


@pytest.mark.parametrize("product", sorted(PRODUCTS))
@pytest.mark.parametrize(("path", "config_name"), list(named_configs()))
def test_config_does_what_mig_parted_would(tmp_path, path, config_name, product):
    raw_entries = yaml.safe_load(path.read_text())["mig-configs"][config_name]
    kind, expected = mig_parted_would(raw_entries, product)
    sim = new_sim(tmp_path, gpus=GPUS, product_name=product)
    state_before = Path(sim.path).read_text()
    config = load_mig_parted_file(str(path), config_name)

    if kind == "refuse":
        reason, detail = expected
        with pytest.raises(SpecError) as failure:
            runner.apply(sim, config)
        message = failure.value.message
        if reason == "unknown profile":
            assert f"unknown MIG profile(s) {', '.join(detail)} for this GPU" in message, message
        else:
            assert any(
                text in message for text in ("at most", "compute slices", "memory slices", "no valid placement")
            ), message
        assert Path(sim.path).read_text() == state_before  # refused before any write
        return

    result = runner.apply(sim, config)
    if kind == "noop":
        assert result["gpus"] == [] and not result["changed"]
        assert Path(sim.path).read_text() == state_before
        return

    assert [g["index"] for g in result["gpus"]] == sorted(expected)
    state = json.loads(Path(sim.path).read_text())
    _device_id, names = PRODUCTS[product]
    by_id = {PROFILE_IDS[kind]: name for name, kind in names.items()}
    for gpu in state["gpus"]:
        mig_enabled, counts = expected.get(gpu["index"], (False, Counter()))  # unselected: left as it was (off)
        assert gpu["mig_mode"]["current"] is mig_enabled
        assert Counter(by_id[gi["profile_id"]] for gi in gpu["gpu_instances"]) == counts
        for gi in gpu["gpu_instances"]:
            _compute, _maximum, starts, size = _HOPPER[names[by_id[gi["profile_id"]]]]
            assert gi["start"] in starts and gi["size"] == size and len(gi["compute_instances"]) == 1
    assert not result["reboot_required"]
    assert not runner.apply(sim, config)["changed"]  # applied: a second run changes nothing


def test_outcome_totals():
    """What mig-parted would do with the 254 configs on each product, by outcome: the reference alone, so that the
    totals do not depend on which other tests ran before (alone, in another order, under xdist)."""
    outcomes: Counter = Counter()
    for path in FILES:
        for entries in yaml.safe_load(path.read_text())["mig-configs"].values():
            for product in PRODUCTS:
                outcomes[(product, mig_parted_would(entries, product)[0])] += 1
    assert dict(outcomes) == EXPECTED_TOTALS


# Most refusals are configs for other GPU models that select every GPU (all-1g.5gb, all-1g.24gb.me.all, ...):
# mig-parted fails on an H100 there too, for the same reason (no such profile on this GPU).
EXPECTED_TOTALS = {
    ("NVIDIA H100 80GB HBM3", "apply"): 38,
    ("NVIDIA H100 80GB HBM3", "noop"): 15,
    ("NVIDIA H100 80GB HBM3", "refuse"): 201,
    ("NVIDIA H200", "apply"): 32,
    ("NVIDIA H200", "noop"): 14,
    ("NVIDIA H200", "refuse"): 208,
}
