"""The real kube-scheduler with the KubeSchedulerConfiguration the kube_scheduler role renders (secondary mode)
and the bundled extender: MIG pods bind by load, none to a node whose devices are all above the threshold; with
the extender down, `ignorable: true` lets pods bind anyway and `ignorable: false` keeps them pending, saying why.

kube-scheduler reads its configuration once, so each variant starts a scheduler of its own."""

from __future__ import annotations

import pytest
from gpufleet_testsupport.extender import start_extender
from gpufleet_testsupport.ports import free_port
from gpufleet_testsupport.processes import stop_process
from gpufleet_testsupport.scheduling import (
    MIG_RESOURCE,
    create_mig_pods,
    create_nodes,
    failed_scheduling,
    rendered_scheduler_config,
    write_mig_metrics,
)
from gpufleet_testsupport.waits import wait_for

pytestmark = pytest.mark.integration

POOL = {"gpufleet.test/scheduling": "extender"}  # our nodes only: the session's cluster has others
COOL, HOT = ["sched-cool-1", "sched-cool-2"], "sched-hot"
SLOTS = 3  # 2g.20gb instances per node


@pytest.fixture(scope="module")
def nodes(core):
    create_nodes(core, [*COOL, HOT], {MIG_RESOURCE: str(SLOTS)}, labels=POOL)
    return [*COOL, HOT]


@pytest.fixture(scope="module")
def extender(nodes, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("extender")
    metrics = write_mig_metrics(
        workdir / "dcgm.prom", {**{node: [0.10, 0.20, 0.15] for node in COOL}, HOT: [0.95, 0.92, 0.97]}
    )
    env = {"METRICS_SOURCE": "file", "METRICS_FILE": str(metrics), "KUBE_API": "off", "METRICS_REFRESH_SECONDS": "1"}
    process, url = start_extender(workdir, env)
    yield url
    stop_process(process)


@pytest.fixture
def scheduler(schedulers, tmp_path):
    """Start a scheduler with the role's configuration for `url_prefix`; stopped after the test."""
    started = []

    def start(url_prefix: str, ignorable: bool) -> None:
        config = rendered_scheduler_config(
            tmp_path, kube_scheduler_extender_url_prefix=url_prefix, kube_scheduler_extender_ignorable=ignorable
        )
        assert config["profiles"][0]["schedulerName"] == "gpufleet-scheduler"
        assert MIG_RESOURCE in [r["name"] for r in config["extenders"][0]["managedResources"]]
        started.append(schedulers(config, name=f"gpufleet-scheduler-{len(started)}"))

    return start


def test_mig_pods_bind_by_load_and_never_to_a_hot_node(core, extender, scheduler, namespace):
    namespace, bindings = namespace
    scheduler(extender, ignorable=True)

    # One more pod than the cool nodes hold: the hot node has free instances, but all of them are above the
    # threshold, so the last pod must wait rather than land there.
    create_mig_pods(core, namespace, len(COOL) * SLOTS + 1, POOL)

    assert bindings.wait(len(COOL) * SLOTS, timeout=60), f"bound: {bindings.bound}"
    placed = [node for node, _ in bindings.bound.values()]
    assert sorted(set(placed)) == COOL
    assert all(placed.count(node) == SLOTS for node in COOL)
    messages = wait_for(lambda: failed_scheduling(core, namespace), what="a FailedScheduling event")
    assert any(HOT in message or "below thresholds" in message for message in messages), messages


def test_an_ignorable_extender_that_is_down_does_not_stop_scheduling(core, nodes, scheduler, namespace):
    namespace, bindings = namespace
    scheduler(f"http://127.0.0.1:{free_port()}", ignorable=True)  # nothing listens there

    create_mig_pods(core, namespace, 3, POOL)

    assert bindings.wait(3, timeout=60), f"bound: {bindings.bound}"


def test_a_required_extender_that_is_down_keeps_pods_pending_with_the_reason(core, nodes, scheduler, namespace):
    namespace, bindings = namespace
    scheduler(f"http://127.0.0.1:{free_port()}", ignorable=False)

    create_mig_pods(core, namespace, 2, POOL)

    messages = wait_for(lambda: failed_scheduling(core, namespace), what="a FailedScheduling event")
    assert any("connection refused" in message for message in messages), messages
    assert bindings.bound == {}
