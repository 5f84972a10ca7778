"""Faults on the scheduling path, on the real control plane: a burst of MIG pods over 200 nodes, every tenth node
hot, placed by kube-scheduler with the configuration the kube_scheduler role renders and the bundled extender.

- The scheduler runs as two replicas with leader election; the leader is killed (SIGKILL) after the first half of
  the burst is bound, and the second half is created at once. The other replica takes the lease over and binds it:
  every pod bound, none on a hot node. The takeover time (kill to the first binding after it) is printed.
- The apiserver is restarted while the first half of the burst is being scheduled, the second half created
  after: the scheduler's and the extender's watches break and resume, the burst completes with no pod on a hot node,
  and the extender's in-flight accounting lets go of the pods deleted after it (no binding held that no longer
  exists).
- Prometheus is killed after the first third of the burst and started again, on the same port and data directory,
  OUTAGE seconds later: the extender, reading it, shows blindness (/readyz, its gauge, its log) once its newest sample
  is older than METRICS_MAX_AGE_SECONDS; meanwhile ON_MISSING_METRICS=allow (the default) places the second third
  as a scheduler without the extender would, hot nodes included; once Prometheus is back, the extender sees within
  one scrape plus one refresh (the time is measured and printed) and the last third avoids the hot nodes again.
- The extender runs as two replicas behind a round-robin proxy (a Service, as far as the scheduler sees it); the
  replica serving the scheduler is killed (SIGKILL) with a filter call in flight, at the start of the second half
  of the burst. The proxy drops it, the other replica answers the rest: every pod bound once. The call in flight
  fails; with `ignorable: false` the scheduler retries that pod and no pod lands on a hot node; with the role's
  default, `ignorable: true`, the scheduler filters that pod without the extender (the test counts such pods and
  the hot placements they led to, and prints them).
"""

from __future__ import annotations

import os
import re
import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest
from conftest import wait_for
from dcgm_fleet import EXPORTER_NAMESPACE, Fleet, FleetPrometheus
from exposition import render_exposition
from fake_prometheus import PROMETHEUS
from scheduling import (
    MIG_RESOURCE,
    create_nodes,
    create_pods,
    gpu_pod,
    mig_devices,
    rendered_scheduler_config,
    start_extender,
    stop_process,
    write_mig_metrics,
)
from tcp_proxy import RoundRobinProxy

pytestmark = pytest.mark.integration

POOL = {"gpufleet.test/scheduling": "faults"}  # our nodes only: the session's cluster has others
NODES = [f"flt-{i:03d}" for i in range(200)]
HOT = {node for i, node in enumerate(NODES) if i % 10 == 9}
SLOTS = 3  # 2g.20gb instances per node
BURST = 300  # pods; the cool nodes hold 540
# Short leases, so that a takeover is seconds, not the default 15 s (the role's defaults are kube-scheduler's).
LEASE = {"leaderElect": True, "leaseDuration": "4s", "renewDeadline": "3s", "retryPeriod": "1s"}
# Prometheus down for this long. The two minutes would only stretch the blind phase: the samples are past
# METRICS_MAX_AGE_SECONDS after MAX_AGE seconds, and what happens at the return does not depend on how long it was
# away (its data directory keeps the old samples, older than MAX_AGE either way); 30 s keeps the case near a minute.
OUTAGE = 30
SCRAPE = 2  # Prometheus' scrape interval, s
REFRESH = 1  # the extender's METRICS_REFRESH_SECONDS
MAX_AGE = 3 * SCRAPE  # the extender's METRICS_MAX_AGE_SECONDS: three missed scrapes make it blind
# What the recovery may take beyond one refresh of the first scrape: the extender's query, the /readyz poll.
RECOVERY_SLACK = 1.0
# A Prometheus (2.x) applies its scrape targets on a 5 s tick after it starts, then scrapes each within one
# interval: its first samples come up to this long after it answers ready.
PROMETHEUS_FIRST_SCRAPE = 5 + SCRAPE


def loads() -> dict[str, list[float]]:
    """Per node, its three 2g.20gb instances' loads: the hot nodes' all above the extender's 0.8 threshold."""
    return {node: ([0.95, 0.92, 0.97] if node in HOT else [0.10, 0.25, 0.15]) for node in NODES}


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
    extender, url = start_extender(tmp_path, env)
    config = rendered_scheduler_config(tmp_path / "render", kube_scheduler_extender_url_prefix=url)
    scheduler = control_plane.start_scheduler(config, name="faults-scheduler-prometheus")
    third = BURST // 3
    try:
        assert readyz(url)["metrics_blind"] is False
        wave(core, namespace, 0, third)
        assert bindings.wait(third, timeout=120), f"bound before the stop: {len(bindings.bound)}"
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

        wave(core, namespace, third, third)  # the second third, placed blind
        assert bindings.wait(2 * third, timeout=60), f"bound while blind: {len(bindings.bound) - third} of {third}"
        placed_blind = set(bindings.bound) - seeing
        assert readyz(url)["metrics_blind"] is True  # all of them placed while blind
        blind_on_hot = sorted(pod for pod in placed_blind if bindings.bound[pod][0] in HOT)

        time.sleep(max(0.0, killed + OUTAGE - time.monotonic()))
        back = prometheus.restart()  # wall-clock time, as Prometheus dates its samples
        down = time.monotonic() - killed
        # Seeing again: the first scrape after the restart dates the newest sample now. Then every node fresh
        # (each of the two exporter targets scraped once since).
        wait_for(lambda: readyz(url)["metrics_blind"] is False, timeout=30, interval=0.05, what="the extender seeing")
        seeing_at = time.time()
        wait_for(lambda: readyz(url)["metrics_stale_nodes"] == 0, timeout=30, interval=0.05, what="every node fresh")
        fresh_at = time.time()
        assert gauge(url, "gpufleet_extender_metrics_blind") == 0.0
        recovered = set(bindings.bound)

        wave(core, namespace, 2 * third, BURST - 2 * third)  # the last third, after the return
        assert bindings.wait(BURST, timeout=120), f"bound: {len(bindings.bound)} of {BURST}"
    finally:
        control_plane.stop_component(scheduler)
        stop_process(extender)
    # Each target's first scrape after the restart, as Prometheus dated it.
    one_per_target = f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{Hostname=~"{NODES[0]}|{NODES[100]}",GPU_I_ID="1"}}[2m]'
    scrapes = httpx.get(f"{prometheus.url}/api/v1/query", params={"query": one_per_target}).json()["data"]["result"]
    firsts = sorted(min(float(t) for t, _ in series["values"] if float(t) >= back) for series in scrapes)
    assert len(firsts) == 2, scrapes
    after = set(bindings.bound) - recovered
    print(
        f"\nPrometheus killed after {len(seeing)} of {BURST} bindings, back {down:.1f} s later; the extender blind "
        f"{went_blind:.1f} s after the kill (METRICS_MAX_AGE_SECONDS {MAX_AGE}, scrape {SCRAPE} s); "
        f"{len(placed_blind)} pods placed blind (ON_MISSING_METRICS allow), {len(blind_on_hot)} of them on hot "
        f"nodes. Back: Prometheus ready, its first scrape {firsts[0] - back:.2f} s later; the extender seeing "
        f"{seeing_at - firsts[0]:.2f} s after that scrape ({seeing_at - back:.2f} s after ready), every node fresh "
        f"{fresh_at - firsts[-1]:.2f} s after the last target's first scrape ({fresh_at - back:.2f} s after ready; "
        f"refresh {REFRESH} s); {len(after)} pods placed after the return, "
        f"{sum(bindings.bound[pod][0] in HOT for pod in after)} on hot nodes"
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
    log = "".join(path.read_text() for path in tmp_path.glob("extender-*.log"))
    assert "decisions use no GPU" in log  # the WARNING line operators grep for


def schedule_attempts(port: int) -> dict[str, float]:
    """The scheduler's scheduler_schedule_attempts_total by result (scheduled, unschedulable, error)."""
    text = httpx.get(f"https://127.0.0.1:{port}/metrics", verify=False, timeout=10).text
    rows = [row for row in text.splitlines() if row.startswith("scheduler_schedule_attempts_total{")]
    return {row.split('result="')[1].split('"')[0]: float(row.split()[-1]) for row in rows}


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
    kube_scheduler_extender_ignorable (None: the role's default)."""
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
                    processes[backend].kill()
                    processes[backend].wait()
                    pod = re.search(rb'"name":"(burst-\d+)"', data)  # the pod the call was for
                    killed.update(
                        backend=backend,
                        connections=proxy.connections[backend],
                        pod=pod.group(1).decode() if pod else None,
                    )

    proxy = RoundRobinProxy([("127.0.0.1", port_of(u)) for _, u in replicas], on_send=kill_with_a_filter_call_in_flight)
    role_vars: dict = {"kube_scheduler_extender_url_prefix": proxy.url}
    if ignorable is not None:
        role_vars["kube_scheduler_extender_ignorable"] = ignorable
    config = rendered_scheduler_config(tmp_path / "render", **role_vars)
    ignores_errors = config["extenders"][0]["ignorable"]
    assert ignores_errors is (ignorable is not False)  # the role's default is ignorable: true
    name = f"faults-scheduler-replicas-{str(ignores_errors).lower()}"
    scheduler = control_plane.start_scheduler(
        config, name=name, extra_args=("--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",)
    )
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
        f"after {half} of {BURST} bindings; the proxy dropped {proxy.dropped}, connections per replica "
        f"{proxy.connections}; scheduling attempts {attempts}; filter errors skipped (ignorable) {len(skipped)}, "
        f"attempts failed on the extender {len(failed)}; the pod whose call failed, {victim}, went to {victim_node} "
        f"({'hot' if victim_node in HOT else 'cool'}); pods on hot nodes {len(hot)}"
        f"{': ' + ', '.join(hot) if hot else ''}"
    )
    # Bound once: as many successful attempts (each ends in a binding) as pods, every pod on a node.
    assert len(bindings.bound) == BURST and attempts.get("scheduled") == BURST, attempts
    # After the kill every connection went to the survivor (a connect to the dead one would drop it).
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
