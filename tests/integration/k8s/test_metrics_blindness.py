"""Blindness seen (issue 30): GPUScore in the real gpufleet-scheduler and the extender read a real Prometheus (Debian's
package) through a proxy that answers later than their timeout, so every refresh fails and decisions use no GPU
metrics. Each must say so where operators look: the extender in /readyz, its gauge and a WARNING log line; the plugin
in its scheduler metric, a Warning event on the pod it placed blind and a WARNING log line. The same extender reading
the Prometheus directly is not blind (the signal is about the slowness, not always on)."""

from __future__ import annotations

import httpx
import pytest
from gpufleet_testsupport.controlplane import OPEN_METRICS, needs_assets
from gpufleet_testsupport.dcgm_fleet import FleetPrometheus, SlowPrometheus, make_fleet
from gpufleet_testsupport.extender import start_extender
from gpufleet_testsupport.processes import stop_process
from gpufleet_testsupport.prometheus import PROMETHEUS
from gpufleet_testsupport.scheduling import create_nodes, create_pods, gpu_pod, rendered_scheduler_config
from gpufleet_testsupport.waits import wait_for

pytestmark = [
    pytest.mark.integration,
    needs_assets("gpufleet-scheduler"),
    pytest.mark.skipif(not __import__("os").path.exists(PROMETHEUS), reason=f"no Prometheus at {PROMETHEUS}"),
]

TIMEOUT = 0.5  # seconds the clients wait for Prometheus
DELAY = 3 * TIMEOUT  # what the slow Prometheus takes
RESOURCE = "nvidia.com/mig-1g.10gb"  # finnlp's instances in dcgm_fleet (node-00000)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """A real Prometheus holding a three-node fleet's series, and the slow proxy in front of it."""
    fleet = make_fleet(3, hot_every=0)
    with FleetPrometheus(fleet, tmp_path_factory.mktemp("prometheus"), interval=2) as url:
        slow = SlowPrometheus(url, DELAY)
        yield url, slow.url
        slow.close()


def test_the_extender_shows_blindness_on_readyz_its_gauge_and_log(prometheus, tmp_path):
    direct, slow = prometheus
    env = {
        "METRICS_SOURCE": "prometheus",
        "PROMETHEUS_TIMEOUT_SECONDS": str(TIMEOUT),
        "METRICS_REFRESH_SECONDS": "1",
        "EXPORTER_JOB": "dcgm-exporter",
        "KUBE_API": "off",
    }
    seeing, seeing_url = start_extender(tmp_path, {**env, "PROMETHEUS_URL": direct})
    blind, blind_url = start_extender(tmp_path, {**env, "PROMETHEUS_URL": slow})
    try:
        # Read directly, the series arrive in time: decisions use them.
        ready = wait_for(lambda: (r := httpx.get(f"{seeing_url}/readyz").json())["metrics_blind"] is False and r)
        assert ready["metrics_source_error"] is None
        assert "gpufleet_extender_metrics_blind 0.0" in httpx.get(f"{seeing_url}/metrics").text

        ready = httpx.get(f"{blind_url}/readyz")
        body = ready.json()
        # ON_MISSING_METRICS=allow (the default): still answering, and saying that it places blind.
        assert ready.status_code == 200 and body["on_missing_metrics"] == "allow"
        assert body["metrics_blind"] is True
        assert body["metrics_blind_reason"] == (
            "no GPU metrics loaded; last refresh: Prometheus did not answer both queries within "
            f"PROMETHEUS_TIMEOUT_SECONDS ({TIMEOUT:g}s)"
        )
        assert "gpufleet_extender_metrics_blind 1.0" in httpx.get(f"{blind_url}/metrics").text
    finally:
        stop_process(seeing)
        stop_process(blind)
    logs = {path.name: path.read_text() for path in tmp_path.glob("extender-*.log")}
    warned = [name for name, text in logs.items() if "WARNING gpufleet_extender.service: decisions use no GPU" in text]
    assert len(warned) == 1, logs  # the blind one, not the one that reads its metrics


def test_the_plugin_shows_blindness_in_its_metric_an_event_and_its_log(control_plane, core, prometheus, namespace):
    _, slow = prometheus
    namespace, bindings = namespace
    # The test's Prometheus speaks plain http: the role's explicit opt-out, and a token file of the test's own (this
    # Prometheus ignores it; the role's path exists only in the pod).
    token_file = control_plane.workdir / "blind-prometheus-token"
    token_file.write_text("blind-test-token\n")
    config = rendered_scheduler_config(
        control_plane.workdir / "render-blind",
        kube_scheduler_mode="plugin",
        kube_scheduler_prometheus_allow_http=True,
        kube_scheduler_plugin_extra_args={
            "prometheusURL": slow,
            "prometheusTokenFile": str(token_file),
            "prometheusTimeoutSeconds": TIMEOUT,
            "metricsRefreshSeconds": 1,
        },
    )
    scheduler = config["profiles"][0]["schedulerName"]
    name = control_plane.start_scheduler(
        config,
        binary="gpufleet-scheduler",
        name="gpufleet-scheduler-blind",
        extra_args=OPEN_METRICS,
    )
    try:
        pool = {"gpufleet.test/scheduling": "blind"}
        create_nodes(core, ["blind-a", "blind-b"], {RESOURCE: "7"}, labels=pool)
        pod = gpu_pod("placed-blind", scheduler, {RESOURCE: "1"})
        pod.spec.node_selector = pool
        create_pods(core, namespace, [pod])
        # onMissingMetrics allow: the pod is placed, as a scheduler without GPUScore would place it...
        assert bindings.wait(1, timeout=60), "the pod was not bound"

        # ... and the pod says so.
        def blind_events():
            events = core.list_namespaced_event(namespace, field_selector="reason=GPUMetricsBlind").items
            return [(e.type, e.message, e.involved_object.name) for e in events]

        events = wait_for(blind_events, timeout=30, what="a GPUMetricsBlind event")
        kind, message, regarding = events[0]
        assert kind == "Warning" and regarding == "placed-blind"
        assert message.startswith("GPUScore places GPU pods without GPU metrics (onMissingMetrics allow): no GPU")
        assert f"within prometheusTimeoutSeconds ({TIMEOUT:g}s)" in message

        port = control_plane.ports[name]
        metrics = httpx.get(f"https://127.0.0.1:{port}/metrics", verify=False, timeout=10).text
        assert "scheduler_gpuscore_metrics_blind 1" in metrics
        failures = [line for line in metrics.splitlines() if line.startswith("scheduler_gpuscore_metrics_refresh_fail")]
        assert failures and float(failures[0].split()[-1]) >= 1, failures
    finally:
        control_plane.stop_component(name)
    log = (control_plane.workdir / f"{name}.log").read_text()
    warnings = [line for line in log.splitlines() if line.startswith("W") and "GPUScore: decisions use no GPU" in line]
    assert warnings, log[-3000:]
