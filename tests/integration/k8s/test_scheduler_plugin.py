"""gpufleet-scheduler (kube-scheduler + the GPUScore plugin, k8s/) with the configuration the kube_scheduler role
renders in plugin mode, on the real control plane: MIG pods bind to the coolest node and never to a node whose
instances are all above the threshold, and a burst spreads because Reserve counts each placed pod as load before
any sample shows it.

GPUScore reads Prometheus; a small fake Prometheus on 127.0.0.1 answers its two instant queries from a
dcgm-exporter exposition (the same series the extender's tests use), over https with a certificate from a CA of its
own and only to the bearer token in its token file, as the role deploys the plugin (a pinned CA, a token of its
own)."""

from __future__ import annotations

import time

import pytest
from gpufleet_testsupport.controlplane import needs_assets
from gpufleet_testsupport.https_prometheus import PROFILE, FakePrometheus
from gpufleet_testsupport.scheduling import create_nodes, create_pods, gpu_pod, rendered_scheduler_config
from gpufleet_testsupport.waits import wait_for

pytestmark = [pytest.mark.integration, needs_assets("gpufleet-scheduler")]

RESOURCE = f"nvidia.com/mig-{PROFILE}"
SCHEDULER = "gpufleet-scheduler"


@pytest.fixture
def prometheus(tmp_path):
    fake = FakePrometheus(tmp_path)
    yield fake
    fake.close()


@pytest.fixture
def plugin_scheduler(control_plane, prometheus, tmp_path):
    """gpufleet-scheduler with the role's plugin-mode configuration, reading the fake Prometheus every second."""
    yield from _plugin_scheduler(control_plane, prometheus, tmp_path)


@pytest.fixture
def shared_plugin_scheduler(control_plane, prometheus, tmp_path):
    """The same, with the role's setting for RESOURCE time-sliced 2 ways."""
    yield from _plugin_scheduler(
        control_plane, prometheus, tmp_path, kube_scheduler_plugin_shared_resources={RESOURCE: 2}
    )


def _plugin_scheduler(control_plane, prometheus, tmp_path, **role_vars):
    # The role's https URL, CA and token args; the files where this test keeps them (in the pod: the mounts).
    config = rendered_scheduler_config(
        tmp_path / "render",
        kube_scheduler_mode="plugin",
        kube_scheduler_prometheus_url=prometheus.url,
        kube_scheduler_plugin_extra_args={
            "prometheusCAFile": str(prometheus.ca),
            "prometheusTokenFile": str(prometheus.token_file),
            "metricsRefreshSeconds": 1,
        },
        **role_vars,
    )
    profile = config["profiles"][0]
    assert profile["schedulerName"] == SCHEDULER and "extenders" not in config
    assert profile["plugins"]["reserve"] == {"enabled": [{"name": "GPUScore"}]}
    assert profile["pluginConfig"][0]["args"]["prometheusURL"].startswith("https://")
    name = control_plane.start_scheduler(
        config, binary="gpufleet-scheduler", name=f"gpufleet-scheduler-{tmp_path.name}"
    )
    yield name
    control_plane.stop_component(name)


def make_pods(core, namespace: str, names: list[str], pool: dict) -> None:
    pods = [gpu_pod(name, SCHEDULER, {RESOURCE: "1"}) for name in names]
    for pod in pods:
        pod.spec.node_selector = pool
    create_pods(core, namespace, pods)


def test_mig_pods_bind_to_the_coolest_node_and_never_to_a_hot_one(core, prometheus, plugin_scheduler, namespace):
    namespace, bindings = namespace
    pool = {"gpufleet.test/scheduling": "plugin-threshold"}
    coolest, cool, hot = "plugin-coolest", "plugin-cool", "plugin-hot"
    slots = 3
    create_nodes(core, [coolest, cool, hot], {RESOURCE: str(slots)}, labels=pool)
    # The refresher's next poll (1 s) sees these nodes; the pods come after it.
    prometheus.set_loads({coolest: [0.05] * slots, cool: [0.30] * slots, hot: [0.95, 0.92, 0.97]})
    time.sleep(2.5)

    make_pods(core, namespace, ["first"], pool)
    assert bindings.wait(1, timeout=60), "the first pod was not bound"
    assert bindings.bound["first"][0] == coolest

    # Every cool instance and one more pod: the hot node has 3 free instances, all above the threshold, so the
    # last pod must stay pending rather than land there.
    make_pods(core, namespace, [f"p{i}" for i in range(2 * slots - 1 + 1)], pool)
    assert bindings.wait(2 * slots, timeout=60), f"bound: {bindings.bound}"
    placed = [node for node, _ in bindings.bound.values()]
    assert sorted(set(placed)) == [cool, coolest]
    assert placed.count(coolest) == placed.count(cool) == slots

    def refusals():
        events = core.list_namespaced_event(namespace, field_selector="reason=FailedScheduling").items
        return [event.message for event in events if "below thresholds" in (event.message or "")]

    messages = wait_for(refusals, timeout=60, what="a FailedScheduling event naming the threshold")
    assert any(f"{hot}: no {RESOURCE} instance below thresholds" in message for message in messages), messages
    assert hot not in placed


def test_the_plugin_reads_prometheus_with_its_token_and_follows_a_rotation(
    core, prometheus, plugin_scheduler, namespace
):
    namespace, bindings = namespace
    pool = {"gpufleet.test/scheduling": "plugin-token"}
    a, b = "plugin-token-a", "plugin-token-b"
    create_nodes(core, [a, b], {RESOURCE: "2"}, labels=pool)
    prometheus.set_loads({a: [0.1, 0.1], b: [0.95, 0.95]})
    time.sleep(2.5)
    # Every query so far carried the token, over https with the pinned CA (a refused handshake sends no query).
    assert prometheus.authorizations and set(prometheus.authorizations) == {"Bearer first-token"}
    make_pods(core, namespace, ["before-rotation"], pool)
    assert bindings.wait(1, timeout=60), "the first pod was not bound"
    assert bindings.bound["before-rotation"][0] == a

    # The kubelet rewrites a rotated Secret in place; the plugin re-reads the file at its next refresh. The loads
    # swap at the same time: only a refresh that Prometheus answered (the new token) sends the next pod to b.
    prometheus.rotate_token("second-token")
    prometheus.set_loads({a: [0.95, 0.95], b: [0.1, 0.1]})
    rotated_at = len(prometheus.authorizations)
    wait_for(
        lambda: "Bearer second-token" in prometheus.authorizations[rotated_at:],
        timeout=30,
        what="a query with the rotated token",
    )
    time.sleep(2.5)
    make_pods(core, namespace, ["after-rotation"], pool)
    assert bindings.wait(2, timeout=60), f"bound: {bindings.bound}"
    assert bindings.bound["after-rotation"][0] == b


def test_a_burst_spreads_through_in_flight_accounting(core, prometheus, plugin_scheduler, namespace):
    namespace, bindings = namespace
    pool = {"gpufleet.test/scheduling": "plugin-burst"}
    a, b, c = "plugin-burst-a", "plugin-burst-b", "plugin-burst-c"
    slots = 7
    create_nodes(core, [a, b, c], {RESOURCE: str(slots)}, labels=pool)
    # Two idle instances per node, the rest busy: a's score 10, b's 9, c's 7. Without in-flight accounting every
    # pod of a burst sees a's idle instances and herds there (a has room for all six); with it, each placed pod
    # takes an idle instance, so a drops to 4 after two pods, then b after two more.
    busy = [0.6] * (slots - 2)
    prometheus.set_loads({a: [0.0, 0.0, *busy], b: [0.1, 0.1, *busy], c: [0.3, 0.3, *busy]})
    time.sleep(2.5)

    burst = 6
    make_pods(core, namespace, [f"burst-{i}" for i in range(burst)], pool)
    assert bindings.wait(burst, timeout=60), f"bound: {bindings.bound}"
    placed = [node for node, _ in bindings.bound.values()]
    assert {node: placed.count(node) for node in (a, b, c)} == {a: 2, b: 2, c: 2}, placed


def test_a_shared_node_is_judged_by_the_instance_the_device_plugin_would_hand_out(
    core, prometheus, shared_plugin_scheduler, namespace
):
    namespace, bindings = namespace
    pool = {"gpufleet.test/scheduling": "plugin-shared"}
    idle_but_shared, warm = "plugin-shared-a", "plugin-shared-b"
    create_nodes(core, [idle_but_shared, warm], {RESOURCE: "4"}, labels=pool)  # 2 instances x 2 replicas
    # a: an idle instance one pod already shares and a hot one that no pod holds. The device plugin hands the next
    # pod a replica of the instance with the fewest pods, the hot one, so a is refused though its coolest instance
    # is idle (judged as exclusive instances, a would score 10 and take every pod). b: two warm instances, no pod.
    prometheus.set_loads({idle_but_shared: [0.0, 0.95], warm: [0.3, 0.3]}, pods={idle_but_shared: [1, 0], warm: [0, 0]})
    time.sleep(2.5)

    # Four pods fill b's four replicas; each placed pod counts on b's least-used instance until a sample shows it.
    make_pods(core, namespace, [f"shared-{i}" for i in range(4)], pool)
    assert bindings.wait(4, timeout=60), f"bound: {bindings.bound}"
    assert {node for node, _ in bindings.bound.values()} == {warm}
