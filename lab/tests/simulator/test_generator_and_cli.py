"""The seeded generator and the simulate command end to end, on a small fleet file (fast)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from gpufleet_extender.scoring import Policy

from gpufleet_lab.simulate import main
from gpufleet_lab.simulate.fleet import fleet_from_yaml
from gpufleet_lab.simulate.generator import generate_trace
from gpufleet_lab.simulate.metrics import summarise
from gpufleet_lab.simulate.model import simulate
from gpufleet_lab.simulate.policies import make_policy

SMALL_FLEET = """
namespaces: {llm-inference: llm, imagegen: imagegen, finnlp: finnlp}
nodes:
  - {name: llm, tenant: llm, count: 2, gpus: 8}
  - name: img
    tenant: imagegen
    count: 2
    gpus: 8
    mig_partition_config:
      - {devices: [0, 1, 2, 3], mig_enabled: true, mig_devices: {3g.40gb: 2}}
      - {devices: [4, 5, 6, 7], mig_enabled: true, mig_devices: {2g.20gb: 3, 1g.10gb: 1}}
  - name: nlp
    tenant: finnlp
    gpus: 8
    mig_partition_config:
      - {devices: all, mig_enabled: true, mig_devices: {1g.10gb: 7}}
"""


@pytest.fixture
def fleet_file(tmp_path):
    path = tmp_path / "fleet.yml"
    path.write_text(SMALL_FLEET)
    return path


def test_generated_trace_is_deterministic_and_mixed(fleet_file):
    fleet = fleet_from_yaml(fleet_file)
    trace = generate_trace(fleet, seed=7, duration=3600)
    assert trace == generate_trace(fleet, seed=7, duration=3600)
    assert trace.pods != generate_trace(fleet, seed=8, duration=3600).pods
    kinds = Counter((p.namespace, p.resource) for p in trace.pods)
    assert set(kinds) == {
        ("llm-inference", "nvidia.com/gpu"),
        ("imagegen", "nvidia.com/mig-3g.40gb"),
        ("imagegen", "nvidia.com/mig-2g.20gb"),
        ("imagegen", "nvidia.com/mig-1g.10gb"),
        ("finnlp", "nvidia.com/mig-1g.10gb"),
    }
    llm = [p for p in trace.pods if p.namespace == "llm-inference"]
    assert {p.count for p in llm} <= {4, 8} and min(p.util.at(0) for p in llm) >= 0.5
    nlp = [p for p in trace.pods if p.namespace == "finnlp"]
    assert kinds[("finnlp", "nvidia.com/mig-1g.10gb")] > 5 * len(llm)  # many small pods
    assert max(p.duration for p in nlp) <= 600
    bursts = [p for p in trace.pods if p.resource == "nvidia.com/mig-3g.40gb"]
    assert any(len(p.util.values) > 1 for p in bursts)  # image generation alternates idle and busy
    assert all(p.mem_gb.at(0) <= 40 for p in bursts)


def test_same_seed_same_results(fleet_file):
    fleet = fleet_from_yaml(fleet_file).with_replicas(2)
    trace = generate_trace(fleet, seed=3, duration=1800)
    runs = [summarise(simulate(fleet, trace, make_policy("random-fit", 3), Policy())) for _ in range(2)]
    assert runs[0] == runs[1]
    other_seed = summarise(simulate(fleet, trace, make_policy("random-fit", 4), Policy()))
    assert other_seed.load_cov != runs[0].load_cov


def test_command_prints_the_table_and_writes_json_and_plot(fleet_file, tmp_path, capsys):
    out = tmp_path / "sim"
    code = main(["--fleet", str(fleet_file), "--hours", "0.5", "--seed", "2", "--output", str(out), "--quiet"])
    assert code == 0
    printed = capsys.readouterr().out
    for policy in ("count", "random-fit", "load", "load-no-inflight"):
        assert f"\n{policy} " in printed
    document = json.loads((out / "results.json").read_text())
    assert list(document["policies"]) == ["count", "random-fit", "load", "load-no-inflight"]
    assert document["fleet"]["devices"]["nvidia.com/mig-3g.40gb"] == 16
    assert len(document["goals"]) == 2
    # Each goal's verdict follows from the policies' own figures, and is printed as the JSON says.
    load, count = document["policies"]["load"], document["policies"]["count"]
    hot, cov = document["goals"]
    # Retired goals: shown with their figures, never judged.
    assert hot["goal"] == "load makes zero hot placements" and hot["passed"] is None
    assert f"load: {load['hot_placements']} hot placement(s)" in hot["detail"] and "retired" in hot["detail"]
    assert cov["goal"].startswith("load CoV <= ") and cov["passed"] is None
    assert f"load {load['load_cov']:.3f} vs count {count['load_cov']:.3f}" in cov["detail"]
    marks = {True: "met", False: "NOT MET", None: "not judged"}
    for goal in document["goals"]:
        assert f"  [{marks[goal['passed']]}] {goal['goal']}: {goal['detail']}\n" in printed
    assert (out / "node_load.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The same seed prints the same table.
    main(["--fleet", str(fleet_file), "--hours", "0.5", "--seed", "2", "--output", str(out), "--quiet", "--no-plot"])
    assert capsys.readouterr().out.split("Goals")[0] == printed.split("Goals")[0]


def test_saved_trace_replays_to_the_same_figures(fleet_file, tmp_path, capsys):
    saved = tmp_path / "trace.csv"
    args = ["--fleet", str(fleet_file), "--policies", "count,load", "--no-plot", "--quiet"]
    main([*args, "--hours", "0.25", "--write-trace", str(saved), "--output", str(tmp_path / "a")])
    main([*args, "--trace", str(saved), "--output", str(tmp_path / "b")])
    first, second = (json.loads((tmp_path / d / "results.json").read_text())["policies"] for d in "ab")
    assert first == second


def test_bad_input_exits_2_with_the_reason(fleet_file, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"arrival": 0, "namespace": "finnlp", "resource": "gpu", "duration": -1}\n')
    assert main(["--fleet", str(fleet_file), "--trace", str(bad), "--output", str(tmp_path)]) == 2
    assert "bad.jsonl:1: duration must be a finite number >= 0" in capsys.readouterr().err
    homeless = tmp_path / "homeless.jsonl"
    homeless.write_text('{"arrival": 0, "namespace": "finnlp", "resource": "gpu", "duration": 5}\n')
    assert main(["--fleet", str(fleet_file), "--trace", str(homeless), "--output", str(tmp_path)]) == 2
    assert "can never run on this fleet: pod-1: no node of tenant finnlp's pool has nvidia.com/gpu" in (
        capsys.readouterr().err
    )
    # A row with typos (the resource, the namespace) names each as unknown.
    typo = tmp_path / "typo.csv"
    typo.write_text("arrival,namespace,resource,duration\n0,imagegen,2g.21gb,60\n1,nobody,gpu,60\n")
    assert main(["--fleet", str(fleet_file), "--trace", str(typo), "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "2 pod(s) of the trace can never run on this fleet" in err
    assert "pod-2: resource nvidia.com/mig-2g.21gb is on no node of this fleet (it has nvidia.com/gpu, " in err
    assert "pod-3: namespace 'nobody' belongs to no tenant (the fleet's namespaces: finnlp, imagegen, " in err
    with pytest.raises(SystemExit):
        main(["--policies", "fastest"])


def test_check_flag_turns_failed_goals_into_exit_1(tmp_path):
    # One 1g.10gb instance time-sliced x2: the second 8 GB pod cannot fit beside the first under any policy, so load
    # fails with out-of-memory as often as count and the out-of-memory goal (0.1x count's) cannot hold.
    fleet = tmp_path / "fleet.yml"
    fleet.write_text(
        "namespaces: {finnlp: finnlp}\nsharing: {finnlp: {1g.10gb: 2}}\nnodes:\n"
        "  - {name: nlp, tenant: finnlp, gpus: 1, mig_partition_config: "
        "[{devices: all, mig_enabled: true, mig_devices: {1g.10gb: 1}}]}\n"
    )
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "\n".join(
            f'{{"arrival": {i}, "namespace": "finnlp", "resource": "1g.10gb", "duration": 900, "util": 0.3,'
            f' "mem_gb": 8}}'
            for i in range(2)
        )
    )
    args = ["--fleet", str(fleet), "--trace", str(trace), "--no-plot", "--quiet", "--output", str(tmp_path)]
    args += ["--policies", "count,load"]
    assert main(args) == 0
    document = json.loads((tmp_path / "results.json").read_text())
    oom = next(g for g in document["goals"] if g["key"] == "shared-oom")
    assert oom["passed"] is False and "1 against 1" in oom["detail"]
    assert main([*args, "--check"]) == 1


def test_extender_settings_file_sets_thresholds_and_in_flight_expiry(fleet_file, tmp_path, capsys):
    config = tmp_path / "extender.yaml"
    config.write_text("GPU_UTIL_THRESHOLD: 0.5\nINFLIGHT_MAX_SECONDS: 40\n")
    out = tmp_path / "out"
    args = ["--fleet", str(fleet_file), "--hours", "0.1", "--no-plot", "--quiet", "--output", str(out)]
    assert main([*args, "--config", str(config), "--policies", "load"]) == 0
    document = json.loads((out / "results.json").read_text())
    assert document["extender"]["gpu_util_threshold"] == 0.5
    assert document["model"]["inflight_max_s"] == 40
    config.write_text("GPU_UTIL_THRESHOLD: 2\n")
    assert main([*args, "--config", str(config)]) == 2
    assert "GPU_UTIL_THRESHOLD" in capsys.readouterr().err


def test_command_shares_a_pool_and_prints_the_per_pool_goals(fleet_file, tmp_path, capsys):
    out = tmp_path / "shared"
    args = ["--fleet", str(fleet_file), "--hours", "0.25", "--no-plot", "--quiet", "--output", str(out)]
    code = main([*args, "--share", "finnlp:1g.10gb=4", "--policies", "count,load"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "Goals for shared devices, tensor-parallel pods and interference:" in printed
    assert "in the time-sliced finnlp pool, load's out-of-memory failures are at most 0.1x count's" in printed
    assert "in the time-sliced finnlp pool, load's p95 slowdown is at most 0.7x count's" in printed
    document = json.loads((out / "results.json").read_text())
    # The figures behind the goals are the pool figures results.json carries.
    oom = next(g for g in document["goals"] if g["key"] == "shared-oom")
    figures = document["pools"]
    assert f"{figures['load']['oom']['finnlp']:g} against {figures['count']['oom']['finnlp']:g}" in oom["detail"]
    assert document["model"]["device_choice"] == "plugin"
    assert document["fleet"]["sharing"] == {"finnlp:nvidia.com/mig-1g.10gb": 4}
    assert document["extender"]["shared_resources"] == {"nvidia.com/mig-1g.10gb": 4}
    assert set(document["pools"]["load"]["load_cov"]) == {"finnlp", "imagegen", "llm"}
    with pytest.raises(SystemExit):
        main([*args, "--share", "finnlp=4"])


def test_command_runs_the_tp_mix_trace_with_interference(fleet_file, tmp_path, capsys):
    out = tmp_path / "tp"
    args = ["--fleet", str(fleet_file), "--hours", "0.25", "--no-plot", "--quiet", "--output", str(out)]
    assert main([*args, "--scenario", "tp-mix", "--interference", "0.3"]) == 0
    printed = capsys.readouterr().out
    assert "auto's wait p95 of 8-GPU pods is at most 0.5x spread's" in printed
    assert "spread's mean slowdown in the llm pool is at most 0.8x count's" in printed
    document = json.loads((out / "results.json").read_text())
    assert list(document["policies"]) == ["count", "spread", "auto"]
    assert document["model"]["interference_alpha"] == 0.3
    slowdowns = [document["pools"][p]["mean_slowdown"]["llm"] for p in ("count", "spread", "auto")]
    # LLM pods ended under every policy, none faster than nominal (test_sharing_and_interference times one by hand).
    assert None not in slowdowns and all(s >= 0 for s in slowdowns)
