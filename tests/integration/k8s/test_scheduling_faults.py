"""Faults on the scheduling path, on the real control plane: a burst of MIG pods over 200 nodes, every tenth node
hot, placed by kube-scheduler with the configuration the kube_scheduler role renders and the bundled extender.

- The scheduler runs as two replicas with leader election; the leader is killed (SIGKILL) after the first half of
  the burst is bound, and the second half is created at once. The other replica takes the lease over and binds it:
  every pod bound, none on a hot node. The takeover time (kill to the first binding after it) is printed.
- The apiserver is restarted while the first half of the burst is being scheduled, the second half created
  after: the scheduler's and the extender's watches break and resume, the burst completes with no pod on a hot node,
  and the extender's in-flight accounting lets go of the pods deleted after it (no binding held that no longer
  exists).
"""

from __future__ import annotations

import time

import httpx
import pytest
from conftest import wait_for
from scheduling import (
    MIG_RESOURCE,
    create_nodes,
    create_pods,
    gpu_pod,
    rendered_scheduler_config,
    start_extender,
    stop_process,
    write_mig_metrics,
)

pytestmark = pytest.mark.integration

POOL = {"gpufleet.test/scheduling": "faults"}  # our nodes only: the session's cluster has others
NODES = [f"flt-{i:03d}" for i in range(200)]
HOT = {node for i, node in enumerate(NODES) if i % 10 == 9}
SLOTS = 3  # 2g.20gb instances per node
BURST = 300  # pods; the cool nodes hold 540
# Short leases, so that a takeover is seconds, not the default 15 s (the role's defaults are kube-scheduler's).
LEASE = {"leaderElect": True, "leaseDuration": "4s", "renewDeadline": "3s", "retryPeriod": "1s"}


@pytest.fixture(scope="module")
def nodes(core):
    create_nodes(core, NODES, {MIG_RESOURCE: str(SLOTS)}, labels=POOL)
    yield NODES
    for node in NODES:
        core.delete_node(node)


@pytest.fixture(scope="module")
def extender(nodes, control_plane, tmp_path_factory):
    """The bundled extender on the fleet's loads, watching the control plane (in-flight accounting)."""
    workdir = tmp_path_factory.mktemp("faults-extender")
    loads = {node: ([0.95, 0.92, 0.97] if node in HOT else [0.10, 0.25, 0.15]) for node in nodes}
    metrics = write_mig_metrics(workdir / "dcgm.prom", loads)
    env = {
        "METRICS_SOURCE": "file",
        "METRICS_FILE": str(metrics),
        "METRICS_MAX_AGE_SECONDS": "0",
        "METRICS_REFRESH_SECONDS": "1",
        "KUBE_API": "kubeconfig",
        "KUBECONFIG": str(control_plane.kubeconfig),
    }
    process, url = start_extender(workdir, env)
    yield url
    stop_process(process)


def wave(core, namespace: str, first: int, count: int) -> None:
    pods = [gpu_pod(f"burst-{i}", "gpufleet-scheduler", {MIG_RESOURCE: "1"}) for i in range(first, first + count)]
    for pod in pods:
        pod.spec.node_selector = POOL
    create_pods(core, namespace, pods)


def placed_on_hot(bindings) -> list[str]:
    return sorted(f"{pod}->{node}" for pod, (node, _) in bindings.bound.items() if node in HOT)


def test_the_leader_killed_mid_burst_the_other_replica_completes_it(control_plane, core, extender, namespace, tmp_path):
    namespace, bindings = namespace
    config = rendered_scheduler_config(tmp_path, kube_scheduler_extender_url_prefix=extender)
    lease = {**LEASE, "resourceName": "gpufleet-faults", "resourceNamespace": namespace}
    replicas = [
        control_plane.start_scheduler(config, name=f"faults-scheduler-{i}", leader_election=lease) for i in (0, 1)
    ]
    try:
        leader = wait_for(
            lambda: next(
                (r for r in replicas if "successfully acquired lease" in control_plane.log_tail(r, 400).lower()), None
            ),
            what="a leader",
        )
        half = BURST // 2
        wave(core, namespace, 0, half)
        assert bindings.wait(half, timeout=120), f"bound before the kill: {len(bindings.bound)}"
        control_plane.processes[leader].kill()  # SIGKILL: no lease release, the other waits for it to expire
        killed_at = time.monotonic()
        wave(core, namespace, half, BURST - half)  # the second half of the burst, while no scheduler leads
        assert bindings.wait(BURST, timeout=180), f"bound: {len(bindings.bound)} of {BURST}"
        after = sorted(seen for _, seen in bindings.bound.values() if seen > killed_at)
        takeover = after[0] - killed_at
        print(
            f"\nleader killed after {BURST - len(after)} of {BURST} bindings; the other replica bound the rest, the "
            f"first {takeover:.1f} s after the kill (lease {LEASE['leaseDuration']})"
        )
    finally:
        for replica in replicas:
            control_plane.stop_component(replica)
    assert placed_on_hot(bindings) == []
    assert len(after) == BURST - BURST // 2
    survivor = next(r for r in replicas if r != leader)
    assert "successfully acquired lease" in control_plane.log_tail(survivor, 4000).lower()


def assumed_pods(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    line = next(row for row in text.splitlines() if row.startswith("gpufleet_extender_inflight_assumed_pods "))
    return float(line.split()[1])


def test_the_apiserver_restarted_mid_burst(control_plane, core, extender, namespace, tmp_path):
    namespace, bindings = namespace
    config = rendered_scheduler_config(tmp_path, kube_scheduler_extender_url_prefix=extender)
    scheduler = control_plane.start_scheduler(config, name="faults-scheduler-restart")
    try:
        half = BURST // 2
        wave(core, namespace, 0, half)
        control_plane.restart_apiserver()  # while the first half is being scheduled: every watch breaks
        wave(core, namespace, half, BURST - half)
        assert bindings.wait(BURST, timeout=180), f"bound: {len(bindings.bound)} of {BURST}"
    finally:
        control_plane.stop_component(scheduler)
    assert placed_on_hot(bindings) == []
    # The extender's watch resumed: it counts the burst's pods in flight, then lets go of them once they are gone.
    wait_for(lambda: assumed_pods(extender) >= BURST, what="the extender counting the burst in flight")
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    wait_for(lambda: assumed_pods(extender) == 0, timeout=60, what="the extender letting go of the deleted pods")
