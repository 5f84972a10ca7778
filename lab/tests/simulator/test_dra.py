"""DynamicMIG under DRA on a trace (simulate/dra.py): first fit on the stock scheduler's node against GPUClaimScore's
node, hand-worked on small pools."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet_lab.simulate.dra import DraPool, dra_gpus_needed, main
from gpufleet_lab.simulate.relayout import HOUR, MINUTE, Pod, RelayoutError

INVENTORY = Path(__file__).resolve().parents[3] / "inventories" / "hongkong"  # whatever the working directory


def pods(*specs: tuple[str, float, float]) -> list[Pod]:
    """(profile, arrival minute, duration minutes) -> pods of tenant t."""
    return [Pod(i, "t", "s", profile, at * MINUTE, minutes * MINUTE) for i, (profile, at, minutes) in enumerate(specs)]


# Two nodes of 8 GPUs would hide it; two 1-GPU nodes show it: seven 1g.10gb pods, then two whole GPUs.
SCATTER = pods(*[("1g.10gb", m, 60) for m in range(7)], ("gpu", 10, 30), ("gpu", 11, 30))


def test_first_fit_on_the_emptiest_node_scatters_small_claims_and_blocks_whole_gpus():
    stock = DraPool("t", 2, SCATTER, "first-fit", per_node=1).simulate()
    # The stock choice alternates nodes: both GPUs hold 1g.10gb, so neither whole-GPU pod can start although
    # 9 of 16 memory slices are free.
    assert stock.fragmentation == 2
    # They wait until one node's 1g.10gb pods have all ended (node 1's last at 65 min, node 0's at 66).
    assert stock.waits[7:] == [55 * MINUTE, 55 * MINUTE]
    ours = DraPool("t", 2, SCATTER, "gpuscore", per_node=1).simulate()
    # GPUClaimScore packs the seven on one GPU (loss 0 after the first), leaving the other whole.
    assert ours.fragmentation == 0
    assert ours.waits[7] == 0
    # The second whole GPU waits for the first (ends at 40 min): capacity, not fragmentation.
    assert ours.waits[8] == 29 * MINUTE
    assert ours.pending_pod_minutes < stock.pending_pod_minutes


def test_a_freed_device_serves_the_oldest_waiting_pod_that_fits():
    trace = pods(("7g.80gb", 0, 30), ("3g.40gb", 1, 30), ("1g.10gb", 2, 30))
    run = DraPool("t", 1, trace, "gpuscore").simulate()
    assert run.waits == [0, 29 * MINUTE, 28 * MINUTE]
    assert run.never == 0 and run.fragmentation == 0


def test_gpus_needed_is_the_smallest_pool_within_the_bound():
    trace = pods(*[("3g.40gb", 0, 60)] * 6)
    assert dra_gpus_needed("t", trace, "first-fit", bound_seconds=0, limit=8) == 3
    assert dra_gpus_needed("t", trace, "gpuscore", bound_seconds=HOUR, limit=8) == 2
    assert dra_gpus_needed("t", trace, "gpuscore", bound_seconds=0, limit=2) is None


def test_bad_input_is_refused_with_a_message(capsys):
    with pytest.raises(RelayoutError, match="must be one of first-fit, gpuscore"):
        DraPool("t", 1, SCATTER, "best-fit")
    assert main(["--inventory", "/nonexistent"], out=lambda _: None) == 2
    assert "dra:" in capsys.readouterr().err


def test_the_fleet_size_table_command_compares_the_four_ways_on_the_pools_named(tmp_path):
    # docs/dra.md's table: `--pools imagegen`, static layout beside the three ways (a short trace here).
    lines: list[str] = []
    output = tmp_path / "dra.json"
    args = ["--inventory", str(INVENTORY), "--pools", "imagegen", "--hours", "0.1", "--output", str(output)]
    assert main(args, out=lines.append) == 0
    table = lines[0].splitlines()
    assert len(table) == 5  # header, then static, first fit, GPUClaimScore, re-layout: imagegen only
    assert all(line.startswith("imagegen ") for line in table[1:]) and "static layout" in table[1]
    result = json.loads(output.read_text())
    assert set(result["gpus_needed"]) == {"static", "first-fit", "gpuscore", "relayout"}
    assert set(result["gpus_needed"]["static"]) == {"imagegen"}
    assert all(isinstance(n, int) and n > 0 for way in result["gpus_needed"].values() for n in way.values())


def test_an_unknown_pool_is_refused_with_the_inventorys_pools(capsys):
    args = ["--inventory", str(INVENTORY), "--pools", "imagegen,llm", "--no-search", "--hours", "0.1"]
    assert main(args, out=lambda _: None) == 2
    assert "no MIG pool llm (the inventory's: imagegen, finnlp)" in capsys.readouterr().err
