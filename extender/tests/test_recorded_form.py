"""The recorded form (PROMETHEUS_QUERY=recorded): the rule group metrics_source.recording_rules generates, the
packed value's decoding (sentinels, NaN, out of range), and a refresh that reads it. The rules against a real
Prometheus, snapshot for snapshot with the raw series: tests/unit/test_recorded_metrics.py."""

from __future__ import annotations

import asyncio
import math
import shutil
import subprocess

import httpx
import pytest
import yaml

from gpufleet_extender.cli import main as cli_main
from gpufleet_extender.metrics_source import (
    NODE_SAMPLE_TIME_SERIES,
    PACKED_SERIES,
    RECORDED_EVALUATION_QUERY,
    MetricsSourceError,
    PrometheusSource,
    decode_packed,
    exporter_matchers,
    recording_rules,
)
from gpufleet_extender.snapshot import FB_FREE, FB_USED, GR_ENGINE_ACTIVE

LABELS = ("Hostname", "hostname")
MIG = {"Hostname": "n1", "gpu": "0", "UUID": "GPU-a", "GPU_I_ID": "3", "GPU_I_PROFILE": "1g.10gb"}


def packed(util_permille: int, memory_permille: int, pods: int) -> float:
    return float(util_permille * 10_000_000 + memory_permille * 1_000 + pods)


def test_a_packed_value_decodes_into_the_samples_build_snapshot_folds():
    util, used, free = decode_packed(MIG, packed(950, 421, 3))
    assert (util.name, util.value, util.pods) == (GR_ENGINE_ACTIVE, 0.95, 3)
    assert (used.name, used.value, free.name, free.value) == (FB_USED, 421.0, FB_FREE, 579.0)
    assert all(s.labels == MIG for s in (util, used, free))
    edges = decode_packed(MIG, packed(1000, 0, 998))
    assert [s.value for s in edges] == [1.0, 0.0, 1000.0] and edges[0].pods == 998
    assert decode_packed(MIG, 0.0)[0].value == 0.0


def test_sentinels_mean_unknown():
    (util,) = decode_packed(MIG, packed(120, 1001, 999))  # no framebuffer metrics: no FB samples
    assert (util.value, util.pods) == (0.12, None)  # no pod label on any series: pods unknown


@pytest.mark.parametrize(
    "value",
    [
        math.nan,
        math.inf,
        -1.0,
        packed(1001, 0, 0),  # utilisation above 100 %
        packed(500, 1002, 0),  # memory past the sentinel
        packed(500, 10, 0) + 0.5,  # not a whole number: not what the rule writes
        packed(500, 10, 0) * 100,  # above any utilisation
    ],
)
def test_a_value_nan_or_out_of_range_decodes_as_nan_so_the_node_is_screened_out(value):
    (sample,) = decode_packed(MIG, value)
    assert sample.name == GR_ENGINE_ACTIVE and math.isnan(sample.value)


def answers(series, times, evaluated="1000", asked=None):
    """Prometheus with the recorded series; ``evaluated()`` (or the string) is the rule group's last evaluation."""

    def handler(request: httpx.Request) -> httpx.Response:
        query = request.url.params["query"]
        if asked is not None:
            asked.append(query)
        stamp = evaluated() if callable(evaluated) else evaluated
        result = {
            PACKED_SERIES: series,
            NODE_SAMPLE_TIME_SERIES: times,
            RECORDED_EVALUATION_QUERY: [{"metric": {}, "value": [1000.0, stamp]}] if stamp else [],
        }[query]
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})

    return httpx.MockTransport(handler)


def item(labels, value):
    return {"metric": {"__name__": PACKED_SERIES, **labels}, "value": [1000.0, value]}


def test_a_recorded_refresh_builds_the_snapshot_and_screens_a_nan_node():
    whole = {"hostname": "n2", "gpu": "1", "UUID": "GPU-b"}
    split_parent = {"Hostname": "n1", "gpu": "0", "UUID": "GPU-a"}  # a split GPU's own row: not nvidia.com/gpu
    series = [
        item(MIG, str(packed(950, 421, 2))),
        item(split_parent, str(packed(100, 1001, 999))),
        item(whole, str(packed(300, 500, 999))),
        item({"Hostname": "n3", "gpu": "0"}, "NaN"),
        item({"Hostname": "n3", "gpu": "1"}, str(packed(10, 10, 0))),
    ]
    times = [
        {"metric": {"Hostname": "n1"}, "value": [1000.0, "990"]},
        {"metric": {"hostname": "n2"}, "value": [1000.0, "991"]},
        {"metric": {"Hostname": "n3"}, "value": [1000.0, "992"]},
    ]
    source = PrometheusSource(
        "http://p.invalid", LABELS, 1.0, transport=answers(series, times), query="recorded", clock=lambda: 1000.0
    )
    snapshot = asyncio.run(source.fetch(3))
    assert set(snapshot.nodes) == {"n1", "n2"}  # n3: one NaN device leaves the whole node out, as raw does
    assert source.report is not None and source.report.faults["out_of_range"] == 1
    n1 = snapshot.nodes["n1"]
    assert list(n1.devices) == ["nvidia.com/mig-1g.10gb"] and n1.sample_time == 990.0
    (instance,) = n1.devices["nvidia.com/mig-1g.10gb"]
    assert (instance.key, instance.util, instance.mem, instance.pods) == ("0/3", 0.95, 0.421, 2)
    (gpu,) = snapshot.nodes["n2"].devices["nvidia.com/gpu"]
    assert (gpu.key, gpu.util, gpu.mem, gpu.pods) == ("1", 0.3, 0.5, None)


def test_a_recorded_refresh_reads_the_series_once_per_rule_evaluation():
    asked: list[str] = []
    evaluation = {"at": "990"}
    series = [item(MIG, str(packed(950, 421, 2)))]
    times = [{"metric": {"Hostname": "n1"}, "value": [1000.0, "990"]}]
    transport = answers(series, times, evaluated=lambda: evaluation["at"], asked=asked)
    source = PrometheusSource("http://p.invalid", LABELS, 1.0, transport=transport, query="recorded")

    first = asyncio.run(source.fetch(1))
    assert first is not None and set(first.nodes) == {"n1"}
    assert asked[0] == RECORDED_EVALUATION_QUERY
    assert sorted(asked[1:]) == sorted([PACKED_SERIES, NODE_SAMPLE_TIME_SERIES])

    asked.clear()  # not evaluated since: one small query, and "unchanged" (None) for the refresher
    assert asyncio.run(source.fetch(2)) is None
    assert asked == [RECORDED_EVALUATION_QUERY]

    asked.clear()
    evaluation["at"] = "1000"  # evaluated again: read again
    assert asyncio.run(source.fetch(3)) is not None and len(asked) == 3

    asked.clear()
    evaluation["at"] = ""  # no recorded series at all (rules not loaded): always read, never "unchanged"
    assert asyncio.run(source.fetch(4)) is not None and asyncio.run(source.fetch(5)) is not None and len(asked) == 6


def test_an_unknown_query_form_is_a_clear_error():
    with pytest.raises(MetricsSourceError, match="PROMETHEUS_QUERY must be one of recorded, raw"):
        PrometheusSource("http://p.invalid", LABELS, 1.0, query="packed")


def test_the_rules_read_the_configured_labels_and_the_pinned_exporter():
    matchers = exporter_matchers("dcgm-exporter", "agents")
    group = recording_rules(("node", "Hostname"), matchers)
    records = [rule["record"] for rule in group["rules"]]
    assert records[-2:] == [PACKED_SERIES, NODE_SAMPLE_TIME_SERIES]
    exprs = {rule["record"]: rule["expr"] for rule in group["rules"]}
    assert exprs[NODE_SAMPLE_TIME_SERIES] == (
        'max by (node, Hostname) (timestamp(DCGM_FI_DEV_FB_FREE{job="dcgm-exporter",namespace="agents"}))'
    )
    # every raw selector is pinned; the packed rule reads the steps before it
    for expr in exprs.values():
        for selector in ("DCGM_FI_DEV_GPU_UTIL{", "DCGM_FI_PROF_GR_ENGINE_ACTIVE{", "DCGM_FI_DEV_FB_USED{"):
            assert expr.count(selector) == expr.count(selector[:-1] + "{" + matchers), expr
    assert "by (node, Hostname, gpu, UUID, GPU_I_ID, GPU_I_PROFILE)" in exprs[PACKED_SERIES]
    assert all(record in exprs[PACKED_SERIES] for record in records[:2])


def test_the_cli_prints_a_rules_file_promtool_accepts(tmp_path, capsys):
    assert cli_main(["recording-rules", "--node-label", "Hostname,hostname", "--exporter-job", "dcgm-exporter"]) == 0
    text = capsys.readouterr().out
    assert yaml.safe_load(text) == {"groups": [recording_rules(LABELS, 'job="dcgm-exporter"')]}
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("no promtool (Debian's prometheus package) to check the file with")
    path = tmp_path / "recorded.rules.yml"
    path.write_text(text)
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0 and "SUCCESS: 4 rules found" in result.stdout, result.stdout + result.stderr


# Raw series -> what the rules record, under promtool's own rule evaluation (no server): the util of a whole GPU and
# of an instance, memory known, unknown (a total of 0, no framebuffer series) and pods as snapshot._pod_of counts
# them (exported_pod before pod), and a value out of range or NaN making the device's packed value NaN.
_MIG_A = 'Hostname="a",gpu="0",GPU_I_ID="1",GPU_I_PROFILE="1g.10gb"'
_SERIES = {
    f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{_MIG_A},pod="p1",namespace="t"}}': 0.25,
    f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{_MIG_A},exported_pod="p2",exported_namespace="t",pod="x",namespace="y"}}': 0.25,
    f'DCGM_FI_DEV_FB_USED{{{_MIG_A},pod="p1",namespace="t"}}': 250,
    f'DCGM_FI_DEV_FB_FREE{{{_MIG_A},pod="p1",namespace="t"}}': 750,
    # Time-sliced: the exporter gives every metric of the device one series per pod; the rules count FB_FREE's.
    f'DCGM_FI_DEV_FB_FREE{{{_MIG_A},exported_pod="p2",exported_namespace="t",pod="x",namespace="y"}}': 750,
    'DCGM_FI_DEV_GPU_UTIL{hostname="b",gpu="1"}': 40,  # a whole GPU: GPU_UTIL / 100, not GR_ENGINE_ACTIVE
    'DCGM_FI_PROF_GR_ENGINE_ACTIVE{hostname="b",gpu="1"}': 0.9,
    'DCGM_FI_DEV_FB_USED{hostname="b",gpu="1"}': 0,
    'DCGM_FI_DEV_FB_FREE{hostname="b",gpu="1"}': 0,
    'DCGM_FI_PROF_GR_ENGINE_ACTIVE{Hostname="c",gpu="0"}': 1.5,
    'DCGM_FI_PROF_GR_ENGINE_ACTIVE{Hostname="c",gpu="1"}': 0.5,
    'DCGM_FI_DEV_FB_USED{Hostname="c",gpu="1"}': -3,
    'DCGM_FI_DEV_FB_FREE{Hostname="c",gpu="1"}': 10,
    'DCGM_FI_PROF_GR_ENGINE_ACTIVE{Hostname="c",gpu="2"}': "NaN",
    'DCGM_FI_PROF_GR_ENGINE_ACTIVE{Hostname="c",gpu="3"}': 0.001,
    'DCGM_FI_DEV_GPU_UTIL{Hostname="c",gpu="4"}': 101,
}
_PACKED = {  # labels -> value (None: NaN)
    _MIG_A: packed(250, 250, 2),
    'hostname="b",gpu="1"': packed(400, 1001, 999),
    'Hostname="c",gpu="0"': None,
    'Hostname="c",gpu="1"': None,
    'Hostname="c",gpu="2"': None,
    'Hostname="c",gpu="3"': packed(1, 1001, 999),
    'Hostname="c",gpu="4"': None,
}


def test_the_rules_record_what_build_snapshot_reads_and_nan_for_a_value_out_of_range(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("no promtool (Debian's prometheus package) to evaluate the rules with")
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [recording_rules(LABELS)]}))
    name = PACKED_SERIES
    cases = {
        # promtool cannot compare NaN with NaN: the NaN devices are those where packed != packed
        f"{name} == {name}": {labels: value for labels, value in _PACKED.items() if value is not None},
        f"{name} != bool {name}": {labels: float(value is None) for labels, value in _PACKED.items()},
        NODE_SAMPLE_TIME_SERIES: {'Hostname="a"': 0.0, 'hostname="b"': 0.0, 'Hostname="c"': 0.0},
    }
    tests = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": series, "values": str(value)} for series, value in _SERIES.items()],
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": "0m",
                        "exp_samples": [
                            {"labels": ("" if "bool" in expr else name_of(expr)) + "{" + labels + "}", "value": value}
                            for labels, value in expected.items()
                        ],
                    }
                    for expr, expected in cases.items()
                ],
            }
        ],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(tests))
    result = subprocess.run(
        [promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def name_of(expr: str) -> str:
    return expr.split(" ")[0]
