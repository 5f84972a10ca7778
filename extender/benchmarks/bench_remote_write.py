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
- build: PushSource.fetch after the interval, every node changed (what a refresh costs at most per interval);
- runtime decode: the protobuf runtime's parse of the same requests plus reading every label into a dict, the
  least the decoder that does not know its series would pay (the reason for the fast path);
- pull: the recorded form's refresh on a canned Prometheus answer of the same fleet (one packed series per device,
  one sample time per node): PrometheusSource's JSON decode and build, as each refresh pays it.
% of one core is per scrape interval (--interval, 15 s). A figure is printed only when the snapshot after the run
holds every device of the fleet.
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
from gpufleet_testsupport.exposition import DeviceLoad, device_values, label_pairs, write_series

from gpufleet_extender.metrics_source import (
    DEVICE_LABELS,
    MEMORY_SCALE,
    PACKED_SERIES,
    PODS_UNKNOWN,
    RECORDED,
    UTIL_SCALE,
    PrometheusSource,
)
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


def fleet(nodes: int, instances: int) -> Iterator[tuple[str, list[DeviceLoad]]]:
    """Nodes of 8 H100 each split into ``instances`` MIG instances, with made-up but valid loads."""
    for index in range(nodes):
        devices = []
        for gpu in range(8):
            for slot, (profile, size) in enumerate(LAYOUTS[instances]):
                util = ((index * 7 + gpu * 3 + slot) % 100) / 100
                devices.append(DeviceLoad(gpu, util, size * util / 2, size, profile, 1 + slot + gpu * 10))
        yield f"gpu-node-{index:05d}", devices


def request_bodies(nodes: int, instances: int, batch: int, stamp: int) -> tuple[list[bytes], int]:
    """One scrape interval of the fleet as remote-write request bodies of ``batch`` samples, and the sample count."""
    bodies, fields, count = [], [], 0
    for labels, samples in write_series(fleet(nodes, instances), stamp):
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
    """Prometheus' answers to the recorded form's two queries for this fleet (JSON, as the HTTP API writes it)."""
    series, times = [], []
    for node, devices in fleet(nodes, instances):
        for device in devices:
            labels = dict(label_pairs(node, device, "Hostname"))
            values = device_values(device)
            used, free = values["DCGM_FI_DEV_FB_USED"], values["DCGM_FI_DEV_FB_FREE"]
            packed = (
                round(1000 * values["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]) * UTIL_SCALE
                + round(1000 * used / (used + free)) * MEMORY_SCALE
                + PODS_UNKNOWN
            )
            metric = {"__name__": PACKED_SERIES, "Hostname": node, **{k: labels[k] for k in DEVICE_LABELS}}
            series.append({"metric": metric, "value": [stamp, str(packed)]})
        times.append({"metric": {"Hostname": node}, "value": [stamp, str(stamp)]})

    def answer(result: list[dict[str, Any]]) -> bytes:
        body = {"status": "success", "data": {"resultType": "vector", "result": result}}
        return json.dumps(body, separators=(",", ":")).encode()

    return answer(series), answer(times)


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
    store._changed.update(dict.fromkeys(store._nodes, 0.0))  # every node changed in the interval
    build, snapshot = cpu(lambda: asyncio.run(source.fetch(1)))
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
    pull = PrometheusSource("http://127.0.0.1:9", NODE_LABELS, 10.0, query=RECORDED)
    spent, built = cpu(lambda: pull._decode_and_build((200, series_json), (200, times_json), stamp / 1000, 1))
    snapshot = built[0]
    if devices_in(snapshot) == expected:
        print(
            f"{nodes:>5} nodes x 8 x {instances} inst, pull (recorded form, {len(series_json) / 2**20:.1f} MiB "
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
    CPU for one interval of the fleet (HTTP, receive, the refreshes' builds) and the delay from the last request
    answered to the snapshot holding every node's new sample."""
    import httpx
    from gpufleet_testsupport.ports import free_port

    now = time.time()
    old, _ = request_bodies(nodes, instances, batch, int((now - 100) * 1000))  # stale: older than the max age
    new, samples = request_bodies(nodes, instances, batch, int(now * 1000) + 30_000)
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
        "METRICS_MAX_AGE_SECONDS": "60",
        "METRICS_MAX_CLOCK_SKEW_SECONDS": "60",
        "KUBE_API": "off",
    }
    command = [sys.executable, "-m", "gpufleet_extender", "serve", "--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    headers = {
        "Authorization": "Bearer bench-http",
        "Content-Type": "application/x-protobuf",
        "Content-Encoding": "snappy",
    }
    url = f"http://127.0.0.1:{write_port}/api/v1/write"
    try:
        with httpx.Client(timeout=60) as client:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if client.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
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
                if not state["metrics_blind"] and state["metrics_stale_nodes"] == 0:
                    break
                if time.monotonic() - sent > 60:
                    print(f"HTTP NOT COUNTED: the snapshot did not take every node within 60 s: {state}")
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
        if held != nodes:
            print(f"HTTP NOT COUNTED: {held} of {nodes} nodes in the snapshot")
            return
        print(
            f"{nodes:>5} nodes x 8 x {instances} inst, batch {batch:>6}, over HTTP into gpufleet-extender serve: "
            f"{len(new)} requests, {samples} samples; the server's CPU for the interval {spent:.2f} s = "
            f"{spent * 100 / interval:.1f} % of a core (HTTP, receive, every refresh's build); last answer to "
            f"every node's new sample in the snapshot: {delay:.2f} s; the server's RSS {rss:.0f} MiB",
            flush=True,
        )
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


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
