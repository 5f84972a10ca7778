"""Benchmark of METRICS_SOURCE=push against the pull form: the receiver's CPU per sample and per scrape interval.

    .venv/bin/python extender/benchmarks/bench_remote_write.py                  # 1,000 and 5,000 nodes, a few minutes
    .venv/bin/python extender/benchmarks/bench_remote_write.py --nodes 1000 --instances 7 --batches 2000
    .venv/bin/python extender/benchmarks/bench_remote_write.py --nodes '' --http 5000x7x2000    # over HTTP only

A fleet of nodes x 8 H100 split into 3 (3g.40gb + 2 x 2g.20gb) or 7 (1g.10gb) MIG instances, 3 series per
instance (GR_ENGINE_ACTIVE, FB_USED, FB_FREE) with dcgm-exporter's labels and the scrape's target labels (job,
instance, namespace, ...): one scrape interval of the whole fleet, sent in WriteRequests of 2,000 or 10,000
samples (Prometheus' max_samples_per_send), snappy-compressed as Prometheus sends them.

Measured with the process' CPU time (time.process_time), the receiver in this process without HTTP:
- receive: snappy, decoding, the store (Receiver.process on every request body of the interval), the first
  interval (every series new: the label cache learns them) and the steady state (the same series again; equal
  timestamps take the path of newer ones), after gc.freeze() as the app calls it after each new snapshot;
- build: PushSource.fetch after the interval, every device with a new sample (the fold of every device and the
  making of every node: what the refreshes of one interval cost together);
- runtime decode: the protobuf runtime's parse of the same requests plus reading every label into a dict, the
  least the decoder that does not know its series would pay (the reason for the fast path);
- pull: the pull form's refresh on a canned Prometheus answer of the same fleet (PROMETHEUS_QUERY=raw: one series
  per metric and device with the labels the decision reads, one sample time per node): PrometheusSource's JSON
  decode and build, as each refresh pays it.
Over HTTP (--http): gpufleet-extender serve itself in a process of its own, fed on 127.0.0.1 by this one, a first
interval of cold devices and then one of hot devices, the server's CPU for the second (HTTP, receive, every
refresh's fold) and the delay from its last request answered to the snapshot holding every sample sent.
% of one core is per scrape interval (--interval, 15 s). A figure is printed only when the snapshot after the run
holds every device of the fleet (over HTTP: with its new sample, every node refused by /filter as hot).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cramjam
from gpufleet_testsupport.exposition import DeviceLoad, write_series

from gpufleet_extender.metrics_source import DECISION_LABELS, PrometheusSource
from gpufleet_extender.remote_write import (
    PushSource,
    Receiver,
    SampleStore,
    TokenFile,
    WriteRequest,
    series_field,
    write_request_body,
)

NODE_LABELS = ("Hostname", "hostname")
LAYOUTS = {3: (("3g.40gb", 40960), ("2g.20gb", 20480), ("2g.20gb", 20480)), 7: (("1g.10gb", 10240),) * 7}


HOT = 0.9  # GPU_UTIL_THRESHOLD of the run over HTTP: the second interval's devices are all above it


def fleet(nodes: int, instances: int, hot: bool = False) -> Iterator[tuple[str, list[DeviceLoad]]]:
    """Nodes of 8 H100 each split into ``instances`` MIG instances, with made-up but valid loads: 0-0.49, or with
    ``hot`` 0.95-0.99 (every device above HOT, and every value other than the cold one)."""
    for index in range(nodes):
        devices = []
        for gpu in range(8):
            for slot, (profile, size) in enumerate(LAYOUTS[instances]):
                spread = index * 7 + gpu * 3 + slot
                util = 0.95 + (spread % 5) / 100 if hot else (spread % 50) / 100
                devices.append(DeviceLoad(gpu, util, size * util / 2, size, profile, 1 + slot + gpu * 10))
        yield f"gpu-node-{index:05d}", devices


def request_bodies(
    nodes: int, instances: int, batch: int, stamp: int, hot: bool = False, last: int | None = None
) -> tuple[list[bytes], int]:
    """One scrape interval of the fleet as remote-write request bodies of ``batch`` samples, in node order, and the
    sample count; ``last``: the last node's samples have this timestamp instead."""
    bodies, fields, count = [], [], 0
    last_node = f"gpu-node-{nodes - 1:05d}"
    for labels, samples in write_series(fleet(nodes, instances, hot), stamp):
        if last is not None and labels["Hostname"] == last_node:
            samples = [(value, last) for value, _ in samples]
        fields.append(series_field(labels, samples))
        count += 1
        if len(fields) == batch:
            bodies.append(write_request_body(fields))
            fields = []
    if fields:
        bodies.append(write_request_body(fields))
    return bodies, count


def cpu(work: Callable[[], Any]) -> tuple[float, Any]:
    gc.collect()
    start = time.process_time()
    result = work()
    return time.process_time() - start, result


def pull_answer(nodes: int, instances: int, stamp: float) -> tuple[bytes, bytes]:
    """Prometheus' answers to the pull form's two queries (metrics_source.prometheus_queries: the dcgm series by the
    labels the decision reads, the newest sample time per node) for this fleet, JSON as the HTTP API writes it."""
    kept = ("__name__", *NODE_LABELS, *DECISION_LABELS)
    series, times = [], []
    for labels, samples in write_series(fleet(nodes, instances), int(stamp * 1000)):
        metric = {name: labels[name] for name in kept if name in labels}
        series.append({"metric": metric, "value": [stamp, repr(samples[0][0])]})
        if not times or times[-1]["metric"]["Hostname"] != labels["Hostname"]:
            times.append({"metric": {"Hostname": labels["Hostname"]}, "value": [stamp, str(stamp)]})

    def answer(result: list[dict[str, Any]]) -> bytes:
        body = {"status": "success", "data": {"resultType": "vector", "result": result}}
        return json.dumps(body, separators=(",", ":")).encode()

    return answer(series), answer(times)


def fetch_once(source: PushSource) -> Any:
    """One fetch, its snapshot kept out of asyncio.run's return value: at its end asyncio.run puts SIGINT's handler
    back, whose repr holds the finished task's, result included (0.1 s for 1,000 nodes, counted as build before)."""
    got = []

    async def fetch() -> None:
        got.append(await source.fetch(1))

    asyncio.run(fetch())
    return got[0]


def devices_in(snapshot: Any) -> int:
    return sum(len(devs) for node in snapshot.nodes.values() for devs in node.devices.values())


def runtime_decode(data: bytes) -> int:
    count = 0
    for ts in WriteRequest.FromString(data).timeseries:
        labels = {label.name: label.value for label in ts.labels}
        for sample in ts.samples:
            count += bool(labels) and sample.timestamp > 0
    return count


def run_batch(nodes: int, instances: int, batch: int, interval: float, token: Path) -> None:
    """The push form at one size and request size: receive, build, and the runtime's decoding for comparison."""
    stamp = int(time.time() * 1000)
    expected, pct = nodes * 8 * instances, 100 / interval
    bodies, samples = request_bodies(nodes, instances, batch, stamp)
    size = sum(map(len, bodies))
    store = SampleStore(NODE_LABELS, "dcgm-exporter", "gpufleet-node-agents")
    receiver = Receiver(store, TokenFile(token))
    first, _ = cpu(lambda: [receiver.process(body) for body in bodies])
    gc.freeze()  # as the app does after each new snapshot: the cyclic GC no longer walks the store
    steady, results = cpu(lambda: [receiver.process(body) for body in bodies])
    receiver.close()
    accepted = sum(r.accepted for r in results)
    source = PushSource(store, NODE_LABELS, await_fleet=False)  # the store is full already: measure the build alone
    build, snapshot = cpu(lambda: fetch_once(source))
    held = devices_in(snapshot)
    data = [bytes(cramjam.snappy.decompress_raw(body)) for body in bodies]
    runtime, _ = cpu(lambda: [runtime_decode(d) for d in data])
    gc.unfreeze()
    line = (
        f"{nodes:>5} nodes x 8 x {instances} inst, batch {batch:>6}: {samples:>7} samples "
        f"({len(bodies)} requests, {size / 2**20:.1f} MiB snappy) | "
    )
    if held != expected or accepted != samples:
        print(line + f"NOT COUNTED: snapshot holds {held} of {expected} devices, {accepted} of {samples} taken")
        return
    print(
        line + f"receive {steady / samples * 1e6:.2f} us/sample = {steady:.2f} s/interval = "
        f"{steady * pct:.1f} % of a core (first interval {first:.2f} s) | build {build:.2f} s = "
        f"{build * pct:.1f} % | runtime decode alone {runtime / samples * 1e6:.2f} us/sample = "
        f"{runtime * pct:.1f} %",
        flush=True,
    )


def run(nodes: int, instances: int, batches: list[int], interval: float, token: Path) -> None:
    for batch in batches:
        run_batch(nodes, instances, batch, interval, token)
    stamp = int(time.time() * 1000)
    expected, pct = nodes * 8 * instances, 100 / interval
    series_json, times_json = pull_answer(nodes, instances, stamp / 1000)
    pull = PrometheusSource("http://127.0.0.1:9", NODE_LABELS, 10.0)  # PROMETHEUS_QUERY=raw, the default
    spent, built = cpu(lambda: pull._decode_and_build((200, series_json), (200, times_json), stamp / 1000, 1))
    snapshot = built[0]
    if devices_in(snapshot) == expected:
        print(
            f"{nodes:>5} nodes x 8 x {instances} inst, pull (raw form, {len(series_json) / 2**20:.1f} MiB "
            f"JSON): decode + build {spent:.2f} s per refresh = {spent * pct:.1f} % of a core at one refresh "
            f"per interval",
            flush=True,
        )
    else:
        print(f"pull NOT COUNTED: snapshot holds {devices_in(snapshot)} of {expected} devices")
    asyncio.run(pull.aclose())


def _server_cpu(pid: int) -> float:
    """CPU seconds (user + system) the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_http(nodes: int, instances: int, batch: int, interval: float, tmp: Path) -> None:
    """The extender itself (gpufleet-extender serve, METRICS_SOURCE=push) fed over HTTP on 127.0.0.1: its process'
    CPU for one interval of the fleet (HTTP, receive, the refreshes' folds) and the delay from the last request
    answered to the snapshot holding every sample sent. The first interval is cold, the second hot and a scrape
    later, but for its last node, 10 s later still: the requests go in node order, each answered once applied, so
    the snapshot's newest sample is that node's only after a fold that took every sample sent (the delay); then
    /filter refuses every node for each profile (every device hot: the figure counts)."""
    import httpx
    from gpufleet_testsupport.ports import free_port
    from gpufleet_testsupport.scheduler_requests import make_pod, names_args

    base = int(time.time() * 1000) - 60_000  # in the past, however long the bodies take to make
    old, _ = request_bodies(nodes, instances, batch, base - int(interval * 1000))
    new, samples = request_bodies(nodes, instances, batch, base, hot=True, last=base + 10_000)
    token = tmp / "http-token"
    token.write_text("bench-http")
    port, write_port = free_port(), free_port()
    env = {
        **os.environ,
        "METRICS_SOURCE": "push",
        "REMOTE_WRITE_ADDRESS": f"127.0.0.1:{write_port}",
        "REMOTE_WRITE_TOKEN_FILE": str(token),
        "EXPORTER_JOB": "dcgm-exporter",
        "EXPORTER_NAMESPACE": "gpufleet-node-agents",
        "METRICS_MAX_AGE_SECONDS": "0",  # samples never stale: the run's pace does not matter
        "GPU_UTIL_THRESHOLD": str(HOT),
        "KUBE_API": "off",
    }
    command = [sys.executable, "-m", "gpufleet_extender", "serve", "--host", "127.0.0.1", "--port", str(port)]
    log = (tmp / "server.log").open("wb")
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log)
    headers = {
        "Authorization": "Bearer bench-http",
        "Content-Type": "application/x-protobuf",
        "Content-Encoding": "snappy",
    }
    url = f"http://127.0.0.1:{write_port}/api/v1/write"
    try:
        with httpx.Client(timeout=60) as client:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # up: the receiver answers (the app loading until the first push)
                try:
                    client.get(url)
                    break
                except httpx.HTTPError:
                    time.sleep(0.2)
            for body in old:  # the first interval: every series new
                assert client.post(url, content=body, headers=headers).status_code == 204
            time.sleep(3)  # its refreshes done
            before = _server_cpu(server.pid)
            for body in new:
                assert client.post(url, content=body, headers=headers).status_code == 204
            sent = time.monotonic()
            while True:
                state = client.get(f"http://127.0.0.1:{port}/readyz").json()
                age = state["metrics_age_seconds"]
                if age is not None and time.time() - age >= (base + 9_000) / 1000:  # the last node's sample
                    break
                if time.monotonic() - sent > 60:
                    print(f"HTTP NOT COUNTED: the snapshot did not take the last node within 60 s: {state}")
                    return
                time.sleep(0.02)
            delay = time.monotonic() - sent
            spent = _server_cpu(server.pid) - before
            status = Path(f"/proc/{server.pid}/status").read_text()
            rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")) / 1024
            held = int(
                next(
                    line.split()[-1]
                    for line in client.get(f"http://127.0.0.1:{port}/metrics").text.splitlines()
                    if line.startswith("gpufleet_extender_nodes_with_metrics ")
                ).split(".")[0]
            )
            names = [name for name, _ in fleet(nodes, instances)]
            passed = 0
            for profile in sorted({profile for profile, _ in LAYOUTS[instances]}):
                pod = make_pod({f"nvidia.com/mig-{profile}": "1"})
                answer = client.post(f"http://127.0.0.1:{port}/filter", json=names_args(pod, names)).json()
                passed += len(answer.get("NodeNames") or [])
        if held != nodes or passed:
            print(f"HTTP NOT COUNTED: {held} of {nodes} nodes in the snapshot, {passed} passed as not hot")
            return
        print(
            f"{nodes:>5} nodes x 8 x {instances} inst, batch {batch:>6}, over HTTP into gpufleet-extender serve: "
            f"{len(new)} requests, {samples} samples; the server's CPU for the interval {spent:.2f} s = "
            f"{spent * 100 / interval:.1f} % of a core (HTTP, receive, every refresh's fold); last answer to "
            f"every node's new sample in the snapshot: {delay:.2f} s; the server's RSS {rss:.0f} MiB",
            flush=True,
        )
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1000,5000", help="fleet sizes, comma-separated")
    parser.add_argument("--instances", default="3,7", help="MIG instances per GPU (3 or 7), comma-separated")
    parser.add_argument("--batches", default="2000,10000", help="samples per request, comma-separated")
    parser.add_argument("--interval", type=float, default=15.0, help="scrape interval, seconds")
    parser.add_argument(
        "--http", default="5000x7x2000", help="nodes x instances x batch of the run over HTTP ('' for none)"
    )
    args = parser.parse_args()

    print("load average at the start: {:.2f} {:.2f} {:.2f} on {} cores".format(*os.getloadavg(), os.cpu_count()))
    with tempfile.TemporaryDirectory() as tmp:
        token = Path(tmp) / "token"
        token.write_text("bench")
        for nodes in (int(n) for n in args.nodes.split(",") if n):
            for instances in (int(i) for i in args.instances.split(",")):
                run(nodes, instances, [int(b) for b in args.batches.split(",")], args.interval, token)
        if args.http:
            nodes, instances, batch = (int(part) for part in args.http.split("x"))
            run_http(nodes, instances, batch, args.interval, Path(tmp))
    print("load average at the end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of the benchmark process: {peak:.0f} MiB (the largest store and its label cache included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
