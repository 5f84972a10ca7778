"""The host side of a MIG change survives process death, torn state writes, power loss and concurrent runs.

tests/faults/host_faults.py injects each fault at every NVML write of three layout changes and recovers each host
by a playbook run and by the boot unit; these tests assert its invariants, and that a deliberately broken recovery
(a state write that is not atomic, runs not serialised by the host's lock) is caught.
"""

from __future__ import annotations

import contextlib

import host_faults
import pytest
from ansible_collections.gpufleet.mig.plugins.module_utils import boot_apply, nvml_sim
from ansible_collections.gpufleet.mig.plugins.modules import nvidia_mig
from conftest import REPORTS


@pytest.fixture(scope="module")
def tallies(tmp_path_factory):
    result = host_faults.run_all(tmp_path_factory.mktemp("host-faults"))
    REPORTS.append(host_faults.report(result))
    return result


@pytest.mark.parametrize("fault", [*host_faults.FAULTS, "concurrent runs"])
def test_every_injected_fault_converges_with_nothing_lost(tallies, fault):
    tally = tallies[fault]
    assert tally.problems == []
    assert tally.injected > 0 and tally.converged == tally.injected
    assert tally.unreadable == tally.busy_destroyed == tally.lock_stuck == 0


def test_every_write_of_every_scenario_was_hit(tallies):
    # kill, torn write and power loss each ran once per write per recovery: the same count for the three.
    counts = {tallies[fault].injected for fault in host_faults.FAULTS}
    assert len(counts) == 1 and counts.pop() >= 2 * 30


def test_a_state_write_that_is_not_atomic_is_caught(tmp_path, monkeypatch):
    def save_in_place(self):  # what atomic writes prevent: the file itself truncated, then written
        with open(self.path, "w", encoding="utf-8") as handle:
            nvml_sim.json.dump(self.state, handle, indent=2, sort_keys=True)

    monkeypatch.setattr(nvml_sim.SimulatedNvml, "_save", save_in_place)
    tallies = host_faults.crash_suite(tmp_path, host_faults.SCENARIOS[:1], faults=("torn write",))
    assert tallies["torn write"].unreadable > 0


def test_runs_not_serialised_by_the_lock_are_caught(tmp_path, monkeypatch):
    def no_lock(*_args, **_kwargs):
        return contextlib.nullcontext(0.0)

    monkeypatch.setattr(nvidia_mig, "mig_change_lock", no_lock)
    monkeypatch.setattr(boot_apply, "mig_change_lock", no_lock)
    tally = host_faults.concurrent_suite(tmp_path)
    assert tally.converged < tally.injected and tally.problems
