#!/usr/bin/env python3
"""What GPU-load awareness costs the real kube-scheduler, counted only where decisions use the load: pods bound per
second without it (bare), with the extender (in production mode: METRICS_SOURCE=prometheus, KUBE_API on) and with
the GPUScore plugin in gpufleet-scheduler when that binary is there, side by side in one run. Both load-aware paths
read one real Prometheus (Debian's package) scraping a fleet's dcgm-exporter series as a real exporter publishes them
(gpufleet_testsupport.dcgm_fleet: the Hong Kong pools' layouts in turn, the full label set, both host label
spellings), with every tenth node hot (every instance at 0.95, above the 0.8 threshold).

    python3 benchmarks/bench_scheduler.py [--nodes 1000] [--pods 1000] [--modes bare,extender,plugin,bare]
        [--metrics pull|push] [--sender prometheus|rw-sender]
    make bench-scheduler [NODES=1000] [PODS=1000]

One control plane (etcd, kube-apiserver from KUBE_ASSETS, default build/k8s/bin: `make k8s-assets`) holds N nodes,
each advertising its pool's devices (finnlp 56 x mig-1g.10gb, imagegen 8 x mig-3g.40gb + 12 x mig-2g.20gb +
4 x mig-1g.10gb, llm 8 x gpu). For each mode, P pods (one mig-1g.10gb each) are created first, then a scheduler of
that mode is started with the configuration the kube_scheduler role renders (its defaults: prometheusTimeoutSeconds
and PROMETHEUS_TIMEOUT_SECONDS 2 s unless --prometheus-timeout; both paths query the dcgm series); the
rate is counted from the first binding to the last, so start-up and informer sync are not in it. The pods are then
deleted and the next mode starts from the same empty fleet. A mode may be given more than once (bare before and
after, the default).

With --metrics push, Prometheus answers no query: it sends the extender's and GPUScore's
receivers the four dcgm series as it scrapes them (the entries `gpufleet-extender remote-write-config` writes).
With --sender rw-sender, where a real Prometheus cannot scrape the fleet beside the control plane (5,000 nodes on a
small machine), `gpufleet-rw-sender` (k8s/cmd, built here with `go build`) stands in for it: one per receiver, it
sends the same exporter text every scrape interval, with the scrape's target labels and filtered as those entries
filter it, over the same protocol and at the same pace. Prometheus' own part is measured apart
(benchmarks/bench_prometheus_push.py). Pushed, two scrape intervals pass before the first mode: a sender's start
and a receiver's first samples cost more than an interval at pace, and would fall on the first mode only.

Each mode prints the pods it bound to hot nodes. A load-aware mode that binds any there placed without its metrics
(or ignored them): it is reported as BLIND, and no throughput ratio is printed for it. Its blindness signal
(the extender's /readyz metrics_blind, the plugin's scheduler_gpuscore_metrics_blind) is printed beside.

Beside each mode, the CPU the machine spent per pod bound, by process (from the scheduler's start to the last
binding: its start-up and informer sync are in it), the five largest: what the load-aware paths add, measured
with less noise than the rate on a shared machine.

Prints figures only: no goal is asserted (run it on a quiet machine; one run per figure in the notes).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml
from gpufleet_extender.push_config import PushTarget, kept_labels, remote_write
from gpufleet_testsupport.controlplane import (
    OPEN_METRICS,
    ControlPlane,
    ControlPlaneError,
    assets_dir,
    missing_assets,
)
from gpufleet_testsupport.dcgm_fleet import EXPORTER_NAMESPACE, LAYOUTS, FleetPrometheus, make_fleet
from gpufleet_testsupport.extender import start_extender
from gpufleet_testsupport.ports import free_port
from gpufleet_testsupport.processes import stop_process
from gpufleet_testsupport.scheduling import BindingWatch, create_nodes, create_pods, gpu_pod, rendered_scheduler_config
from kubernetes import client as k8s
from kubernetes import config as k8s_config

REPO = Path(__file__).resolve().parents[1]

POD_RESOURCE = "nvidia.com/mig-1g.10gb"
ROLE_DEFAULTS = yaml.safe_load((REPO / "roles" / "gpu_extender" / "defaults" / "main.yml").read_text())
MODES = ("bare", "extender", "plugin")


def pool_resources(pool: str) -> dict[str, str]:
    """What a node of `pool` advertises: one device per instance of its layout (a whole GPU without MIG)."""
    counts: dict[str, int] = {}
    for profiles in LAYOUTS[pool]:
        for resource in ["nvidia.com/gpu"] if profiles is None else [f"nvidia.com/mig-{p}" for p in profiles]:
            counts[resource] = counts.get(resource, 0) + 1
    return {resource: str(count) for resource, count in counts.items()}


def scheduler_config(
    mode: str,
    workdir: Path,
    urls: dict[str, str | None],
    timeout: float | None,
    push: dict[str, str] | None = None,
) -> tuple[dict, str]:
    """(KubeSchedulerConfiguration, binary) for a mode; its one profile is named bench-<mode>."""
    if mode == "bare":
        config = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration"}
        binary = "kube-scheduler"
    elif mode == "extender":
        config = rendered_scheduler_config(
            workdir / "render-extender", kube_scheduler_extender_url_prefix=urls["extender"]
        )
        binary = "kube-scheduler"
    else:
        # The benchmark's Prometheus speaks plain http without auth: the role's explicit opt-out, and a token file
        # here (the role's path exists only in the pod; this Prometheus ignores the token).
        token_file = workdir / "prometheus-token"
        token_file.write_text("bench-token\n")
        extra = {
            "gpu_extender_prometheus_url": urls["prometheus"],
            "kube_scheduler_prometheus_allow_http": True,
            "kube_scheduler_plugin_extra_args": {"prometheusTokenFile": str(token_file)},
        }
        if timeout is not None:
            extra["gpu_extender_prometheus_timeout_seconds"] = timeout
        if push:
            # Pushed: the role's push args, its receiver on this machine over plain http (no mounted pair here).
            extra["gpufleet_metrics_source"] = "push"
            extra["kube_scheduler_plugin_extra_args"] = {
                **extra["kube_scheduler_plugin_extra_args"],
                "remoteWriteAddress": push["plugin"],
                "remoteWriteTokenFile": push["token"],
                "remoteWriteCertFile": "",
                "remoteWriteKeyFile": "",
            }
        config = rendered_scheduler_config(workdir / "render-plugin", kube_scheduler_mode="plugin", **extra)
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


def extender_blindness(url: str) -> str:
    body = httpx.get(f"{url}/readyz", timeout=10).json()
    if body["metrics_blind"]:
        return f"blind: {body['metrics_blind_reason']}"
    return f"metrics in use, {body['metrics_stale_nodes']} nodes stale"


def plugin_blindness(port: int) -> str:
    text = httpx.get(f"https://127.0.0.1:{port}/metrics", verify=False, timeout=10).text
    blind = re.search(r"^scheduler_gpuscore_metrics_blind (\S+)$", text, re.MULTILINE)
    failures = re.search(r"^scheduler_gpuscore_metrics_refresh_failures_total (\S+)$", text, re.MULTILINE)
    stale = re.search(r"^scheduler_gpuscore_metrics_stale_nodes (\S+)$", text, re.MULTILINE)
    failed = f", {float(failures.group(1)):.0f} failed refreshes" if failures else ""
    failed += f", {float(stale.group(1)):.0f} nodes stale" if stale else ""
    if blind is None:
        return "no scheduler_gpuscore_metrics_blind metric"
    return ("blind" if float(blind.group(1)) else "metrics in use") + failed


def cpu_by_command() -> dict[str, float]:
    """CPU seconds used so far by every user process on the machine, summed per command name (/proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    used: dict[str, float] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if not Path(f"/proc/{pid}/cmdline").read_bytes():
                continue  # a kernel thread: its name changes with its work, so its sums mean nothing
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:  # gone since listed
            continue
        command = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        used[command] = used.get(command, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return used


def cpu_per_pod(before: dict[str, float], after: dict[str, float], pods: int) -> str:
    """Where the machine's CPU went while a mode ran, per pod bound: the five largest consumers."""
    spent = {command: after[command] - before.get(command, 0.0) for command in after}
    top = sorted(((seconds, command) for command, seconds in spent.items() if seconds > 0), reverse=True)[:5]
    return ", ".join(f"{command} {1000 * seconds / max(pods, 1):.1f}" for seconds, command in top)


SCRAPE_INTERVAL = 10  # seconds: the benchmark's Prometheus (the roles: 15 s), and the stand-in sender's pace
RECEIVERS = ("extender", "plugin")


def sender_log(workdir: Path, who: str) -> Path:
    """The log of the stand-in sender to `who`'s receiver: a line "interval N: ..." per interval sent."""
    return workdir / f"rw-sender-{who}.log"


def start_senders(fleet, workdir: Path, push: dict[str, str]) -> list[subprocess.Popen]:
    """One gpufleet-rw-sender per receiver (the extender's, GPUScore's), sending `fleet`'s exporter text every
    SCRAPE_INTERVAL as Prometheus would with the roles' remote-write entries; built from k8s/cmd with go."""
    go = shutil.which("go")
    if go is None:
        raise SystemExit("bench-scheduler: --sender rw-sender needs Go to build gpufleet-rw-sender (k8s/cmd)")
    binary = workdir / "gpufleet-rw-sender"
    subprocess.run([go, "build", "-o", str(binary), "./cmd/gpufleet-rw-sender"], cwd=REPO / "k8s", check=True)
    shards = []
    for k, text in enumerate(fleet.shards):  # one scrape target per shard, as FleetPrometheus scrapes them
        shard = workdir / f"exposition-{k}.txt"
        shard.write_bytes(text)
        shards.append(str(shard))
    senders = []
    for who in RECEIVERS:
        log = sender_log(workdir, who).open("w")
        senders.append(
            subprocess.Popen(
                [
                    str(binary),
                    f"-url=http://{push[who]}/api/v1/write",
                    f"-token-file={push['token']}",
                    f"-exposition={','.join(shards)}",
                    f"-keep-labels={','.join(kept_labels(('Hostname', 'hostname')))}",
                    "-job=dcgm-exporter",
                    f"-namespace={EXPORTER_NAMESPACE}",
                    f"-interval={SCRAPE_INTERVAL}s",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    return senders


def sent_intervals(workdir: Path) -> int:
    """The fewest intervals any sender has sent so far."""
    return min(sender_log(workdir, who).read_text(errors="replace").count("\ninterval ") for who in RECEIVERS)


def warm_up(workdir: Path, senders: list[subprocess.Popen], prometheus_sends: bool) -> None:
    """Two intervals pass before the first mode when something pushes: a sender's start (reading the exposition) and
    a receiver's first samples cost more than an interval at pace, and would otherwise fall on the first mode
    measured only."""
    if prometheus_sends:  # a real Prometheus: its first sends to the receivers
        time.sleep(2 * SCRAPE_INTERVAL)
    if not senders:
        return
    wanted, deadline = sent_intervals(workdir) + 2, time.monotonic() + 6 * SCRAPE_INTERVAL
    while sent_intervals(workdir) < wanted and time.monotonic() < deadline:
        time.sleep(0.5)


def run_mode(
    plane, core, mode: str, run: int, args, workdir: Path, urls: dict, hot: set[str]
) -> tuple[float, int] | None:
    """(pods/s, pods bound to hot nodes) of one run of `mode`; None when its scheduler did not start."""
    namespace = f"bench-{mode}-{run}"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
    # The default ServiceAccount is created by the controller-manager, which does not run here.
    core.create_namespaced_service_account(namespace, k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name="default")))
    pods = args.pods
    create_pods(core, namespace, [gpu_pod(f"p{i}", f"bench-{mode}", {POD_RESOURCE: "1"}) for i in range(pods)])
    bindings = BindingWatch(core, namespace)
    config, binary = scheduler_config(
        mode,
        workdir,
        urls,
        args.prometheus_timeout,
        urls.get("push"),  # type: ignore[arg-type]
    )
    name = f"scheduler-{mode}-{run}"
    extra = OPEN_METRICS if mode == "plugin" else ()
    # GPUScore refreshes its metrics once before it serves (pushed: waits up to 30 s for the first samples).
    ready_timeout = (
        60 + (args.prometheus_timeout or 0) + (30 if args.metrics == "push" else 0) if mode == "plugin" else 60
    )
    try:
        name = plane.start_scheduler(config, binary=binary, name=name, extra_args=extra, ready_timeout=ready_timeout)
    except ControlPlaneError as error:
        print(f"  {mode:9s} its scheduler did not start, nothing measured: {error}")
        bindings.stop()
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        return None
    started, cpu_before = time.monotonic(), cpu_by_command()
    complete = bindings.wait(pods, timeout=max(120, pods))
    cpu_after = cpu_by_command()
    signal = ""
    if mode == "extender":
        signal = extender_blindness(urls["extender"])
    elif mode == "plugin":
        signal = plugin_blindness(plane.ports[name])
    plane.stop_component(name)
    bindings.stop()
    rate = bindings.rate()
    spent = time.monotonic() - started
    on_hot = sum(1 for node, _ in bindings.bound.values() if node in hot)
    print(
        f"  {mode:9s} {len(bindings.bound):>5}/{pods} pods bound, {rate:7.1f} pods/s ({spent:.1f} s from start), "
        f"{on_hot} on hot nodes{'; ' + signal if signal else ''}; load average {os.getloadavg()[0]:.1f}"
    )
    print(f"  {mode:9s} CPU ms per pod bound: {cpu_per_pod(cpu_before, cpu_after, len(bindings.bound))}")
    if not complete:
        print(f"  {mode:9s} did not bind every pod: see {plane.workdir / (name + '.log')}")
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    return rate, on_hot


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--modes", default="bare,extender,plugin,bare", help="comma-separated: bare, extender, plugin")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--prometheus-timeout", type=float, default=None, help="seconds (default: the roles' default, 2)"
    )
    parser.add_argument(
        "--metrics",
        choices=("pull", "push"),
        default="pull",
        help="how both paths get the load: queried from Prometheus (pull) or sent by its remote write (push)",
    )
    parser.add_argument(
        "--sender",
        choices=("prometheus", "rw-sender"),
        default="prometheus",
        help="with --metrics push: a real Prometheus scraping the fleet, or gpufleet-rw-sender standing in for it",
    )
    args = parser.parse_args()
    if args.sender == "rw-sender" and args.metrics != "push":
        parser.error("--sender rw-sender sends pushed metrics: give --metrics push")
    modes = [m for m in args.modes.split(",") if m]
    if unknown := set(modes) - set(MODES):
        parser.error(f"unknown modes: {', '.join(sorted(unknown))}")

    if missing := missing_assets(("etcd", "kube-apiserver", "kube-scheduler")):
        print(f"bench-scheduler: no control-plane binaries in {assets_dir()} ({', '.join(missing)} missing):")
        print("  run `make k8s-assets` first, or point KUBE_ASSETS at a directory that holds them. Nothing measured.")
        return 0
    if "plugin" in modes and missing_assets(("gpufleet-scheduler",)):
        print(f"bench-scheduler: no gpufleet-scheduler in {assets_dir()}: the plugin mode is left out.")
        modes = [m for m in modes if m != "plugin"]
    stand_in = args.sender == "rw-sender"
    if {"extender", "plugin"} & set(modes) and not stand_in and not Path("/usr/bin/prometheus").exists():
        print("bench-scheduler: no Prometheus (Debian package 'prometheus'): the load-aware modes are left out.")
        modes = [m for m in modes if m == "bare"]

    fleet = make_fleet(args.nodes, hot_every=10, seed=args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="gpufleet-bench-scheduler-"))
    print(
        f"bench-scheduler: {args.nodes} nodes (Hong Kong layouts, {len(fleet.hot)} hot), {fleet.series} exporter "
        f"series, {args.pods} pods of {POD_RESOURCE} per mode; load average {os.getloadavg()[0]:.1f}"
    )
    rates: dict[str, list[float]] = {}
    blind: dict[str, int] = {}
    with ControlPlane(workdir / "controlplane") as plane:
        api = k8s_config.new_client_from_config(config_file=str(plane.kubeconfig))
        core = k8s.CoreV1Api(api)
        began = time.monotonic()
        for pool in LAYOUTS:
            create_nodes(core, [n for n in fleet.nodes if fleet.pools[n] == pool], pool_resources(pool))
        print(f"  {args.nodes} nodes registered in {time.monotonic() - began:.1f} s")

        extender = None
        urls: dict[str, str | None] = {"extender": None, "prometheus": None}
        # Scraped every 10 s (the roles: 15 s), within the roles' 60 s METRICS_MAX_AGE_SECONDS.
        entries = None
        if args.metrics == "push":
            # Pushed: Prometheus sends each receiver (the extender's, GPUScore's) the four dcgm series.
            token = workdir / "remote-write-token"
            token.write_text("bench-token\n")
            urls["push"] = {"extender": f"127.0.0.1:{free_port()}", "plugin": f"127.0.0.1:{free_port()}"}
            urls["push"]["token"] = str(token)
            targets = [
                PushTarget(f"http://{urls['push'][who]}/api/v1/write", token_file=str(token)) for who in RECEIVERS
            ]
            entries = remote_write(targets, ("Hostname", "hostname"), "dcgm-exporter", EXPORTER_NAMESPACE)
        prometheus_runs = bool(set(modes) - {"bare"}) and not stand_in
        scraping = (
            FleetPrometheus(fleet, workdir, interval=SCRAPE_INTERVAL, remote_write=entries)
            if prometheus_runs
            else contextlib.nullcontext("http://127.0.0.1:1")  # the stand-in sender: no Prometheus to query
        )
        senders: list[subprocess.Popen] = []
        with scraping as prometheus_url:
            urls["prometheus"] = prometheus_url
            if stand_in and set(modes) - {"bare"}:
                senders = start_senders(fleet, workdir, urls["push"])  # type: ignore[arg-type]
                print(f"  gpufleet-rw-sender x {len(senders)} sending every {SCRAPE_INTERVAL} s (logs in {workdir})")
            try:
                if "extender" in modes:
                    env = {
                        "METRICS_SOURCE": "prometheus",
                        "PROMETHEUS_URL": prometheus_url,
                        "EXPORTER_JOB": "dcgm-exporter",  # pinned as the gpu_extender role pins them
                        "EXPORTER_NAMESPACE": EXPORTER_NAMESPACE,
                        "KUBE_API": "kubeconfig",  # production mode: in-flight accounting and tenant pools
                        "KUBECONFIG": str(plane.kubeconfig),
                        # As the gpu_extender role sets it (the plugin's config is the role's rendering).
                        "METRICS_MAX_AGE_SECONDS": str(ROLE_DEFAULTS["gpu_extender_metrics_max_age_seconds"]),
                    }
                    if args.prometheus_timeout is not None:
                        env["PROMETHEUS_TIMEOUT_SECONDS"] = str(args.prometheus_timeout)
                    if args.metrics == "push":
                        env["METRICS_SOURCE"] = "push"
                        env["REMOTE_WRITE_ADDRESS"] = urls["push"]["extender"]  # type: ignore[index]
                        env["REMOTE_WRITE_TOKEN_FILE"] = urls["push"]["token"]  # type: ignore[index]
                    extender, urls["extender"] = start_extender(workdir, env)
                warm_up(workdir, senders, prometheus_sends=prometheus_runs and entries is not None)
                for run, mode in enumerate(modes):
                    before = handler_times(urls["extender"]) if mode == "extender" else {}
                    measured = run_mode(plane, core, mode, run, args, workdir, urls, fleet.hot)
                    if measured is None:
                        continue
                    rate, on_hot = measured
                    rates.setdefault(mode, []).append(rate)
                    blind[mode] = blind.get(mode, 0) + on_hot
                    if mode == "extender":
                        print_handler_times(before, handler_times(urls["extender"]))
            finally:
                if extender:
                    stop_process(extender)
                for sender in senders:
                    stop_process(sender)
    bare = statistics.mean(rates["bare"]) if rates.get("bare") else 0.0
    for mode in ("extender", "plugin"):
        if mode not in rates:
            continue
        if blind[mode]:
            print(f"  {mode}: BLIND ({blind[mode]} pods on hot nodes): its throughput does not count")
        elif bare:
            print(f"  ratio {mode} / bare: {statistics.mean(rates[mode]) / bare:.2f} (0 pods on hot nodes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
