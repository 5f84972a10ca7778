"""The sensitivity command (simulate/sensitivity.py): one parameter scaled per case, the goals' own verdicts."""

from __future__ import annotations

import json

import pytest
from gpufleet_extender.scoring import Policy

from gpufleet_lab.simulate.model import ModelSettings
from gpufleet_lab.simulate.sensitivity import _cases, format_tables, main
from gpufleet_lab.simulate.trace import Schedule

from sim_helpers import pod


def test_each_case_scales_one_parameter_and_keeps_the_rest():
    model, policy = ModelSettings(), Policy(shared_mem_free_min=0.35)
    cases = {(c.parameter, c.factor): c for c in _cases(model, policy, shared=True)}
    assert len(cases) == 1 + 2 * 6
    probe = pod("p", 0, Schedule.constant(0.8), duration=100, mem_gb=Schedule.constant(2.0))
    high_memory = cases[("pod GPU memory", 1.5)]
    assert high_memory.pods(probe).mem_gb.values == (3.0,) and high_memory.model == model
    assert cases[("pod utilisation", 1.5)].pods(probe).util.values == (1.0,)  # clamped to a whole device
    assert cases[("time-slicing efficiency E", 1.5)].model.timeslice_efficiency == 1.0  # capped: no cost at all
    assert cases[("time-slicing efficiency E", 0.5)].model.timeslice_efficiency == pytest.approx(0.38)
    assert cases[("scrape interval", 0.5)].model.scrape_interval == 7.5
    assert cases[("SHARED_MEM_FREE_MIN (setting)", 1.5)].policy.shared_mem_free_min == pytest.approx(0.525)
    assert cases[("load curve (pods running)", 0.5)].curve.peak == 0.4
    assert cases[("baseline", 1.0)].pods(probe) is probe
    tp = {(c.parameter, c.factor): c for c in _cases(model, Policy(), shared=False)}
    assert tp[("LLM pod duration", 0.5)].pods(probe).duration == 50


def test_table_marks_each_goal_as_the_run_would():
    shared = [
        {
            "parameter": "baseline",
            "factor": 1.0,
            "oom": (0, 0),
            "oom_ratio": None,
            "oom_met": True,
            "p95_slowdown": (0.45, 0.73),
            "slowdown_ratio": 0.45 / 0.73,
            "slowdown_met": True,
            "wait_p95": (123.0, 0.0),
        }
    ]
    tp = [
        {"parameter": "baseline", "factor": 1.0, "wait8_p95": (900.0, 1000.0), "wait8_ratio": 0.9, "wait8_met": False}
    ]
    table = format_tables(shared, tp)
    assert "| baseline | 1 | 0 / 0 | - met (0 against 0) | +45.0% / +73.0% | 0.62 met | 123 s / 0 s |" in table
    assert "| baseline | 1 | 900 s / 1000 s | 0.90 NOT MET |" in table


def test_command_writes_the_table_and_the_json(tmp_path):
    fleet = tmp_path / "fleet.yml"
    fleet.write_text(
        "namespaces: {finnlp: finnlp, llm-inference: llm}\nnodes:\n"
        "  - {name: llm, tenant: llm, gpus: 8, count: 2}\n"
        "  - {name: nlp, tenant: finnlp, gpus: 1, mig_partition_config: "
        "[{devices: all, mig_enabled: true, mig_devices: {1g.10gb: 7}}]}\n"
    )
    out = tmp_path / "sens"
    assert main(["--fleet", str(fleet), "--hours", "0.25", "--output", str(out), "--no-plot", "--quiet"]) == 0
    document = json.loads((out / "sensitivity.json").read_text())
    assert len(document["shared"]) == 13 and len(document["tp"]) == 7
    assert (out / "sensitivity.md").read_text().startswith("Time-sliced finnlp pool")
    assert main(["--fleet", str(tmp_path / "nowhere.yml"), "--output", str(out), "--quiet"]) == 2
