"""Benchmark of the extender's verbs: in process and over HTTP against the real server, with the floor.

    .venv/bin/python extender/benchmarks/bench_extender.py            # 500 and 5,000 nodes
    .venv/bin/python extender/benchmarks/bench_extender.py --nodes 20,1000 --quick

Bodies are shaped like kube-scheduler's: a real Pod, and either NodeNames (nodeCacheCapable: true) or the
full Node objects (false). The floor, measured in the same run on the same bodies, is orjson decoding the
request plus encoding the same answer: the least any Python extender must pay.

- "repeated list": every request carries the same candidate list (pods of one workload in a row), which
  the extender answers from its memo; "fresh list": 64 different lists in turn, so every request misses
  the memo and pays for looking every node up.
- "cold": the first request after a new metrics snapshot, when the decision table is built (the server
  normally does that in the background right after each refresh).
- HTTP figures include the Python client on the same 2 cores; "server" is the extender's own histogram
  (body read to answer encoded), taken from its /metrics.

Bounded in count and time; everything runs on 127.0.0.1 and is stopped by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpufleet_extender.config import load_settings
from gpufleet_extender.metrics_source import FileSource
from gpufleet_extender.service import Extender

from fleet import args_body, metrics_text, node, node_name, pod


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def time_calls(fn: Callable[[bytes], object], bodies: list[bytes], count: int) -> list[float]:
    timings = []
    for i in range(count):
        body = bodies[i % len(bodies)]
        started = time.perf_counter()
        fn(body)
        timings.append(time.perf_counter() - started)
    return timings


def ms(seconds: float) -> str:
    return f"{seconds * 1000:7.3f}"


class Bodies:
    """Request bodies for one fleet size and form; ``fresh`` has more distinct lists than the memo keeps."""

    def __init__(self, nodes: int, full: bool, resource: str = "nvidia.com/gpu"):
        names = [node_name(i) for i in range(nodes)]
        the_pod = pod(resource)
        if full:
            objects = [node(i) for i in range(nodes)]
            self.repeated = [args_body(the_pod, nodes=objects)]
            self.fresh = [args_body(the_pod, nodes=objects[k:] + objects[:k]) for k in range(1, 3)]
        else:
            self.repeated = [args_body(the_pod, names=names)]
            # More distinct lists than the answer memo keeps (16), cycled: every request is a miss.
            self.fresh = [args_body(the_pod, names=names[k:] + names[:k]) for k in range(1, 65)]
        self.size = len(self.repeated[0])


def floor_of(extender_call: Callable[[bytes], bytes], bodies: list[bytes]) -> Callable[[bytes], object]:
    answers = {body: orjson.loads(extender_call(body)) for body in bodies}

    def floor(body: bytes) -> bytes:
        orjson.loads(body)
        return orjson.dumps(answers[body])

    return floor


def in_process(extender: Extender, sizes: list[int], quick: bool) -> None:
    print("\n== in process (decode + decide + encode; no HTTP) ==")
    print(
        f"{'nodes':>6} {'form':5} {'verb':10} {'list':9} {'min ms':>8} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} "
        f"{'floor min':>9} {'floor p50':>9} {'ratio p50':>9}"
    )
    for nodes in sizes:
        for full in (False, True):
            bodies = Bodies(nodes, full)
            count = (60 if quick else 300) if not full else (4 if quick else 12) * max(1, 5000 // nodes)
            for verb in ("filter", "prioritize"):
                call = getattr(extender, verb)
                for label, group in (("repeated", bodies.repeated), ("fresh", bodies.fresh)):
                    call(bodies.repeated[0])  # build the decision table first: "cold" is measured below
                    timings = time_calls(call, group, count)
                    floor = time_calls(floor_of(call, group), group, count)
                    p50, p99 = percentiles(timings)
                    f50, _ = percentiles(floor)
                    print(
                        f"{nodes:6d} {'full' if full else 'names':5} {verb:10} {label:9} {ms(min(timings))} "
                        f"{ms(p50)} {ms(p99)} {1 / statistics.mean(timings):8.0f} {ms(min(floor)):>9} "
                        f"{ms(f50):>9} {p50 / f50:9.2f}"
                    )
        # Cold: a new snapshot version, so the next request builds the decision table.
        body = Bodies(nodes, False).repeated[0]
        cold = []
        for _ in range(3):
            extender._view = None  # what a metrics refresh does to the cached view
            started = time.perf_counter()
            extender.filter(body)
            cold.append(time.perf_counter() - started)
        print(
            f"{nodes:6d} names filter     cold      {ms(statistics.median(cold))}  (table built for the whole "
            f"snapshot; the server builds it in the background after each refresh)"
        )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_histogram(url: str, verb: str) -> tuple[float, float]:
    text = httpx.get(f"{url}/metrics").text
    total = re.search(rf'gpufleet_extender_request_duration_seconds_sum{{verb="{verb}"}} (\S+)', text)
    count = re.search(rf'gpufleet_extender_request_duration_seconds_count{{verb="{verb}"}} (\S+)', text)
    return (float(total.group(1)), float(count.group(1))) if total and count else (0.0, 0.0)


async def drive(url: str, path: str, bodies: list[bytes], count: int, concurrency: int) -> tuple[list[float], float]:
    timings: list[float] = []
    next_index = iter(range(count))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

        async def worker() -> None:
            for i in next_index:
                started = time.perf_counter()
                answer = await client.post(
                    path, content=bodies[i % len(bodies)], headers={"content-type": "application/json"}
                )
                timings.append(time.perf_counter() - started)
                if answer.status_code != 200:
                    raise RuntimeError(f"{path}: HTTP {answer.status_code}: {answer.text[:200]}")

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return timings, time.perf_counter() - started


def over_http(metrics_file: Path, sizes: list[int], quick: bool) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "METRICS_SOURCE": "file",
        "METRICS_FILE": str(metrics_file),
        "METRICS_MAX_AGE_SECONDS": "0",  # a static file must not go stale during the run
        "MAX_BODY_BYTES": str(256 * 1024 * 1024),  # full Node objects of 5,000 nodes are ~13 MB
        "KUBE_API": "off",
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "gpufleet_extender", "serve", "--port", str(port), "--log-level", "warning"],
        env=env,
    )
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if re.search(r"gpufleet_extender_nodes_with_metrics [1-9]", httpx.get(f"{url}/metrics").text):
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            raise RuntimeError("the extender did not load the metrics file in time")
        print("\n== over HTTP (real uvicorn server, httpx client on the same machine) ==")
        print(
            f"{'nodes':>6} {'form':5} {'verb':10} {'list':9} {'clients':>7} {'p50 ms':>8} {'p99 ms':>8} "
            f"{'req/s':>8} {'server ms':>9}"
        )
        for nodes in sizes:
            for full in (False, True):
                bodies = Bodies(nodes, full)
                for verb in ("filter", "prioritize"):
                    for label, group in (("repeated", bodies.repeated), ("fresh", bodies.fresh)):
                        for concurrency in (1, 16):
                            count = 16 * (3 if quick else 10) if full else (160 if quick else 640)
                            if full:
                                count = max(concurrency, count * 500 // nodes // 4)
                            asyncio.run(drive(url, f"/{verb}", bodies.repeated, concurrency, concurrency))  # warm-up
                            before = server_histogram(url, verb)
                            timings, elapsed = asyncio.run(drive(url, f"/{verb}", group, count, concurrency))
                            after = server_histogram(url, verb)
                            p50, p99 = percentiles(timings)
                            server_mean = (after[0] - before[0]) / max(1.0, after[1] - before[1])
                            print(
                                f"{nodes:6d} {'full' if full else 'names':5} {verb:10} {label:9} "
                                f"{concurrency:7d} {ms(p50)} {ms(p99)} {len(timings) / elapsed:8.0f} "
                                f"{ms(server_mean):>9}"
                            )
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="500,5000", help="comma-separated fleet sizes (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    parser.add_argument("--skip-http", action="store_true", help="in-process figures only")
    args = parser.parse_args()
    sizes = sorted(int(n) for n in args.nodes.split(","))
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-") as tmp:
        metrics_file = Path(tmp) / "dcgm.prom"
        started = time.perf_counter()
        metrics_file.write_text(metrics_text(max(sizes)))
        settings = load_settings(
            METRICS_SOURCE="file",
            METRICS_FILE=str(metrics_file),
            METRICS_MAX_AGE_SECONDS=0,
            MAX_BODY_BYTES=256 * 1024 * 1024,
            KUBE_API="off",
        )
        snapshot = asyncio.run(FileSource(metrics_file, settings.NODE_NAME_LABELS).fetch(1))
        print(
            f"fleet: {max(sizes)} nodes x 8 H100 (1 in 4 split 3g.40gb + 2x 2g.20gb), "
            f"{metrics_file.stat().st_size / 1e6:.1f} MB of dcgm-exporter text, "
            f"parsed in {time.perf_counter() - started:.1f} s; python {sys.version.split()[0]}, "
            f"{os.cpu_count()} CPUs"
        )
        extender = Extender(settings, snapshot_provider=lambda: snapshot)
        in_process(extender, sizes, args.quick)
        if not args.skip_http:
            over_http(metrics_file, sizes, args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
