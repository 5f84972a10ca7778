"""The push form end to end with a real sender: Debian's Prometheus scrapes
gpufleet_testsupport.dcgm_fleet's fleet and sends
what `gpufleet-extender remote-write-config` tells it to (the four dcgm series, the decision's labels, a bearer
token) to `gpufleet-extender serve` with METRICS_SOURCE=push; a second extender queries the same Prometheus.
For every resource of the fleet, both filter and rank every node alike; the pushed
extender's newest sample is never older than one scrape interval plus 5 s (scrape to decision); Prometheus reports
no failed sample. Without Prometheus this test skips, unless CI or GPUFLEET_REQUIRE_PROMETHEUS=1 makes its absence a
failure.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from gpufleet_extender.push_config import PushTarget, remote_write
from gpufleet_testsupport.collection import require_tool
from gpufleet_testsupport.dcgm_fleet import EXPORTER_NAMESPACE, FleetPrometheus, make_fleet
from gpufleet_testsupport.extender import start_extender
from gpufleet_testsupport.ports import free_port
from gpufleet_testsupport.processes import stop_process

NODE_LABELS = ("Hostname", "hostname")
NODES = 30  # ten of each pool, three hot
INTERVAL = 2  # Prometheus' scrape interval, s
TOKEN = "push-test-token"
RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb")
PINNED = {"EXPORTER_JOB": "dcgm-exporter", "EXPORTER_NAMESPACE": EXPORTER_NAMESPACE, "KUBE_API": "off"}


def _wait(what: str, check, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.2)
    raise AssertionError(f"{what} within {timeout:.0f} s")


@pytest.fixture(scope="module")
def extenders(tmp_path_factory) -> Iterator[tuple[str, str, str]]:
    """(pushed extender, queried extender, Prometheus) URLs, every node of the fleet in the pushed one."""
    binary = require_tool("prometheus", "prometheus", override="GPUFLEET_PROMETHEUS_BINARY")
    workdir = tmp_path_factory.mktemp("pushed")
    fleet = make_fleet(NODES)
    token = workdir / "token"
    token.write_text(TOKEN + "\n")
    port = free_port()
    targets = [PushTarget(f"http://127.0.0.1:{port}/api/v1/write", token_file=str(token))]
    entries = remote_write(targets, NODE_LABELS, job="dcgm-exporter", namespace=EXPORTER_NAMESPACE)
    pushed = queried = None
    with FleetPrometheus(fleet, workdir, binary, interval=INTERVAL, remote_write=entries) as prometheus:
        try:
            env = {
                **PINNED,
                "METRICS_SOURCE": "push",
                "REMOTE_WRITE_ADDRESS": f"127.0.0.1:{port}",
                "REMOTE_WRITE_TOKEN_FILE": str(token),
            }
            pushed, pushed_url = start_extender(workdir, env)
            queried, queried_url = start_extender(workdir, {**PINNED, "PROMETHEUS_URL": prometheus})
            _wait(
                "every node in the pushed extender",
                lambda: _metric(pushed_url, "gpufleet_extender_nodes_with_metrics") == NODES,
            )
            yield pushed_url, queried_url, prometheus
        finally:
            for process in (pushed, queried):
                if process is not None:
                    stop_process(process)


def _metric(url: str, name: str) -> float | None:
    """A series' value (summed over its labels) on a /metrics page; None when absent."""
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in httpx.get(f"{url}/metrics").text.splitlines()
        if line.startswith((name + " ", name + "{"))
    ]
    return sum(values) if values else None


def _verbs(url: str, resource: str) -> tuple[list[str], list[dict]]:
    nodes = [f"node-{i:05d}" for i in range(NODES)]
    pod = {
        "metadata": {"name": "probe", "namespace": "tenant", "uid": "probe"},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {resource: "1"}}}]},
    }
    args = {"Pod": pod, "NodeNames": nodes}
    passed = httpx.post(f"{url}/filter", json=args).json()["NodeNames"]
    scores = httpx.post(f"{url}/prioritize", json=args).json()
    return passed, scores


def test_pushed_and_queried_loads_decide_alike(extenders):
    pushed, queried, _ = extenders
    for resource in RESOURCES:
        assert _verbs(pushed, resource) == _verbs(queried, resource), resource
    # The decision is not trivial: hot nodes are filtered out of what they offer.
    passed, _ = _verbs(pushed, "nvidia.com/mig-1g.10gb")
    assert 0 < len(passed) < NODES


def test_a_scrape_reaches_the_decision_within_one_interval_and_5_s(extenders):
    pushed, _, prometheus = extenders
    ages = []
    for _ in range(10):
        ages.append(httpx.get(f"{pushed}/readyz").json()["metrics_age_seconds"])
        time.sleep(0.5)
    print(f"pushed extender: newest sample {min(ages):.2f}-{max(ages):.2f} s old (scrape interval {INTERVAL} s)")
    assert max(ages) < INTERVAL + 5
    assert _metric(prometheus, "prometheus_remote_storage_samples_failed_total") == 0


def test_prometheus_sends_only_what_a_decision_reads(extenders):
    pushed, _, prometheus = extenders
    # write_relabel_configs drop the fields no decision reads before they are sent: the receiver is sent the four
    # dcgm series and keeps every sample it is sent.
    assert _metric(prometheus, "prometheus_remote_storage_samples_dropped_total") > 0
    sent = _metric(prometheus, "prometheus_remote_storage_samples_total")
    kept = _metric(pushed, "gpufleet_extender_remote_write_samples_total")
    assert sent and kept and kept <= sent
    assert _metric(pushed, "gpufleet_extender_remote_write_refused_total") == 0
