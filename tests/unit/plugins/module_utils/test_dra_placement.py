"""dra_placement: the driver's device names and order, the allocator's first fit, room and the claim score; the Go
vectors generated from it are current."""

from __future__ import annotations

import pytest
from ansible_collections.gpufleet.mig.plugins.module_utils import dra_placement as dp
from ansible_collections.gpufleet.mig.plugins.module_utils.profile_tables import H100_80GB, H200_141GB
from gpufleet_testsupport.collection import REPO

ONE_G = dp.kind("1g.10gb")
TWO_G = dp.kind("2g.20gb")
THREE_G = dp.kind("3g.40gb")
WHOLE = dp.kind(dp.WHOLE_GPU)


def test_device_names_are_the_drivers():
    rows = {row.name: row for row in H100_80GB.profiles}
    # MigSpecTuple.ToCanonicalName: dots dropped, then RFC 1123 ('+' becomes '-').
    assert dp.device_name(0, rows["1g.10gb"], 2) == "gpu-0-mig-1g10gb-19-2"
    assert dp.device_name(3, rows["3g.40gb"], 4) == "gpu-3-mig-3g40gb-9-4"
    assert dp.device_name(1, rows["1g.10gb+me"], 0) == "gpu-1-mig-1g10gb-me-20-0"
    assert dp.device_name(7, rows["7g.80gb"], 0) == "gpu-7-mig-7g80gb-0-0"


@pytest.mark.parametrize("table", [H100_80GB, H200_141GB])
def test_a_gpu_publishes_every_placement_and_itself_sorted_by_name(table):
    devices = dp.published_devices(5, table)
    names = [name for name, *_ in devices]
    assert names == sorted(names)
    assert names[0] == "gpu-5"
    # 7 + 1 (+me: one at a time, at any of 7 starts: 7) + 4 + 3 + 2 + 1 + 1 placements, and the whole GPU.
    assert len(devices) == 7 + 7 + 4 + 3 + 2 + 1 + 1 + 1
    assert ("gpu-5", dp.WHOLE_GPU, 0, 8) in devices


def test_first_fit_takes_the_first_gpu_with_room_and_its_lowest_start():
    assert dp.first_fit([set(), set()], ONE_G) == (0, 0)
    assert dp.first_fit([{0, 1, 3}, set()], ONE_G) == (0, 2)  # a hole is refilled first
    assert dp.first_fit([{0, 1, 3}, set()], TWO_G) == (0, 4)  # 2g starts at 0, 2, 4 only
    assert dp.first_fit([{0}, set()], THREE_G) == (0, 4)
    assert dp.first_fit([{0}, set()], WHOLE) == (1, 0)
    assert dp.first_fit([{0, 4}, {7}], THREE_G) == (1, 0)
    assert dp.first_fit([{0, 4}, {3, 7}], THREE_G) is None


@pytest.mark.parametrize(
    ("occupied", "expected"),
    [(set(), 16), ({0}, 4), ({4}, 4), ({3, 4}, 0), ({0, 1, 2, 3}, 4), (set(range(8)), 0), ({6}, 4)],
)
def test_room_counts_free_large_blocks_and_an_empty_gpu(occupied, expected):
    assert dp.room(occupied) == expected


def test_the_node_that_loses_the_least_room_scores_highest_then_the_fullest_gpu():
    empty = dp.evaluate_node([set(), set()], ONE_G)
    started = dp.evaluate_node([{0}, set()], ONE_G)
    half = dp.evaluate_node([{0, 1, 2, 3}, set()], ONE_G)
    assert (empty.loss, started.loss, half.loss) == (12, 0, 4)
    assert started.score > half.score > empty.score
    # Equal loss: the fuller GPU wins (packing).
    one = dp.evaluate_node([{0}], ONE_G)
    three = dp.evaluate_node([{0, 1, 2}], ONE_G)
    assert one.loss == three.loss == 0 and three.score > one.score
    assert dp.evaluate_node([set(range(8))], ONE_G) is None
    assert 0 <= dp.evaluate_node([set()], WHOLE).score <= dp.MAX_SCORE


@pytest.mark.parametrize(("profile", "gpu"), [("9g.90gb", set()), ("1g.10gb", {8}), ("1g.10gb", {-1})])
def test_bad_input_is_a_placement_error(profile, gpu):
    with pytest.raises(dp.PlacementError):
        dp.evaluate_node([gpu], dp.kind(profile))


def test_the_go_vectors_are_current():
    import importlib.util

    spec = importlib.util.spec_from_file_location("dra_vectors", REPO / "tools/dra_vectors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.OUTPUT.read_text() == module.render(), "run `python tools/dra_vectors.py`"
