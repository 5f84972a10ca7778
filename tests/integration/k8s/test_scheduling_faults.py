"""Faults on the scheduling path, on the real control plane: a burst of MIG pods over 200 nodes, every tenth node
hot (and every tenth, others, the coolest while free), placed by kube-scheduler with the configuration the
kube_scheduler role renders and the bundled extender.

- The scheduler runs as two replicas with leader election; the leader is killed (SIGKILL) after the first half of
  the burst is bound, and the second half is created at once. The other replica takes the lease over and binds it:
  every pod bound, none on a hot node. The takeover time (kill to the first binding after it) is printed.
- The apiserver is restarted while the first half of the burst is being scheduled, the second half created
  after: the scheduler's and the extender's watches break and resume, the burst completes with no pod on a hot node,
  and the extender's in-flight accounting lets go of the pods deleted after it (no binding held that no longer
  exists).
- Prometheus is killed after the first third of the burst and started again, on the same port and data directory,
  OUTAGE seconds (two minutes) later, read by two extenders: one under ON_MISSING_METRICS=allow (the default)
  serving the burst's scheduler, one under deny, behind a Service (a proxy sending only to ready endpoints),
  serving a second scheduler (`ignorable: false`) with pods of its own. Both show blindness (/readyz, the gauge,
  the log) once the newest sample is older than METRICS_MAX_AGE_SECONDS; allow places the second third as a
  scheduler without the extender would, hot nodes included; deny leaves the pods created in the outage Pending
  (none bound in the two minutes). Once Prometheus is back, the extenders see within one scrape plus one refresh,
  the last third avoids the hot nodes again, and the deny pods are placed, off the hot nodes, within one refresh
  plus the Service's probe and the scheduler's backoff (the times are measured and printed). GPUScore (plugin mode,
  onMissingMetrics deny) reads the same Prometheus through the same outage: none of its pods created in it is bound
  before Prometheus is back, and they are placed after, off the hot nodes.
- The extender runs as two replicas behind a round-robin proxy (a Service, as far as the scheduler sees it); the
  replica serving the scheduler is killed (SIGKILL) with a filter call in flight, at the start of the second half
  of the burst. The proxy is slow to drop it (a Service whose endpoints are updated late): for SLOW_DROP s it still
  sends new connections there, and the scheduler's next one goes there and fails; the other replica answers the
  rest: every pod bound once. The calls on the dead replica fail; with `ignorable: false` the scheduler retries
  their pods and no pod lands on a hot node; with the role's default, `ignorable: true`, the scheduler filters those
  pods without the extender (the test counts such pods and the hot placements they led to, and prints them).
- The extender, alone behind a Service and serving a scheduler with `ignorable: false`, is killed (SIGKILL) in the
  middle of the burst and started again at once, its first list of bound pods a few seconds slow (as in a large
  cluster). It answers /readyz 503 naming the bound pods until it has listed them, so the Service sends it nothing
  before; no pod is bound while no extender is ready; once admitted it counts the earlier bindings as in flight, and
  its first decisions go to nodes without a pod, as the burst's did before the kill (the measure: of the first
  FIRST_AFTER pods bound after the restart, those sent to a node that already held one of the burst's, at most
  DOUBLED_MAX; the most pods on one of their nodes is printed against the capacity, SLOTS). The same case with the
  extender made, from outside (tests/extender_variant.py), to answer ready before that list fails: its first
  decisions pile pods onto the coolest nodes, up to their capacity.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from conftest import ensure_namespace
from gpufleet_testsupport.controlplane import OPEN_METRICS
from gpufleet_testsupport.dcgm_fleet import EXPORTER_NAMESPACE, Fleet, FleetPrometheus
from gpufleet_testsupport.exposition import render_exposition
from gpufleet_testsupport.extender import start_extender
from gpufleet_testsupport.ports import free_port
from gpufleet_testsupport.processes import stop_process
from gpufleet_testsupport.prometheus import PROMETHEUS
from gpufleet_testsupport.scheduling import (
    MIG_RESOURCE,
    BindingWatch,
    create_nodes,
    create_pods,
    gpu_pod,
    mig_devices,
    rendered_scheduler_config,
    write_mig_metrics,
)
from gpufleet_testsupport.tcp_proxy import RoundRobinProxy, ServiceProxy
from gpufleet_testsupport.waits import wait_for

pytestmark = pytest.mark.integration

POOL = {"gpufleet.test/scheduling": "faults"}  # our nodes only: the session's cluster has others
NODES = [f"flt-{i:03d}" for i in range(200)]
HOT = {node for i, node in enumerate(NODES) if i % 10 == 9}
SLOTS = 3  # 2g.20gb instances per node
BURST = 300  # pods; the cool nodes hold 540
# Short leases, so that a takeover is seconds, not the default 15 s (the role's defaults are kube-scheduler's).
LEASE = {"leaderElect": True, "leaseDuration": "4s", "renewDeadline": "3s", "retryPeriod": "1s"}
# Prometheus down for this long: two minutes, through which the pods of the deny scheduler wait.
OUTAGE = 120
SCRAPE = 2  # Prometheus' scrape interval, s
REFRESH = 1  # the extender's METRICS_REFRESH_SECONDS
MAX_AGE = 3 * SCRAPE  # the extender's METRICS_MAX_AGE_SECONDS: three missed scrapes make it blind
# What the recovery may take beyond one refresh of the first scrape: the extender's query, the /readyz poll.
RECOVERY_SLACK = 1.0
# A Prometheus (2.x) applies its scrape targets on a 5 s tick after it starts, then scrapes each within one
# interval: its first samples come up to this long after it answers ready.
PROMETHEUS_FIRST_SCRAPE = 5 + SCRAPE
DENY_SCHEDULER = "gpufleet-scheduler-deny"  # a second scheduler, its extender under ON_MISSING_METRICS=deny
DENY_PODS = 20  # its pods placed before the outage, and as many created in it (they must wait)
SKIP_SCHEDULER = "gpufleet-scheduler-skip"  # a third, on the deny extender's Service with `ignorable: true`
# A fourth: gpufleet-scheduler in plugin mode, GPUScore reading the same Prometheus with onMissingMetrics deny.
GPUSCORE_SCHEDULER = "gpufleet-scheduler-gpuscore"
# kube-scheduler's podMaxBackoffSeconds (its default: the role leaves it): a pod whose attempts failed on the
# extender is tried again at most this long after its last failure.
MAX_BACKOFF = 10
BACKOFF_FLUSH = 1  # kube-scheduler moves pods whose backoff ended back to its active queue every second
PROBE_PERIOD = 0.5  # a Service's readiness probe (the tests' proxy)
SLOW_DROP = 10.0  # s a Service keeps sending new connections to a dead extender replica


# Cooler than the other cool nodes while free (score 10 against 9), warmer once one pod took their idle instance
# (7): where an extender blind to the bindings it has not counted sends pod after pod, up to the node's capacity.
COOLEST = {node for i, node in enumerate(NODES) if i % 10 == 0}


def loads() -> dict[str, list[float]]:
    """Per node, its three 2g.20gb instances' loads: the hot nodes' all above the extender's 0.8 threshold."""
    return {
        node: [0.95, 0.92, 0.97] if node in HOT else [0.02, 0.30, 0.30] if node in COOLEST else [0.10, 0.25, 0.15]
        for node in NODES
    }


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
    process, url = start_extender(workdir, file_extender_env(workdir, control_plane))
    yield url
    stop_process(process)


def file_extender_env(workdir, control_plane) -> dict[str, str]:
    """The extender's settings on the fleet's loads (a dcgm-exporter file), watching the control plane."""
    return {
        "METRICS_SOURCE": "file",
        "METRICS_FILE": str(write_mig_metrics(workdir / "dcgm.prom", loads())),
        "METRICS_MAX_AGE_SECONDS": "0",
        "METRICS_REFRESH_SECONDS": "1",
        "KUBE_API": "kubeconfig",
        "KUBECONFIG": str(control_plane.kubeconfig),
    }


def wave(
    core, namespace: str, first: int, count: int, scheduler: str = "gpufleet-scheduler", prefix: str = "burst"
) -> None:
    pods = [gpu_pod(f"{prefix}-{i}", scheduler, {MIG_RESOURCE: "1"}) for i in range(first, first + count)]
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


def readyz(url: str) -> dict:
    answer = httpx.get(f"{url}/readyz", timeout=5)
    return {**answer.json(), "status": answer.status_code}


def gauge(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return float(next(row for row in text.splitlines() if row.startswith(f"{name} ")).split()[1])


@pytest.fixture
def prometheus(nodes, tmp_path):
    """A real Prometheus scraping the fleet's loads every SCRAPE s, from two exporter targets of 100 nodes each
    (the job and namespace labels the dcgm_exporter role's scrape gives, which the extender's queries pin)."""
    devices = mig_devices(loads())
    shards = [
        render_exposition({node: devices[node] for node in NODES[start : start + 100]}).encode()
        for start in range(0, len(NODES), 100)
    ]
    fleet = Fleet(NODES, dict.fromkeys(NODES, "faults"), HOT, shards)
    workdir = tmp_path / "prometheus"
    workdir.mkdir()
    server = FleetPrometheus(fleet, workdir, PROMETHEUS, interval=SCRAPE)
    with server:
        yield server


@pytest.mark.skipif(not os.path.exists(PROMETHEUS), reason=f"no Prometheus at {PROMETHEUS}")
def test_prometheus_stopped_mid_burst_then_back(control_plane, core, namespace, prometheus, tmp_path):
    """One outage, two extenders reading the Prometheus: `allow` (the default) serving the burst's scheduler
    directly, `deny` behind a Service (readiness-gated proxy) serving a scheduler of its own with `ignorable:
    false`, the setting under which `deny` keeps GPU pods from being placed blind (see docs/reliability.md); a
    third scheduler on the same Service with the role's default, `ignorable: true`, shows why: its pods created in
    the outage are placed blind."""
    namespace, bindings = namespace
    env = {
        "METRICS_SOURCE": "prometheus",
        "PROMETHEUS_URL": prometheus.url,
        "EXPORTER_JOB": "dcgm-exporter",
        "EXPORTER_NAMESPACE": EXPORTER_NAMESPACE,
        "METRICS_REFRESH_SECONDS": str(REFRESH),
        "METRICS_MAX_AGE_SECONDS": str(MAX_AGE),
        "KUBE_API": "kubeconfig",
        "KUBECONFIG": str(control_plane.kubeconfig),
    }
    denied = f"{namespace}-deny"  # the deny scheduler's pods, counted apart
    skipping = f"{namespace}-skip"  # the third scheduler's (deny, `ignorable: true`)
    ensure_namespace(core, denied)
    ensure_namespace(core, skipping)
    skip_bindings = BindingWatch(core, skipping)
    deny_bindings = BindingWatch(core, denied)
    extender, url = start_extender(tmp_path, env)
    deny_extender, deny_url = start_extender(tmp_path, {**env, "ON_MISSING_METRICS": "deny"})
    deny_proxy = ServiceProxy([("127.0.0.1", port_of(deny_url))], period=PROBE_PERIOD)
    config = rendered_scheduler_config(tmp_path / "render", kube_scheduler_extender_url_prefix=url)
    scheduler = control_plane.start_scheduler(config, name="faults-scheduler-prometheus")
    deny_config = rendered_scheduler_config(
        tmp_path / "render-deny",
        kube_scheduler_extender_url_prefix=deny_proxy.url,
        kube_scheduler_extender_ignorable=False,
    )
    deny_config["profiles"][0]["schedulerName"] = DENY_SCHEDULER
    deny_scheduler = control_plane.start_scheduler(deny_config, name="faults-scheduler-prometheus-deny")
    skip_config = rendered_scheduler_config(tmp_path / "render-skip", kube_scheduler_extender_url_prefix=deny_proxy.url)
    assert skip_config["extenders"][0]["ignorable"] is True  # the role's default
    skip_config["profiles"][0]["schedulerName"] = SKIP_SCHEDULER
    skip_scheduler = control_plane.start_scheduler(skip_config, name="faults-scheduler-prometheus-skip")
    # GPUScore in the scheduler's own process, as the role renders plugin mode, reading the same Prometheus (plain
    # http here, which needs the role's opt-in; its token file holds a token this Prometheus does not check).
    gpuscored = f"{namespace}-gpuscore"
    ensure_namespace(core, gpuscored)
    gpuscore_bindings = BindingWatch(core, gpuscored)
    token = tmp_path / "gpuscore-token"
    token.write_text("unchecked\n")
    plugin_config = rendered_scheduler_config(
        tmp_path / "render-gpuscore",
        kube_scheduler_mode="plugin",
        kube_scheduler_prometheus_allow_http=True,
        kube_scheduler_plugin_extra_args={
            "prometheusURL": prometheus.url,
            "prometheusTokenFile": str(token),
            "metricsRefreshSeconds": REFRESH,
            "metricsMaxAgeSeconds": MAX_AGE,
            "onMissingMetrics": "deny",
            "exporterJob": "dcgm-exporter",
            "exporterNamespace": EXPORTER_NAMESPACE,
        },
    )
    plugin_config["profiles"][0]["schedulerName"] = GPUSCORE_SCHEDULER
    gpuscore_scheduler = control_plane.start_scheduler(
        plugin_config, binary="gpufleet-scheduler", name="faults-scheduler-prometheus-gpuscore", extra_args=OPEN_METRICS
    )
    third = BURST // 3
    try:
        assert readyz(url)["metrics_blind"] is False
        wait_for(lambda: deny_proxy.alive[0], what="the deny extender in its Service")
        wave(core, namespace, 0, third)
        wave(core, denied, 0, DENY_PODS, scheduler=DENY_SCHEDULER, prefix="deny")
        wave(core, gpuscored, 0, DENY_PODS, scheduler=GPUSCORE_SCHEDULER, prefix="gpuscore")
        assert bindings.wait(third, timeout=120), f"bound before the stop: {len(bindings.bound)}"
        assert deny_bindings.wait(DENY_PODS, timeout=60), f"deny, bound before the stop: {len(deny_bindings.bound)}"
        assert gpuscore_bindings.wait(DENY_PODS, timeout=60), f"GPUScore, before: {len(gpuscore_bindings.bound)}"
        seeing = set(bindings.bound)

        prometheus.kill()
        killed = time.monotonic()
        # Blind once the newest sample is older than METRICS_MAX_AGE_SECONDS; ready still (allow), and saying so.
        blind = wait_for(
            lambda: (r := readyz(url))["metrics_blind"] and r, timeout=MAX_AGE + 15, what="the extender blind"
        )
        went_blind = time.monotonic() - killed
        assert blind["status"] == 200 and blind["ready"] and blind["on_missing_metrics"] == "allow", blind
        assert blind["metrics_blind_reason"].startswith("the newest GPU sample is"), blind
        assert "last refresh:" in blind["metrics_blind_reason"], blind  # the failing source named
        assert gauge(url, "gpufleet_extender_metrics_blind") == 1.0
        # deny: not ready, so out of its Service.
        deny_blind = wait_for(
            lambda: (r := readyz(deny_url))["metrics_blind"] and r, timeout=15, what="the deny extender blind"
        )
        assert deny_blind["status"] == 503 and deny_blind["on_missing_metrics"] == "deny", deny_blind
        wait_for(lambda: not deny_proxy.alive[0], timeout=5, what="the deny extender out of its Service")

        wave(core, namespace, third, third)  # the second third, placed blind
        wave(core, denied, DENY_PODS, DENY_PODS, scheduler=DENY_SCHEDULER, prefix="deny")  # these must wait
        wave(core, skipping, 0, DENY_PODS, scheduler=SKIP_SCHEDULER, prefix="skip")  # these skip the extender
        # GPUScore's own blindness: its newest sample older than metricsMaxAgeSeconds. Its last query may have
        # found a sample one scrape newer than the extenders' last did, so it can go blind after them: wait for it.
        # These must then wait under onMissingMetrics deny.
        wait_for(
            lambda: gpuscore_blind(control_plane.ports[gpuscore_scheduler]), timeout=MAX_AGE + 15, what="GPUScore blind"
        )
        wave(core, gpuscored, DENY_PODS, DENY_PODS, scheduler=GPUSCORE_SCHEDULER, prefix="gpuscore")
        assert bindings.wait(2 * third, timeout=60), f"bound while blind: {len(bindings.bound) - third} of {third}"
        placed_blind = set(bindings.bound) - seeing
        assert readyz(url)["metrics_blind"] is True  # all of them placed while blind
        blind_on_hot = sorted(pod for pod in placed_blind if bindings.bound[pod][0] in HOT)

        assert skip_bindings.wait(DENY_PODS, timeout=60), f"ignorable, bound while blind: {len(skip_bindings.bound)}"
        time.sleep(max(0.0, killed + OUTAGE - time.monotonic()))
        deny_bound_blind = sorted(set(deny_bindings.bound) - {f"deny-{i}" for i in range(DENY_PODS)})
        gpuscore_bound_blind = sorted(set(gpuscore_bindings.bound) - {f"gpuscore-{i}" for i in range(DENY_PODS)})
        back = prometheus.restart()  # wall-clock time, as Prometheus dates its samples
        back_at = time.monotonic()
        down = back_at - killed
        # Seeing again: the first scrape after the restart dates the newest sample now. Then every node fresh
        # (each of the two exporter targets scraped once since).
        wait_for(lambda: readyz(url)["metrics_blind"] is False, timeout=30, interval=0.05, what="the extender seeing")
        seeing_at = time.time()
        wait_for(lambda: readyz(url)["metrics_stale_nodes"] == 0, timeout=30, interval=0.05, what="every node fresh")
        fresh_at = time.time()
        assert gauge(url, "gpufleet_extender_metrics_blind") == 0.0
        # deny: ready again, so back in its Service (the proxy's probe admits it: that moment is kept).
        admitted = wait_for(
            lambda: next((at for _, at in deny_proxy.admitted if at > back_at), None),
            timeout=30,
            interval=0.05,
            what="the deny extender back in its Service",
        )
        recovered = set(bindings.bound)

        wave(core, namespace, 2 * third, BURST - 2 * third)  # the last third, after the return
        assert bindings.wait(BURST, timeout=120), f"bound: {len(bindings.bound)} of {BURST}"
        assert deny_bindings.wait(2 * DENY_PODS, timeout=60), f"deny, bound: {len(deny_bindings.bound)}"
        assert gpuscore_bindings.wait(2 * DENY_PODS, timeout=60), f"GPUScore, bound: {len(gpuscore_bindings.bound)}"
    finally:
        control_plane.stop_component(gpuscore_scheduler)
        gpuscore_bindings.stop()
        core.delete_collection_namespaced_pod(gpuscored, grace_period_seconds=0)
        control_plane.stop_component(scheduler)
        control_plane.stop_component(deny_scheduler)
        control_plane.stop_component(skip_scheduler)
        deny_proxy.close()
        stop_process(extender)
        stop_process(deny_extender)
        deny_bindings.stop()
        skip_bindings.stop()
        core.delete_collection_namespaced_pod(denied, grace_period_seconds=0)
        core.delete_collection_namespaced_pod(skipping, grace_period_seconds=0)
    # Each target's first scrape after the restart, as Prometheus dated it.
    one_per_target = f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{Hostname=~"{NODES[0]}|{NODES[100]}",GPU_I_ID="1"}}[3m]'
    scrapes = httpx.get(f"{prometheus.url}/api/v1/query", params={"query": one_per_target}).json()["data"]["result"]
    firsts = sorted(min(float(t) for t, _ in series["values"] if float(t) >= back) for series in scrapes)
    assert len(firsts) == 2, scrapes
    after = set(bindings.bound) - recovered
    waited = {pod: seen for pod, (_, seen) in deny_bindings.bound.items() if int(pod.split("-")[1]) >= DENY_PODS}
    deny_placed = min(waited.values()) - back_at  # the first pod that waited, placed: load-aware again
    deny_all_placed = max(waited.values()) - back_at
    deny_admitted = back + admitted - back_at  # the same moment on Prometheus' clock
    deny_on_hot = sorted(f"{pod}->{node}" for pod, (node, _) in deny_bindings.bound.items() if node in HOT)
    gpuscore_waited = {
        pod: seen for pod, (_, seen) in gpuscore_bindings.bound.items() if int(pod.split("-")[1]) >= DENY_PODS
    }
    gpuscore_on_hot = sorted(f"{p}->{node}" for p, (node, _) in gpuscore_bindings.bound.items() if node in HOT)
    # How the deny pods were held: refused by the extender (a connection it kept through its Service) or failed
    # on a Service without a ready endpoint; either way tried again.
    deny_log = (control_plane.workdir / "faults-scheduler-prometheus-deny.log").read_text(errors="replace").splitlines()
    deny_refused = sum("Unable to schedule pod" in line and f'"{denied}/' in line for line in deny_log)
    deny_failed = sum("Error scheduling pod" in line and f'"{denied}/' in line for line in deny_log)
    skip_log = (control_plane.workdir / "faults-scheduler-prometheus-skip.log").read_text(errors="replace")
    skipped = skip_log.count("Skipping extender as it returned error and has ignorable flag set")
    skip_on_hot = sorted(f"{pod}->{node}" for pod, (node, _) in skip_bindings.bound.items() if node in HOT)
    print(
        f"\nPrometheus killed after {len(seeing)} of {BURST} bindings, back {down:.1f} s later; the extender blind "
        f"{went_blind:.1f} s after the kill (METRICS_MAX_AGE_SECONDS {MAX_AGE}, scrape {SCRAPE} s); "
        f"{len(placed_blind)} pods placed blind (ON_MISSING_METRICS allow), {len(blind_on_hot)} of them on hot "
        f"nodes. Back: Prometheus ready, its first scrape {firsts[0] - back:.2f} s later; the extender seeing "
        f"{seeing_at - firsts[0]:.2f} s after that scrape ({seeing_at - back:.2f} s after ready), every node fresh "
        f"{fresh_at - firsts[-1]:.2f} s after the last target's first scrape ({fresh_at - back:.2f} s after ready; "
        f"refresh {REFRESH} s); {len(after)} pods placed after the return, "
        f"{sum(bindings.bound[pod][0] in HOT for pod in after)} on hot nodes. deny: {len(deny_bound_blind)} of "
        f"{DENY_PODS} pods bound during the outage; back in its Service {deny_admitted - firsts[-1]:.2f} s after "
        f"the last target's first scrape ({deny_admitted - back:.2f} s after Prometheus ready); the pods that "
        f"waited placed from {deny_placed:.2f} s to {deny_all_placed:.2f} s after Prometheus ready (Service probe "
        f"{PROBE_PERIOD} s, scheduler backoff up to {MAX_BACKOFF} s), {len(deny_on_hot)} deny pods on hot nodes; "
        f"attempts refused by the deny extender {deny_refused}, failed on its Service {deny_failed}. deny with "
        f"ignorable true: {len(skip_bindings.bound)} of {DENY_PODS} pods created in the outage placed in it, "
        f"{len(skip_on_hot)} on hot nodes; extender calls skipped {skipped}. GPUScore (onMissingMetrics deny): "
        f"{len(gpuscore_bound_blind)} of {DENY_PODS} pods bound during the outage; those that waited placed from "
        f"{min(gpuscore_waited.values()) - back_at:.2f} s to {max(gpuscore_waited.values()) - back_at:.2f} s after "
        f"Prometheus ready, {len(gpuscore_on_hot)} of its pods on hot nodes"
    )
    # While it saw: no hot node. Blind, under allow: placed as without the extender, so some went to the hot nodes
    # (they are the emptiest: the first third avoided them) - decisions did follow the policy, not the old samples.
    assert sorted(pod for pod in seeing if bindings.bound[pod][0] in HOT) == []
    assert blind_on_hot, "no pod placed blind went to a hot node: were the decisions really without metrics?"
    # Load-aware again within one refresh of Prometheus' first scrape after its return.
    assert seeing_at - firsts[0] <= REFRESH + RECOVERY_SLACK
    assert fresh_at - firsts[-1] <= REFRESH + RECOVERY_SLACK
    assert fresh_at - back <= PROMETHEUS_FIRST_SCRAPE + REFRESH + RECOVERY_SLACK
    assert sorted(f"{pod}->{bindings.bound[pod][0]}" for pod in after if bindings.bound[pod][0] in HOT) == []
    # deny: no pod placed blind; the extender back in its Service within one refresh and one probe of the first
    # scrapes, and every pod that waited placed after that, load-aware, within the scheduler's backoff.
    assert deny_bound_blind == []
    assert deny_admitted - firsts[-1] <= REFRESH + PROBE_PERIOD + RECOVERY_SLACK
    # The probe sees the extender ready up to one period late, and a connection the scheduler kept to it from before
    # the outage carries a call as soon as it is ready: the first pod may come that much before `admitted`.
    assert len(waited) == DENY_PODS and min(waited.values()) >= admitted - PROBE_PERIOD, waited
    assert max(waited.values()) - admitted <= MAX_BACKOFF + BACKOFF_FLUSH + RECOVERY_SLACK
    # deny, `ignorable: true`: a Service without a ready endpoint is an error the scheduler skips, so the pods
    # created in the outage were placed in it, blind (bound before Prometheus came back).
    assert len(skip_bindings.bound) == DENY_PODS and max(t for _, t in skip_bindings.bound.values()) < back_at
    assert skipped >= 1, skip_log[-3000:]
    assert deny_on_hot == []
    # GPUScore under onMissingMetrics deny: nothing placed blind; once back, every pod that waited placed, off the
    # hot nodes, within its refresh and the scheduler's backoff of the first scrapes.
    assert gpuscore_bound_blind == []
    assert len(gpuscore_waited) == DENY_PODS and min(gpuscore_waited.values()) >= back_at, gpuscore_waited
    assert max(gpuscore_waited.values()) - back_at <= (
        PROMETHEUS_FIRST_SCRAPE + REFRESH + MAX_BACKOFF + BACKOFF_FLUSH + RECOVERY_SLACK
    )
    assert gpuscore_on_hot == []
    log = "".join(path.read_text() for path in tmp_path.glob("extender-*.log"))
    assert log.count("decisions use no GPU") >= 2  # the WARNING line operators grep for, from both


def scheduler_metrics(port: int) -> str:
    """The /metrics text of a scheduler started with OPEN_METRICS."""
    return httpx.get(f"https://127.0.0.1:{port}/metrics", verify=False, timeout=10).text


def schedule_attempts(port: int) -> dict[str, float]:
    """The scheduler's scheduler_schedule_attempts_total by result (scheduled, unschedulable, error)."""
    text = scheduler_metrics(port)
    rows = [row for row in text.splitlines() if row.startswith("scheduler_schedule_attempts_total{")]
    return {row.split('result="')[1].split('"')[0]: float(row.split()[-1]) for row in rows}


def gpuscore_blind(port: int) -> bool:
    """GPUScore's scheduler_gpuscore_metrics_blind gauge is 1 (its newest GPU sample older than its max age)."""
    found = re.search(r"^scheduler_gpuscore_metrics_blind (\S+)$", scheduler_metrics(port), re.MULTILINE)
    return found is not None and float(found.group(1)) == 1.0


def port_of(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


def test_an_extender_replica_killed_mid_burst_ignorable_false(control_plane, core, nodes, namespace, tmp_path):
    replica_killed_mid_burst(control_plane, core, namespace, tmp_path, ignorable=False)


def test_an_extender_replica_killed_mid_burst_role_default(control_plane, core, nodes, namespace, tmp_path):
    replica_killed_mid_burst(control_plane, core, namespace, tmp_path, ignorable=None)


def replica_killed_mid_burst(control_plane, core, namespace, tmp_path, ignorable: bool | None) -> None:
    """Two extender replicas behind the proxy, the one serving killed with a filter call in flight; `ignorable`:
    kube_scheduler_extender_ignorable (None: the role's default). The proxy is slow to drop the dead replica, as a
    Service whose endpoints are updated late: for SLOW_DROP s it still sends new connections to it, and the first
    the scheduler opens after the kill goes there."""
    namespace, bindings = namespace
    env = file_extender_env(tmp_path, control_plane)
    replicas = [start_extender(tmp_path, env) for _ in range(2)]
    processes = [process for process, _ in replicas]
    armed, lock, killed = threading.Event(), threading.Lock(), {}

    def kill_with_a_filter_call_in_flight(backend: int, data: bytes) -> None:
        # The replica dies after the scheduler sent it a filter call and before it answers.
        if armed.is_set() and data.startswith(b"POST /filter"):
            with lock:
                if not killed:
                    proxy.send_next_to(backend)
                    processes[backend].kill()
                    processes[backend].wait()
                    # The scheduler may hold an idle connection to the survivor too, which would carry its next
                    # call: it ends here, as the survivor's keep-alive timeout ends it, so that the next call
                    # opens a connection, and the proxy, slow to drop the dead replica, sends that one there.
                    proxy.close_connections_to(1 - backend)
                    pod = re.search(rb'"name":"(burst-\d+)"', data)  # the pod the call was for
                    killed.update(
                        backend=backend,
                        connections=proxy.connections[backend],
                        pod=pod.group(1).decode() if pod else None,
                    )

    backends = [("127.0.0.1", port_of(u)) for _, u in replicas]
    proxy = RoundRobinProxy(backends, on_send=kill_with_a_filter_call_in_flight, drop_after=SLOW_DROP)
    role_vars: dict = {"kube_scheduler_extender_url_prefix": proxy.url}
    if ignorable is not None:
        role_vars["kube_scheduler_extender_ignorable"] = ignorable
    config = rendered_scheduler_config(tmp_path / "render", **role_vars)
    ignores_errors = config["extenders"][0]["ignorable"]
    assert ignores_errors is (ignorable is not False)  # the role's default is ignorable: true
    name = f"faults-scheduler-replicas-{str(ignores_errors).lower()}"
    scheduler = control_plane.start_scheduler(config, name=name, extra_args=OPEN_METRICS)
    try:
        half = BURST // 2
        wave(core, namespace, 0, half)
        assert bindings.wait(half, timeout=120), f"bound before the kill: {len(bindings.bound)}"
        armed.set()
        wave(core, namespace, half, BURST - half)
        assert bindings.wait(BURST, timeout=180), f"bound: {len(bindings.bound)} of {BURST}"
        attempts = schedule_attempts(control_plane.ports[name])
    finally:
        control_plane.stop_component(scheduler)
        proxy.close()
        for process in processes:
            stop_process(process)
    assert killed, "no filter call went out after the first half: the replica was not killed"
    survivor = 1 - killed["backend"]
    log = (control_plane.workdir / f"{name}.log").read_text(errors="replace")
    skipped = [line for line in log.splitlines() if "Skipping extender as it returned error" in line]
    failed = [line for line in log.splitlines() if "Error scheduling pod" in line and proxy.url in line]
    hot = placed_on_hot(bindings)
    victim = killed["pod"]
    assert victim in bindings.bound, killed  # the pod whose filter call was in flight
    victim_node = bindings.bound[victim][0]

    print(
        f"\nignorable {str(ignores_errors).lower()}: replica {killed['backend']} killed with a filter call in flight "
        f"after {half} of {BURST} bindings; connections lost on it while the proxy still sent to it "
        f"{proxy.failed_connects[killed['backend']]}, the proxy dropped {proxy.dropped}, connections per replica "
        f"{proxy.connections}; scheduling attempts {attempts}; filter errors skipped (ignorable) {len(skipped)}, "
        f"attempts failed on the extender {len(failed)}; the pod whose call failed, {victim}, went to {victim_node} "
        f"({'hot' if victim_node in HOT else 'cool'}); pods on hot nodes {len(hot)}"
        f"{': ' + ', '.join(hot) if hot else ''}"
    )
    # Bound once: as many successful attempts (each ends in a binding) as pods, every pod on a node.
    assert len(bindings.bound) == BURST and attempts.get("scheduled") == BURST, attempts
    # After the kill the scheduler met the dead replica (the proxy slow to drop it), then every connection that was
    # served went to the survivor.
    assert proxy.failed_connects[killed["backend"]] >= 1, proxy.failed_connects
    assert proxy.connections[killed["backend"]] == killed["connections"], proxy.connections
    assert proxy.dropped in ([], [killed["backend"]]) and proxy.alive[survivor]
    if ignores_errors:
        # The failed call let the scheduler filter that pod without the extender: a hot node becomes possible for
        # it (the surviving replica's prioritize still ranks hot nodes last). Every hot placement has such a skip.
        assert len(skipped) >= 1, log[-3000:]
        assert len(hot) <= len(skipped), (hot, skipped)
    else:
        # The failed call failed the attempt; the pod was retried, on the surviving replica: no hot node.
        assert skipped == [] and len(failed) >= 1, log[-3000:]
        assert hot == []


# --- the extender restarted mid-burst ------------------------------------------------------------------------------
VARIANT = Path(__file__).resolve().parents[2] / "extender_variant.py"  # serve, with test-only changes (see there)
RESTART_WAVE = 120  # pods bound before the rest of the burst is created
RESTART_KILL_AT = 130  # the extender is killed once this many are bound (the rest of the burst in flight)
# The first list of bound pods answers this late after the restart (a large cluster's list): the window in which
# the restarted extender holds metrics but not yet the in-flight bindings.
POD_LIST_DELAY = 5.0
FIRST_AFTER = 20  # the first decisions after the restart that the pile measure looks at
# Of those, at most this many may go to a node that already holds one of the burst's pods (a binding the
# extender's watch has not delivered yet can cause one without any restart: the last FIRST_AFTER decisions
# before the kill are measured the same way and printed).
DOUBLED_MAX = 2
RESTART_BURST = RESTART_KILL_AT + 2 * FIRST_AFTER  # pods; the cool nodes hold 540, one each for 180
# A binding decided just before the kill may show in the watch a little after it: not counted as bound while no
# extender was ready.
BIND_GRACE = 2.0


def launch_extender(workdir: Path, env: dict[str, str], port: int) -> subprocess.Popen:
    """The extender (tests/extender_variant.py serve) on `port`, not waiting for it."""
    log = (workdir / f"extender-{port}.log").open("w")
    return subprocess.Popen(
        [sys.executable, str(VARIANT), "serve", "--host", "127.0.0.1", "--port", str(port)],
        env={**os.environ, **env},
        stdout=log,
        stderr=subprocess.STDOUT,
    )


@dataclass
class Restart:
    """What one restart mid-burst showed."""

    bound_at_kill: int  # pods bound when the extender was killed
    answers: list[tuple[float, int | None, dict]]  # the restarted extender's /readyz answers: (time, status, body)
    ready_at: float  # its first 200
    admitted_at: float  # the Service sent to it again
    assumed_at_ready: float  # gpufleet_extender_inflight_assumed_pods read right after the first 200
    bound_while_unready: list[str]  # pods bound between the kill and the admission (goal: none)
    doubled_before: int  # of the last FIRST_AFTER pods bound before the kill, those sent to a node holding one
    doubled_after: int  # the same of the first FIRST_AFTER pods bound after the restart
    pile: int  # the most pods on a node that took one of the first FIRST_AFTER pods after the restart
    first_after: list[str]  # those pods, pod->node
    on_hot: list[str]
    bound: int
    scheduled: float  # kube-scheduler's successful attempts (each ends in one binding)

    def unsynced_window(self) -> float:
        """How long the restarted extender answered 503 naming the bound pods as not listed yet."""
        times = [t for t, status, body in self.answers if status == 503 and "Pod" in body.get("kube_api_unsynced", [])]
        return max(times) - min(times) if times else 0.0

    def violations(self, burst: int) -> list[str]:
        """The invariants of the case this restart broke (none: it passed)."""
        wrong = []
        early = [
            body
            for _, status, body in self.answers
            if status == 200 and (body["kube_api_unsynced"] or body["loading"] or body["metrics_age_seconds"] is None)
        ]
        if early or self.assumed_at_ready < self.bound_at_kill:
            wrong.append(
                f"ready before the in-flight bindings were rebuilt or the metrics loaded: {self.assumed_at_ready:g} "
                f"pods assumed in flight at the first 200, {self.bound_at_kill} bound before the kill; {early}"
            )
        if self.admitted_at < self.ready_at:
            wrong.append("the Service sent to the extender before its /readyz answered 200")
        if self.bound_while_unready:
            wrong.append(f"pods bound while no extender was ready: {self.bound_while_unready}")
        if self.doubled_after > DOUBLED_MAX:
            wrong.append(
                f"the first {FIRST_AFTER} decisions after the restart piled pods: {self.doubled_after} sent to a node "
                f"already holding one ({self.doubled_before} of the last {FIRST_AFTER} before the kill), up to "
                f"{self.pile} on one node (capacity {SLOTS}): {', '.join(self.first_after)}"
            )
        if self.on_hot:
            wrong.append(f"pods on hot nodes: {self.on_hot}")
        if self.bound != burst or self.scheduled != burst:
            wrong.append(f"bound {self.bound}, scheduled {self.scheduled:g}, of {burst}")
        return wrong

    def summary(self) -> str:
        return (
            f"extender killed after {self.bound_at_kill} bindings; restarted, /readyz 503 naming the bound pods "
            f"unlisted for {self.unsynced_window():.1f} s (their list delayed {POD_LIST_DELAY:g} s), ready "
            f"with {self.assumed_at_ready:g} pods in flight, admitted {self.admitted_at - self.ready_at:.2f} s "
            f"after its first 200; bound while none was ready {len(self.bound_while_unready)}; of the first "
            f"{FIRST_AFTER} pods after the restart {self.doubled_after} sent to a node already holding one (of the "
            f"last {FIRST_AFTER} before the kill: {self.doubled_before}), the most on one of their nodes {self.pile} "
            f"(capacity {SLOTS}); {self.bound} bound, {self.scheduled:g} scheduling attempts succeeded, "
            f"{len(self.on_hot)} on hot nodes"
        )


def restart_mid_burst(control_plane, core, namespace, tmp_path, burst: int, ready_before_sync: bool) -> Restart:
    """One extender behind a Service (readiness-gated proxy) serving a scheduler with `ignorable: false`; killed
    (SIGKILL) mid-burst and started again at once, its first list of bound pods POD_LIST_DELAY s slow."""
    namespace, bindings = namespace
    env = {**file_extender_env(tmp_path, control_plane), "GPUFLEET_TEST_POD_LIST_DELAY": str(POD_LIST_DELAY)}
    port = free_port()
    process = launch_extender(tmp_path, env, port)
    proxy = ServiceProxy([("127.0.0.1", port)], period=PROBE_PERIOD)
    name = f"faults-scheduler-extender-restart{'-broken' if ready_before_sync else ''}"
    scheduler = None
    try:
        wait_for(lambda: proxy.alive[0], timeout=120, what="the extender ready")
        config = rendered_scheduler_config(
            tmp_path / "render", kube_scheduler_extender_url_prefix=proxy.url, kube_scheduler_extender_ignorable=False
        )
        scheduler = control_plane.start_scheduler(config, name=name, extra_args=OPEN_METRICS)
        wave(core, namespace, 0, RESTART_WAVE)
        assert bindings.wait(RESTART_WAVE, timeout=120), f"bound before the kill: {len(bindings.bound)}"
        wave(core, namespace, RESTART_WAVE, burst - RESTART_WAVE)
        assert bindings.wait(RESTART_KILL_AT, timeout=60), f"bound before the kill: {len(bindings.bound)}"
        process.kill()
        process.wait()
        killed = time.monotonic()
        bound_at_kill = len(bindings.bound)
        port = free_port()
        proxy.replace(0, ("127.0.0.1", port))  # the restarted pod's new endpoint, not ready yet
        broken = {"GPUFLEET_TEST_READY_BEFORE_SYNC": "1"} if ready_before_sync else {}  # the restart only
        process = launch_extender(tmp_path, {**env, **broken}, port)
        answers: list[tuple[float, int | None, dict]] = []

        def ready() -> bool:
            try:
                answer = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
            except httpx.HTTPError:
                answers.append((time.monotonic(), None, {}))
                return False
            answers.append((time.monotonic(), answer.status_code, answer.json()))
            return answer.status_code == 200

        wait_for(ready, timeout=120, interval=0.05, what="the restarted extender ready")
        ready_at = answers[-1][0]
        assumed_at_ready = assumed_pods(f"http://127.0.0.1:{port}")
        admitted_at = wait_for(
            lambda: next((at for _, at in proxy.admitted if at > killed), None), what="the restarted extender admitted"
        )
        assert bindings.wait(burst, timeout=180), f"bound: {len(bindings.bound)} of {burst}"
        scheduled = schedule_attempts(control_plane.ports[name]).get("scheduled", 0.0)
    finally:
        if scheduler is not None:
            control_plane.stop_component(scheduler)
        proxy.close()
        stop_process(process)
    # In the order seen: each pod, its node, and how many of the burst's pods that node held already.
    held: Counter[str] = Counter()
    order = []
    for seen, pod, node in sorted((seen, pod, node) for pod, (node, seen) in bindings.bound.items()):
        order.append((seen, pod, node, held[node]))
        held[node] += 1
    last_before = [row for row in order if row[0] <= killed][-FIRST_AFTER:]
    first_after = [row for row in order if row[0] >= admitted_at][:FIRST_AFTER]
    return Restart(
        bound_at_kill=bound_at_kill,
        answers=answers,
        ready_at=ready_at,
        admitted_at=admitted_at,
        assumed_at_ready=assumed_at_ready,
        bound_while_unready=sorted(
            pod for pod, (_, seen) in bindings.bound.items() if killed + BIND_GRACE < seen < admitted_at
        ),
        doubled_before=sum(count > 0 for *_, count in last_before),
        doubled_after=sum(count > 0 for *_, count in first_after),
        pile=max(count + 1 for *_, count in first_after),
        first_after=[f"{pod}->{node}" for _, pod, node, _ in first_after],
        on_hot=placed_on_hot(bindings),
        bound=len(bindings.bound),
        scheduled=scheduled,
    )


def test_the_extender_restarted_mid_burst(control_plane, core, nodes, namespace, tmp_path):
    restart = restart_mid_burst(control_plane, core, namespace, tmp_path, RESTART_BURST, ready_before_sync=False)
    print(f"\n{restart.summary()}")
    # Not ready while its bound pods were unlisted: the window was there (the list was slow), and it answered 503.
    assert restart.unsynced_window() >= POD_LIST_DELAY / 2, restart.answers
    assert restart.violations(RESTART_BURST) == []


def test_an_extender_ready_before_its_inflight_view_is_rebuilt_fails_the_case(
    control_plane, core, nodes, namespace, tmp_path
):
    """The same case, the extender made (from outside) to report ready before it lists the bound pods: the case
    must catch it, by the pile its first decisions make."""
    restart = restart_mid_burst(control_plane, core, namespace, tmp_path, RESTART_BURST, ready_before_sync=True)
    print(f"\nbroken on purpose: {restart.summary()}")
    wrong = restart.violations(RESTART_BURST)
    assert any(line.startswith("ready before the in-flight bindings were rebuilt") for line in wrong), wrong
    assert any(line.startswith(f"the first {FIRST_AFTER} decisions after the restart piled") for line in wrong), wrong
