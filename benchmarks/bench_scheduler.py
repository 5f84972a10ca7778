#!/usr/bin/env python3
"""What the GPU-load-aware extender costs the real kube-scheduler: pods bound per second without it, with it
(in production mode: KUBE_API on, so in-flight accounting and tenant pools watch the real apiserver), and with the
GPUScore plugin in gpufleet-scheduler when that binary is there (reading a real Prometheus, Debian's package,
that scrapes the same dcgm-exporter data the extender reads from its file), side by side in one run.

    python3 benchmarks/bench_scheduler.py [--nodes 1000] [--pods 1000] [--modes bare,extender,plugin]
    make bench-scheduler [NODES=1000] [PODS=1000]

One control plane (etcd, kube-apiserver from KUBE_ASSETS, default build/k8s/bin: `make k8s-assets`) holds N nodes,
each advertising 24 x nvidia.com/mig-2g.20gb (8 GPUs x 3 instances), with a dcgm-exporter file of random loads
for the extender. For each mode, P pods (one instance each) are created first, then a scheduler of that mode is
started with the configuration the kube_scheduler role renders (nodeCacheCapable, weight 3, client qps/burst 5000);
the rate is counted from the first binding to the last, so start-up and informer sync are not in it. The pods are
then deleted and the next mode starts from the same empty fleet. The extender's own handler time per verb (its
/metrics histogram: request body in hand to answer encoded) is printed beside.

Prints figures only: no goal is asserted (run it on a quiet machine; one run per figure in the notes).
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "extender" / "tests"))  # exposition.py: dcgm-exporter text, as the tests fake it

import httpx  # noqa: E402
from controlplane import ControlPlane, assets_dir, missing_assets  # noqa: E402
from kubernetes import client as k8s  # noqa: E402
from kubernetes import config as k8s_config  # noqa: E402
from scheduling import (  # noqa: E402
    MIG_RESOURCE,
    BindingWatch,
    MetricsEndpoint,
    create_nodes,
    create_pods,
    gpu_pod,
    rendered_scheduler_config,
    start_extender,
    stop_process,
    write_mig_metrics,
)

INSTANCES_PER_NODE = 24
MODES = ("bare", "extender", "plugin")


def scheduler_config(
    mode: str, workdir: Path, extender_url: str | None, prometheus_url: str | None
) -> tuple[dict, str]:
    """(KubeSchedulerConfiguration, binary) for a mode; its one profile is named bench-<mode>."""
    if mode == "bare":
        config = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration"}
        binary = "kube-scheduler"
    elif mode == "extender":
        config = rendered_scheduler_config(workdir / "render-extender", kube_scheduler_extender_url_prefix=extender_url)
        binary = "kube-scheduler"
    else:
        config = rendered_scheduler_config(
            workdir / "render-plugin", kube_scheduler_mode="plugin", gpu_extender_prometheus_url=prometheus_url
        )
        binary = "gpufleet-scheduler"
    config.setdefault("profiles", [{}])[0]["schedulerName"] = f"bench-{mode}"
    return config, binary


def handler_times(url: str) -> dict[str, tuple[int, float]]:
    """Per verb: (requests, seconds in total) from the extender's request-duration histogram."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    figures: dict[str, list[float]] = {}
    pattern = r'^gpufleet_extender_request_duration_seconds_(count|sum)\{verb="([^"]+)"\} (\S+)$'
    for field, verb, value in re.findall(pattern, text, re.MULTILINE):
        figures.setdefault(verb, [0, 0.0])
        figures[verb][0 if field == "count" else 1] = float(value)
    return {verb: (int(count), total) for verb, (count, total) in figures.items()}


def print_handler_times(before: dict, after: dict) -> None:
    for verb, (count, total) in sorted(after.items()):
        calls = count - before.get(verb, (0, 0.0))[0]
        spent = total - before.get(verb, (0, 0.0))[1]
        if calls:
            print(f"  extender  {verb:10s} {calls:>6} calls, mean handler time {spent / calls * 1000:.3f} ms")


def run_mode(plane, core, mode: str, pods: int, workdir: Path, urls: dict[str, str | None]) -> float:
    namespace = f"bench-{mode}"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
    # The default ServiceAccount is created by the controller-manager, which does not run here.
    core.create_namespaced_service_account(namespace, k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name="default")))
    create_pods(core, namespace, [gpu_pod(f"p{i}", f"bench-{mode}", {MIG_RESOURCE: "1"}) for i in range(pods)])
    bindings = BindingWatch(core, namespace)
    config, binary = scheduler_config(mode, workdir, urls.get("extender"), urls.get("prometheus"))
    name = plane.start_scheduler(config, binary=binary, name=f"scheduler-{mode}")
    started = time.monotonic()
    complete = bindings.wait(pods, timeout=max(120, pods))
    plane.stop_component(name)
    bindings.stop()
    rate = bindings.rate()
    spent = time.monotonic() - started
    print(f"  {mode:9s} {len(bindings.bound):>5}/{pods} pods bound, {rate:7.1f} pods/s ({spent:.1f} s from start)")
    if not complete:
        print(f"  {mode:9s} did not bind every pod: see {plane.workdir / (name + '.log')}")
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    return rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated: bare, extender, plugin")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if unknown := set(modes) - set(MODES):
        parser.error(f"unknown modes: {', '.join(sorted(unknown))}")

    if missing := missing_assets(("etcd", "kube-apiserver", "kube-scheduler")):
        print(f"bench-scheduler: no control-plane binaries in {assets_dir()} ({', '.join(missing)} missing):")
        print("  run `make k8s-assets` first, or point KUBE_ASSETS at a directory that holds them. Nothing measured.")
        return 0
    if "plugin" in modes and missing_assets(("gpufleet-scheduler",)):
        print(f"bench-scheduler: no gpufleet-scheduler in {assets_dir()}: the plugin mode is left out.")
        modes.remove("plugin")

    rng = random.Random(args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="gpufleet-bench-scheduler-"))
    print(f"bench-scheduler: {args.nodes} nodes x {INSTANCES_PER_NODE} {MIG_RESOURCE}, {args.pods} pods per mode")
    with ControlPlane(workdir / "controlplane") as plane:
        api = k8s_config.new_client_from_config(config_file=str(plane.kubeconfig))
        core = k8s.CoreV1Api(api)
        names = [f"node-{i:05d}" for i in range(args.nodes)]
        began = time.monotonic()
        create_nodes(core, names, {MIG_RESOURCE: str(INSTANCES_PER_NODE)})
        print(f"  {args.nodes} nodes registered in {time.monotonic() - began:.1f} s")
        loads = {name: [round(rng.uniform(0.0, 0.9), 3) for _ in range(INSTANCES_PER_NODE)] for name in names}
        metrics = write_mig_metrics(workdir / "dcgm.prom", loads)

        extender = url = None
        prometheus = MetricsEndpoint(metrics, workdir) if "plugin" in modes else None
        if prometheus and not Path(prometheus.prometheus_binary).exists():
            print("bench-scheduler: no Prometheus (Debian package 'prometheus') for the plugin: plugin mode left out.")
            modes.remove("plugin")
            prometheus = None
        if "extender" in modes:
            env = {
                "METRICS_SOURCE": "file",
                "METRICS_FILE": str(metrics),
                "KUBE_API": "kubeconfig",  # production mode: in-flight accounting and tenant pools from the API
                "KUBECONFIG": str(plane.kubeconfig),
            }
            extender, url = start_extender(workdir, env)
        try:
            prometheus_url = prometheus.__enter__() if prometheus else None
            rates = {}
            for mode in modes:
                before = handler_times(url) if mode == "extender" else {}
                urls = {"extender": url, "prometheus": prometheus_url}
                rates[mode] = run_mode(plane, core, mode, args.pods, workdir, urls)
                if mode == "extender":
                    print_handler_times(before, handler_times(url))
        finally:
            if extender:
                stop_process(extender)
            if prometheus:
                prometheus.__exit__()
    if rates.get("bare"):
        for mode in ("extender", "plugin"):
            if rates.get(mode):
                print(f"  ratio {mode} / bare: {rates[mode] / rates['bare']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
