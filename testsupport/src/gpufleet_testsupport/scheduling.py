"""Scheduling on the real control plane, shared by the scheduler tests (tests/integration/k8s) and
`make bench-scheduler` (benchmarks/bench_scheduler.py): MIG nodes and pods made in bulk, a dcgm-exporter file
for them, the bundled extender as a process, and the scheduler configuration the kube_scheduler role renders.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import yaml
from kubernetes import client as k8s
from kubernetes import watch

from gpufleet_testsupport.collection import try_render
from gpufleet_testsupport.exposition import DeviceLoad, render_exposition
from gpufleet_testsupport.processes import stop_process
from gpufleet_testsupport.prometheus import Exporter, launch

MIG_PROFILE = "2g.20gb"
MIG_RESOURCE = f"nvidia.com/mig-{MIG_PROFILE}"
WORKERS = 8  # concurrent API requests when creating objects in bulk


def node_status(resources: dict[str, str]) -> dict:
    """A kubelet's status for a Ready node advertising `resources` besides CPU, memory and pods."""
    full = {"cpu": "256", "memory": "2Ti", "pods": "250", **resources}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now}
    return {"status": {"capacity": full, "allocatable": full, "conditions": [{**ready, "lastTransitionTime": now}]}}


def register_node(core: k8s.CoreV1Api, name: str, resources: dict[str, str], labels: dict | None = None) -> None:
    """Register a Ready node (what its kubelet would do). The apiserver taints every new node not-ready; the node
    lifecycle controller, which would lift it, does not run here (no kubelet heartbeats), so this lifts it."""
    core.create_node(k8s.V1Node(metadata=k8s.V1ObjectMeta(name=name, labels=labels)))
    core.patch_node_status(name, node_status(resources))
    core.patch_node(name, {"spec": {"taints": None}})


def create_nodes(core: k8s.CoreV1Api, names: list[str], resources: dict[str, str], labels: dict | None = None) -> None:
    """Register Ready nodes in bulk."""

    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(lambda name: register_node(core, name, resources, labels), names))


def gpu_pod(name: str, scheduler: str, resources: dict[str, str]) -> k8s.V1Pod:
    container = k8s.V1Container(
        name="main", image="registry.invalid/cuda:12", resources=k8s.V1ResourceRequirements(limits=resources)
    )
    spec = k8s.V1PodSpec(scheduler_name=scheduler, containers=[container], automount_service_account_token=False)
    return k8s.V1Pod(metadata=k8s.V1ObjectMeta(name=name), spec=spec)


def create_pods(core: k8s.CoreV1Api, namespace: str, pods: list[k8s.V1Pod]) -> None:
    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(lambda pod: core.create_namespaced_pod(namespace, pod), pods))


def create_mig_pods(core: k8s.CoreV1Api, namespace: str, count: int, node_selector: dict[str, str]) -> None:
    """`count` pods mig-0.. of one MIG_RESOURCE each for gpufleet-scheduler, kept to `node_selector`'s nodes."""
    pods = [gpu_pod(f"mig-{i}", "gpufleet-scheduler", {MIG_RESOURCE: "1"}) for i in range(count)]
    for pod in pods:
        pod.spec.node_selector = node_selector
    create_pods(core, namespace, pods)


def failed_scheduling(core: k8s.CoreV1Api, namespace: str) -> list[str]:
    """The messages of the namespace's FailedScheduling events."""
    return [e.message for e in core.list_namespaced_event(namespace, field_selector="reason=FailedScheduling").items]


class BindingWatch:
    """Counts the namespace's pods as they are bound (a watch, so that measuring costs the apiserver little);
    remembers when each binding was seen and where."""

    def __init__(self, core: k8s.CoreV1Api, namespace: str):
        self.core, self.namespace = core, namespace
        self.bound: dict[str, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._changed = threading.Condition()
        version = core.list_namespaced_pod(namespace, limit=1).metadata.resource_version
        self._thread = threading.Thread(target=self._run, args=(version,), daemon=True)
        self._thread.start()

    def _run(self, version: str) -> None:
        stream = watch.Watch()
        while not self._stop.is_set():
            try:
                for event in stream.stream(
                    self.core.list_namespaced_pod, self.namespace, resource_version=version, timeout_seconds=1
                ):
                    pod = event["object"]
                    version = pod.metadata.resource_version
                    self._seen(pod)
                    if self._stop.is_set():
                        stream.stop()
            except Exception:  # the apiserver went away (a restart): list again once it is back, then watch on
                time.sleep(0.5)
                with contextlib.suppress(Exception):
                    listed = self.core.list_namespaced_pod(self.namespace)
                    for pod in listed.items:
                        self._seen(pod)
                    version = listed.metadata.resource_version

    def _seen(self, pod) -> None:
        if pod.spec.node_name and pod.metadata.name not in self.bound:
            with self._changed:
                self.bound[pod.metadata.name] = (pod.spec.node_name, time.monotonic())
                self._changed.notify_all()

    def wait(self, count: int, timeout: float) -> bool:
        """Wait until `count` pods are bound; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self.bound) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 1))
        return True

    def rate(self) -> float:
        """Pods bound per second, from the first binding to the last (scheduler start-up excluded)."""
        times = sorted(seen for _, seen in self.bound.values())
        return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def mig_devices(loads: dict[str, list[float]], profile: str = MIG_PROFILE) -> dict[str, list[DeviceLoad]]:
    """Per node, one MIG instance of `profile` per utilisation given, spread 3 per GPU."""
    memory_total = float(int(profile.split("g.")[1].removesuffix("gb")) * 1024)
    return {
        node: [
            DeviceLoad(index // 3, util, util * memory_total, memory_total, profile, index % 3 + 1)
            for index, util in enumerate(utils)
        ]
        for node, utils in loads.items()
    }


def write_mig_metrics(path: Path, loads: dict[str, list[float]], profile: str = MIG_PROFILE) -> Path:
    """A dcgm-exporter file of `loads` (mig_devices)."""
    path.write_text(render_exposition(mig_devices(loads, profile), host_label="Hostname"))
    return path


class MetricsEndpoint:
    """Serves a dcgm-exporter file at http://127.0.0.1:<port>/metrics, as the exporter would, and a real Prometheus
    (Debian's package) scraping it every 10 s: what the GPUScore plugin queries. The data is static, and a
    shorter interval over thousands of nodes would make Prometheus, not the plugin, what the 2 cores run."""

    def __init__(self, metrics_file: Path, workdir: Path, prometheus: str = "/usr/bin/prometheus"):
        self.metrics_file, self.workdir, self.prometheus_binary = metrics_file, workdir, prometheus
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> str:
        path = self.metrics_file
        self.exporter = Exporter(lambda _path: path.read_text())
        self.process, url = launch(
            self.workdir,
            "global: {scrape_interval: 10s, scrape_timeout: 10s}\n"
            "scrape_configs:\n  - job_name: dcgm-exporter\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{self.exporter.port}']}}]\n",
            binary=self.prometheus_binary,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                answer = httpx.get(f"{url}/api/v1/query", params={"query": "count(DCGM_FI_PROF_GR_ENGINE_ACTIVE)"})
                if answer.status_code == 200 and answer.json()["data"]["result"]:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(f"Prometheus did not scrape the metrics in 120 s: see {self.workdir / 'prometheus.log'}")

    def __exit__(self, *exc) -> None:
        if self.process:
            stop_process(self.process)
        self.exporter.close()


def rendered_scheduler_config(tmp_path: Path, **role_vars) -> dict:
    """The KubeSchedulerConfiguration the kube_scheduler role renders in secondary mode for the lab inventory,
    with `role_vars` (e.g. kube_scheduler_extender_url_prefix, kube_scheduler_extender_ignorable)."""
    extra = {"kube_scheduler_mode": "secondary", **role_vars}
    result, manifests = try_render(["gpufleet.mig.kube_scheduler"], tmp_path, extra_vars=extra)
    if result.returncode != 0:
        raise RuntimeError(f"rendering the scheduler configuration failed:\n{result.stdout[-4000:]}")
    return yaml.safe_load((manifests / "kube_scheduler" / "scheduler-config.yaml").read_text())
