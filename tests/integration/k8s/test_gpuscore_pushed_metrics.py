"""GPUScore with pushed load, on the real control plane: gpufleet-scheduler runs the kube_scheduler role's plugin-mode
configuration for `gpufleet_metrics_source: push` (its receiver on 127.0.0.1 here, over https with a certificate
of a CA of its own, the fleet's token), and a real Prometheus (Debian's package) scrapes 60 nodes' dcgm-exporter
series, every tenth node hot, and sends them with the entries `gpufleet-extender remote-write-config` writes.
Nothing queries Prometheus. A burst of MIG pods binds, none on a hot node; then a cool node turns hot in the
exporter and, once Prometheus has scraped and sent it, the next pods avoid it too (the time from the change to the
decision is printed)."""

from __future__ import annotations

import time

import httpx
import pytest
from gpufleet_extender.push_config import PushTarget, remote_write
from gpufleet_testsupport.collection import require_tool
from gpufleet_testsupport.controlplane import needs_assets, serving_files
from gpufleet_testsupport.dcgm_fleet import EXPORTER_NAMESPACE, Fleet, FleetPrometheus
from gpufleet_testsupport.exposition import render_exposition
from gpufleet_testsupport.ports import free_port
from gpufleet_testsupport.scheduling import (
    MIG_RESOURCE,
    create_nodes,
    create_pods,
    gpu_pod,
    mig_devices,
    rendered_scheduler_config,
)
from gpufleet_testsupport.waits import wait_for

pytestmark = [pytest.mark.integration, needs_assets("gpufleet-scheduler")]

SCHEDULER = "gpufleet-scheduler"
POOL = {"gpufleet.test/scheduling": "pushed"}
NODES = [f"push-{i:03d}" for i in range(60)]
HOT = {node for i, node in enumerate(NODES) if i % 10 == 9}
TURNS_HOT = NODES[0]  # cool at first; hot after the first burst
SLOTS = 3  # 2g.20gb instances per node
SCRAPE = 2  # Prometheus' scrape interval, s
TOKEN = "pushed-metrics-token"


def loads(hot: set[str]) -> dict[str, list[float]]:
    return {node: ([0.95, 0.92, 0.97] if node in hot else [0.10, 0.25, 0.15]) for node in NODES}


def shards(hot: set[str]) -> list[bytes]:
    devices = mig_devices(loads(hot))
    return [render_exposition({node: devices[node] for node in NODES}).encode()]


@pytest.fixture
def pushed(control_plane, core, tmp_path):
    """(scheduler name, the fleet whose shards the exporter serves, Prometheus' URL), Prometheus scraping."""
    prometheus_binary = require_tool("prometheus", "prometheus", override="GPUFLEET_PROMETHEUS_BINARY")
    create_nodes(core, NODES, {MIG_RESOURCE: str(SLOTS)}, labels=POOL)
    pki = serving_files(tmp_path / "receiver-pki", "receiver", ("127.0.0.1",))
    token = tmp_path / "remote-write-token"
    token.write_text(TOKEN + "\n")
    port = free_port()
    config = rendered_scheduler_config(
        tmp_path / "render",
        kube_scheduler_mode="plugin",
        gpufleet_metrics_source="push",
        # The role's mounts are the pod's; here, the files this test keeps.
        kube_scheduler_plugin_extra_args={
            "remoteWriteAddress": f"127.0.0.1:{port}",
            "remoteWriteTokenFile": str(token),
            "remoteWriteCertFile": str(pki["tls.crt"]),
            "remoteWriteKeyFile": str(pki["tls.key"]),
            "exporterNamespace": EXPORTER_NAMESPACE,
        },
    )
    args = config["profiles"][0]["pluginConfig"][0]["args"]
    assert args["metricsSource"] == "push"
    fleet = Fleet(NODES, dict.fromkeys(NODES, "pushed"), set(HOT), shards(HOT))
    targets = [PushTarget(f"https://127.0.0.1:{port}/api/v1/write", str(token), str(pki["ca.crt"]))]
    entries = remote_write(targets, args["nodeNameLabels"], job=args["exporterJob"], namespace=EXPORTER_NAMESPACE)
    workdir = tmp_path / "prometheus"
    workdir.mkdir()
    # Prometheus first: a scheduler started with push waits (up to 30 s) for the first pushed samples.
    with FleetPrometheus(fleet, workdir, prometheus_binary, interval=SCRAPE, remote_write=entries) as url:
        name = control_plane.start_scheduler(config, binary="gpufleet-scheduler", name=f"{SCHEDULER}-pushed")
        try:
            yield name, fleet, url
        finally:
            control_plane.stop_component(name)
            for node in NODES:
                core.delete_node(node)


def remote_storage(url: str, name: str) -> float | None:
    """prometheus_remote_storage_<name> on Prometheus' own /metrics, summed over its queues (None: absent)."""
    metric = f"prometheus_remote_storage_{name}"
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines()
        if line.startswith((metric + " ", metric + "{"))
    ]
    return sum(values) if values else None


def burst(core, namespace: str, first: int, count: int) -> None:
    pods = [gpu_pod(f"pushed-{i}", SCHEDULER, {MIG_RESOURCE: "1"}) for i in range(first, first + count)]
    for pod in pods:
        pod.spec.node_selector = POOL
    create_pods(core, namespace, pods)


def test_pushed_load_keeps_a_burst_off_hot_nodes_and_follows_a_change(control_plane, core, namespace, pushed):
    namespace, bindings = namespace
    scheduler, fleet, prometheus = pushed
    # Every series of a scrape sent and none failed: the receiver holds the fleet.
    wait_for(
        lambda: (remote_storage(prometheus, "samples_total") or 0) >= fleet.series,
        timeout=60,
        what="Prometheus sending the fleet's series",
    )
    time.sleep(2)  # the refresher's next read of the store
    assert remote_storage(prometheus, "samples_failed_total") == 0
    log = control_plane.log_tail(scheduler, 4000)
    assert "GPUScore remote-write receiver listening" in log and "https=true" in log
    assert "GPUScore: pushed samples received" in log  # before its first pod
    assert "remote write refused" not in log
    first = 60
    burst(core, namespace, 0, first)
    assert bindings.wait(first, timeout=120), f"bound: {len(bindings.bound)} of {first}"
    on_hot = sorted(f"{pod}->{node}" for pod, (node, _) in bindings.bound.items() if node in HOT)
    assert on_hot == []

    # A cool node turns hot in the exporter: scraped, sent, received, then decided on.
    changed_at = time.monotonic()
    fleet.shards[0] = shards(HOT | {TURNS_HOT})[0]
    time.sleep(SCRAPE + 3)  # one scrape, the send deadline (1 s) and the refresher's second
    burst(core, namespace, first, 60)
    assert bindings.wait(first + 60, timeout=120), f"bound: {len(bindings.bound)} of {first + 60}"
    late = [node for pod, (node, seen) in bindings.bound.items() if seen > changed_at + SCRAPE + 3]
    print(f"\npushed: {first} pods then 60 after {TURNS_HOT} turned hot; {len(late)} placed after the change")
    assert TURNS_HOT not in late
    assert not HOT & set(late)
