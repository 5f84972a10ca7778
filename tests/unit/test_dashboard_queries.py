"""Every query of the fleet dashboard (roles/monitoring/files/gpufleet-fleet-dashboard.json) against a real
Prometheus on 127.0.0.1, and each must return series.

Prometheus (Debian's binary, as the extender's tests run it) scrapes, every second:
- the captured dcgm-exporter text (extender/tests/data), one node per host-label spelling (`Hostname`,
  `hostname`), plus the health counters the capture lacks (XID, ECC, throttling), written with the capture's own
  GPU labels and healthy values;
- the layout-check textfile of both nodes, written by the collection's layout_check against simulated GPUs laid
  out as in the capture (node-exporter serves such a file as it is);
- a real extender (`gpufleet-extender serve`) deciding on the capture, asked to filter and score, sent one bad
  request, and left without its metrics file for a moment (a failed refresh).
Grafana's variables are replaced as Grafana would ($pool: the "All" value or one pool, $__rate_interval: 1m).
Without Prometheus these tests skip, unless CI or GPUFLEET_REQUIRE_PROMETHEUS=1 makes its absence a failure.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gpufleet_testsupport.collection import collections_path, require_tool
from gpufleet_testsupport.extender import start_extender
from gpufleet_testsupport.processes import stop_process
from gpufleet_testsupport.prometheus import Exporter, launch
from gpufleet_testsupport.scheduler_requests import make_pod, names_args
from gpufleet_testsupport.waits import wait_for

collections_path()  # makes ansible_collections.gpufleet.mig importable

from ansible_collections.gpufleet.mig.plugins.module_utils import boot_apply, layout_check  # noqa: E402
from ansible_collections.gpufleet.mig.plugins.module_utils.nvml_sim import new_state  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

DASHBOARD = REPO / "roles" / "monitoring" / "files" / "gpufleet-fleet-dashboard.json"
CAPTURES = REPO / "extender" / "tests" / "data"
# The capture's layout: GPU 0 in MIG mode with two 3g.40gb instances, GPU 1 a whole GPU.
CAPTURED_LAYOUT = [
    {"devices": [0], "mig_enabled": True, "mig_devices": {"3g.40gb": 2}},
    {"devices": [1], "mig_enabled": False},
]
# hk-gpu-01 (Hostname) is declared whole GPUs (the llm pool's layout): GPU 0 drifted. hk-gpu-02 (hostname) is as
# declared.
NODES = {
    "hk-gpu-01": ("Hostname", "llm", [{"devices": "all", "mig_enabled": False}]),
    "hk-gpu-02": ("hostname", "imagegen", CAPTURED_LAYOUT),
}
HEALTH_COUNTERS = {
    "DCGM_FI_DEV_XID_ERRORS": "gauge",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "counter",
    "DCGM_FI_DEV_THERMAL_VIOLATION": "counter",
    "DCGM_FI_DEV_POWER_VIOLATION": "counter",
}


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def _targets() -> list[tuple[str, str]]:
    return [
        (f"{panel['title']} [{target['refId']}]", target["expr"])
        for panel in _dashboard()["panels"]
        for target in panel.get("targets", [])
    ]


def _grafana(expr: str, pool: str) -> str:
    return expr.replace("$__rate_interval", "1m").replace("$pool", pool)


def _capture(host_label: str) -> str:
    """The capture, plus the health counters it lacks with each GPU's labels (from its temperature series)."""
    text = (CAPTURES / f"dcgm-exporter-{host_label}.prom").read_text(encoding="utf-8")
    gpu_labels = re.findall(r"^DCGM_FI_DEV_GPU_TEMP(\{[^}]*\})", text, re.MULTILINE)
    extra = []
    for name, kind in HEALTH_COUNTERS.items():
        extra += [f"# HELP {name} {name} (healthy)", f"# TYPE {name} {kind}"]
        extra += [f"{name}{labels} 0" for labels in gpu_labels]
    return text + "\n".join(extra) + "\n"


def _textfile(tmp_path: Path, node: str, pool: str, declared: list) -> str:
    """The layout check's textfile for a node whose simulated GPUs hold the captured layout."""
    state = tmp_path / f"{node}-nvml.json"
    state.write_text(json.dumps(new_state(gpus=2, product="NVIDIA H100 80GB HBM3")))
    applied = tmp_path / f"{node}-applied.json"
    applied.write_text(json.dumps({"config": CAPTURED_LAYOUT}))
    assert boot_apply.main(["--config", str(applied), "--nvml-sim-state", str(state)]) == 0
    request = tmp_path / f"{node}-mig-layout.json"
    request.write_text(json.dumps({"config": declared}))
    textfile = tmp_path / f"{node}.prom"
    args = ["--config", str(request), "--textfile", str(textfile), "--node", node, "--pool", pool]
    assert layout_check.main([*args, "--nvml-sim-state", str(state)]) == 0
    return textfile.read_text(encoding="utf-8")


def _exercise_extender(url: str, metrics_file: Path) -> None:
    """Decisions, one refused request, one failed refresh: the series the extender panels show."""
    pod = make_pod({"nvidia.com/gpu": "1"})
    for verb in ("filter", "prioritize"):
        answer = httpx.post(f"{url}/{verb}", json=names_args(pod, list(NODES)), timeout=5)
        assert answer.status_code == 200, answer.text
    assert httpx.post(f"{url}/filter", content=b"{not json", timeout=5).status_code == 400
    kept = metrics_file.with_suffix(".kept")
    metrics_file.rename(kept)
    try:
        wait_for(
            lambda: "gpufleet_extender_metrics_source_errors_total{" in httpx.get(f"{url}/metrics").text,
            what="a failed refresh of the missing METRICS_FILE",
        )
    finally:
        kept.rename(metrics_file)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory) -> Iterator[str]:
    prometheus_binary = require_tool("prometheus", "prometheus", override="GPUFLEET_PROMETHEUS_BINARY")
    tmp_path = tmp_path_factory.mktemp("dashboard")
    pages = {f"/dcgm/{label}": _capture(label) for label in ("Hostname", "hostname")}
    for node, (_label, pool, declared) in NODES.items():
        pages[f"/node/{node}"] = _textfile(tmp_path, node, pool, declared)
    metrics_file = tmp_path / "dcgm.prom"
    metrics_file.write_text(pages["/dcgm/Hostname"])
    env = {"METRICS_SOURCE": "file", "METRICS_FILE": str(metrics_file), "METRICS_REFRESH_SECONDS": "0.2"}
    extender, extender_url = start_extender(tmp_path, {"KUBE_API": "off", **env}, ready=False)
    try:
        _exercise_extender(extender_url, metrics_file)
        with Exporter(pages.get) as exporters:
            jobs = [
                ("dcgm-exporter", "/dcgm/Hostname"),
                ("dcgm-exporter-new", "/dcgm/hostname"),
                ("node-exporter-01", "/node/hk-gpu-01"),
                ("node-exporter-02", "/node/hk-gpu-02"),
            ]
            config = "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
            for job, path in jobs:
                config += (
                    f"  - job_name: {job}\n    metrics_path: {path}\n"
                    f"    static_configs:\n      - targets: ['127.0.0.1:{exporters.port}']\n"
                )
            config += (
                "  - job_name: gpufleet-extender\n"
                f"    static_configs:\n      - targets: ['{extender_url.removeprefix('http://')}']\n"
            )
            process, url = launch(tmp_path, config, binary=prometheus_binary)
            try:

                def scraped_twice() -> bool:
                    query = "min(count_over_time(up[1m])) >= 2 and min(up) == 1 and count(up) == 5"
                    answer = httpx.get(f"{url}/api/v1/query", params={"query": query})
                    return answer.status_code == 200 and bool(answer.json()["data"]["result"])

                wait_for(scraped_twice, timeout=30, what="Prometheus to scrape every target twice")
                yield url
            finally:
                stop_process(process)
    finally:
        stop_process(extender)


def _query(url: str, expr: str) -> list[dict]:
    answer = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    assert answer.status_code == 200, f"{expr}: {answer.text}"
    return answer.json()["data"]["result"]


@pytest.mark.parametrize(("panel", "expr"), _targets(), ids=[name for name, _ in _targets()])
def test_every_panel_query_returns_series_for_all_pools(prometheus, panel, expr):
    result = _query(prometheus, _grafana(expr, ".*"))
    assert result, f"{panel}: no series for {expr}"


def test_the_pool_variable_lists_the_pools_and_one_pool_shows_only_its_nodes(prometheus):
    variable = next(v for v in _dashboard()["templating"]["list"] if v["name"] == "pool")
    metric = re.fullmatch(r"label_values\((\w+), pool\)", variable["query"]["query"]).group(1)
    answer = httpx.get(f"{prometheus}/api/v1/label/pool/values", params={"match[]": metric}).json()
    assert sorted(answer["data"]) == ["imagegen", "llm"]
    pooled = [(name, expr) for name, expr in _targets() if "$pool" in expr]
    assert len(pooled) >= 8
    for name, expr in pooled:
        result = _query(prometheus, _grafana(expr, "llm"))
        assert result, f"{name}: no series for pool llm"
        nodes = {series["metric"].get("node") for series in result} - {None}
        pools = {series["metric"].get("pool") for series in result} - {None}
        assert nodes <= {"hk-gpu-01"} and pools <= {"llm"}, f"{name}: {nodes} {pools}"


def test_allocation_panels_count_the_captured_devices(prometheus):
    """Both nodes hold two 3g.40gb instances (one with a busy pod) and a whole GPU (busy pod): per pool, 3 devices,
    2 allocated, none of them idle; one GPU of hk-gpu-01 is off its declared (whole-GPU) layout."""
    panels = {panel["title"]: panel for panel in _dashboard()["panels"]}

    def by_labels(title: str, ref: int, *labels: str) -> dict[tuple, float]:
        expr = _grafana(panels[title]["targets"][ref]["expr"], ".*")
        return {tuple(s["metric"][k] for k in labels): float(s["value"][1]) for s in _query(prometheus, expr)}

    devices = "Devices per pool and profile: all and allocated to a pod"
    assert by_labels(devices, 0, "pool", "profile") == {
        ("llm", "3g.40gb"): 2.0,
        ("llm", "whole"): 1.0,
        ("imagegen", "3g.40gb"): 2.0,
        ("imagegen", "whole"): 1.0,
    }
    assert by_labels(devices, 1, "pool", "profile") == {
        ("llm", "3g.40gb"): 1.0,
        ("llm", "whole"): 1.0,
        ("imagegen", "3g.40gb"): 1.0,
        ("imagegen", "whole"): 1.0,
    }
    idle = by_labels("Allocated but idle (engine active under 5 %)", 0, "pool")
    assert idle == {("llm",): 0.0, ("imagegen",): 0.0}
    drift = by_labels("GPUs off the declared layout, and the age of the last check", 0, "node")
    assert drift == {("hk-gpu-01",): 1.0, ("hk-gpu-02",): 0.0}
