"""Benchmark of the extender's verbs: in process and over HTTP against the real server, with the floor.

    .venv/bin/python extender/benchmarks/bench_extender.py            # everything, 15-20 minutes on 2 cores
    .venv/bin/python extender/benchmarks/bench_extender.py --nodes 20,1000 --quick
    .venv/bin/python extender/benchmarks/bench_extender.py --sections binding,shapes --shape-nodes 1000
    .venv/bin/python extender/benchmarks/bench_extender.py --sections reload --reload-lines 200000

Bodies are shaped like kube-scheduler's: a real Pod, and either NodeNames (nodeCacheCapable: true) or the
full Node objects (false). The floor, measured in the same run on the same bodies, is orjson decoding the
request plus encoding the same answer: the least any Python extender must pay.

- "repeated list": every request carries the same candidate list (pods of one workload in a row), which
  the extender answers from its memo; "fresh list": 64 different lists in turn, so every request misses
  the memo and pays for looking every node up.
- "cold": the first request after a new metrics snapshot in which every node changed, when the candidates
  are evaluated again (the server normally does that in the background right after each refresh).
- (1)-(5), issue 10: production mode (in-flight accounting, tenant pools) while pods bind; 100 pod shapes
  vs one; request latency during a large metrics reload; process start to first /healthz; what HTTP costs
  (a bare ASGI app on the same uvicorn as the floor). Each prints its baseline from the same run.
- HTTP figures include the Python client on the same 2 cores; "server" is the extender's own histogram
  (body read to answer encoded), taken from its /metrics.

Bounded in count and time; everything runs on 127.0.0.1 and is stopped by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import httpx
import orjson
from gpufleet_testsupport.ports import free_port

from gpufleet_extender.cluster import ClusterState
from gpufleet_extender.config import Settings, load_settings
from gpufleet_extender.metrics_source import FileSource
from gpufleet_extender.service import Extender
from gpufleet_extender.snapshot import MetricsSnapshot, NodeMetrics

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


def in_process(settings: Settings, snapshot: MetricsSnapshot, sizes: list[int], quick: bool) -> None:
    current = {"snapshot": snapshot}
    extender = Extender(settings, snapshot_provider=lambda: current["snapshot"])
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
        # Cold: a new snapshot in which every node changed, so the next request evaluates its candidates again.
        body = Bodies(nodes, False).repeated[0]
        cold = []
        for _ in range(3):
            current["snapshot"] = renewed(current["snapshot"])
            started = time.perf_counter()
            extender.filter(body)
            cold.append(time.perf_counter() - started)
        print(
            f"{nodes:6d} names filter     cold      {ms(statistics.median(cold))}  (first request after a snapshot in "
            f"which every node changed; the server evaluates recent shapes in the background after each refresh)"
        )


def renewed(snapshot: MetricsSnapshot) -> MetricsSnapshot:
    """The same metrics as a new snapshot with new objects: what a refresh with fresh samples looks like."""
    nodes = {name: NodeMetrics(m.name, m.sample_time, m.devices) for name, m in snapshot.nodes.items()}
    return replace(snapshot, nodes=nodes, version=snapshot.version + 1)


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


def start_server(metrics_file: Path, **env_overrides: str) -> tuple[subprocess.Popen, str]:
    """The extender as deployed (``gpufleet-extender serve``) on a free port of 127.0.0.1; stop it by PID."""
    port = free_port()
    env = {
        **os.environ,
        "METRICS_SOURCE": "file",
        "METRICS_FILE": str(metrics_file),
        "METRICS_MAX_AGE_SECONDS": "0",  # a static file must not go stale during the run
        "MAX_BODY_BYTES": str(256 * 1024 * 1024),  # full Node objects of 5,000 nodes are ~13 MB
        "KUBE_API": "off",
        **env_overrides,
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "gpufleet_extender", "serve", "--port", str(port), "--log-level", "warning"],
        env=env,
    )
    return server, f"http://127.0.0.1:{port}"


def nodes_with_metrics(url: str) -> int:
    """The server's nodes_with_metrics gauge (0 while /metrics does not answer within 5 s)."""
    try:
        text = httpx.get(f"{url}/metrics", timeout=5).text
    except httpx.HTTPError:
        return 0
    found = re.search(r"^gpufleet_extender_nodes_with_metrics (\S+)$", text, re.M)
    return int(float(found.group(1))) if found else 0


def wait_loaded(url: str, nodes: int = 1, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if nodes_with_metrics(url) >= nodes:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the extender did not load the metrics file in time")


def stop(server: subprocess.Popen) -> None:
    server.terminate()
    server.wait(timeout=30)


def over_http(metrics_file: Path, sizes: list[int], quick: bool) -> None:
    server, url = start_server(metrics_file)
    try:
        wait_loaded(url)
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
        stop(server)


# --- production mode: in-flight accounting and tenant pools while pods bind (issue 10) ----------------------

TENANT_LABEL = "gpufleet.io/tenant"


def production_extender(nodes: int, snapshot: MetricsSnapshot) -> tuple[Extender, ClusterState]:
    """An Extender as deployed with the Kubernetes API: a ClusterState fed as the watch feeds it."""
    settings = load_settings(METRICS_MAX_AGE_SECONDS=0, KUBE_API="off")  # KUBE_API off: we feed the state
    cluster = ClusterState(settings.TENANT_LABEL, settings.INFLIGHT_MAX_SECONDS)
    cluster.replace("Namespace", [{"metadata": {"name": "llm-serving", "labels": {TENANT_LABEL: "llm"}}}])
    cluster.replace("Node", [node(i) for i in range(nodes)])  # half in pool llm, half in pool imagegen
    cluster.replace("Pod", [])
    return Extender(settings, cluster=cluster, snapshot_provider=lambda: snapshot), cluster


def bound_pod(index: int, node_name: str, resource: str = "nvidia.com/gpu") -> dict:
    """A pod as the watch sees it right after kube-scheduler bound it."""
    obj = pod(resource)
    obj["metadata"] = {**obj["metadata"], "name": f"bench-{index}", "uid": f"bench-{index:08d}"}
    obj["spec"] = {**obj["spec"], "nodeName": node_name}
    scheduled = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    obj["status"] = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled}],
    }
    return obj


def while_binding(snapshot: MetricsSnapshot, nodes: int, cycles: int) -> None:
    """(1) Handler time per verb at ``nodes`` nodes in production mode while pods bind.

    Each cycle is what kube-scheduler does per pod: filter, prioritize, bind the best node; the binding
    reaches the extender through ClusterState.apply_event, the k8s watch's own entry point.
    """
    print(f"\n== (1) production mode (in-flight accounting, tenant pools), {nodes} nodes, a pod bound per cycle ==")
    names = [node_name(i) for i in range(nodes)]
    the_body = args_body(pod(), names=names)
    extender, cluster = production_extender(nodes, snapshot)
    extender.filter(the_body)  # the first table, as after start-up
    times: dict[str, list[float]] = {"filter": [], "prioritize": [], "bind event": []}
    for index in range(cycles):
        # Handler time only (body in hand -> answer): reading the answers is the scheduler's work, not timed.
        started = time.perf_counter()
        answer = extender.filter(the_body)
        times["filter"].append(time.perf_counter() - started)
        passed = orjson.loads(answer)["NodeNames"]
        started = time.perf_counter()
        answer = extender.prioritize(the_body)
        times["prioritize"].append(time.perf_counter() - started)
        scores = orjson.loads(answer)
        allowed = set(passed)
        best = max((entry for entry in scores if entry["Host"] in allowed), key=lambda e: e["Score"], default=None)
        if best is None:
            break  # the fleet is full
        event = bound_pod(index, best["Host"])
        started = time.perf_counter()
        cluster.apply_event("Pod", "ADDED", event)
        times["bind event"].append(time.perf_counter() - started)
    # Baselines of the same run: the same requests without the Kubernetes API, and the JSON floor.
    plain = Extender(load_settings(METRICS_MAX_AGE_SECONDS=0, KUBE_API="off"), snapshot_provider=lambda: snapshot)
    plain.filter(the_body)
    baseline = {
        verb: time_calls(getattr(plain, verb), [the_body], len(times[verb])) for verb in ("filter", "prioritize")
    }
    floor = {verb: time_calls(floor_of(getattr(plain, verb), [the_body]), [the_body], 200) for verb in baseline}
    print(
        f"{'verb':11} {'calls':>6} {'mean ms':>8} {'min ms':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}  "
        f"{'KUBE_API=off mean':>17} {'ratio':>6} {'JSON floor':>10}"
    )
    for verb, timings in times.items():
        if not timings:
            continue
        p50, p99 = percentiles(timings)
        line = f"{verb:11} {len(timings):6d} {ms(statistics.mean(timings))} {ms(min(timings))} {ms(p50)} {ms(p99)} "
        line += f"{ms(max(timings))}  "
        if verb in baseline:
            base = statistics.mean(baseline[verb])
            line += f"{ms(base):>17} {statistics.mean(timings) / base:6.2f} {ms(statistics.mean(floor[verb])):>10}"
        else:
            line += "(watch thread, not on the request path)"
        print(line)
    print(f"goal: mean <= 0.500 ms per verb; bound {len(times['bind event'])} pods")


def shapes(snapshot: MetricsSnapshot, nodes: int, requests: int) -> None:
    """(2) 100 pod shapes (``nvidia.com/gpu: 1..100``) in turn vs one shape, production mode, fresh lists."""
    print(f"\n== (2) pod shapes, production mode, {nodes} nodes, filter + prioritize per request ==")
    names = [node_name(i) for i in range(nodes)]
    lists = [names[k:] + names[:k] for k in range(1, 17)]  # candidate lists the answer memo does not hold
    single = [args_body(pod(count=1), names=lists[i % len(lists)]) for i in range(len(lists))]
    cycling = [args_body(pod(count=1 + i % 100), names=lists[i % len(lists)]) for i in range(400)]

    def rate(extender: Extender, bodies: list[bytes], count: int) -> float:
        started = time.perf_counter()
        for i in range(count):
            extender.filter(bodies[i % len(bodies)])
            extender.prioritize(bodies[i % len(bodies)])
        return count / (time.perf_counter() - started)

    extender, _ = production_extender(nodes, snapshot)
    first_single = rate(extender, single, 1)
    single_rate = rate(extender, single, requests)
    extender, _ = production_extender(nodes, snapshot)
    first_pass = rate(extender, cycling, 100)  # every shape seen for the first time
    cycling_rate = rate(extender, cycling, requests)
    print(f"one shape:       {single_rate:8.1f} req/s  (first request {1 / first_single * 1000:.0f} ms)")
    print(f"100 shapes:      {cycling_rate:8.1f} req/s  (first pass over the 100 shapes: {first_pass:.1f} req/s)")
    print(f"ratio 100 / one: {cycling_rate / single_rate:8.2f}  (goal >= 0.8)")


# --- the server: metrics reload, start-up, HTTP overhead -----------------------------------------------------


def lines_per_node() -> float:
    return metrics_text(4).count("\n") / 4


def reload(tmp: Path, lines: int, seconds_before: float) -> None:
    """(3) Request p99 while the server swaps in a ``lines``-line metrics file (filter over 100 names)."""
    big_nodes = int(lines / lines_per_node())
    print(f"\n== (3) filter over 100 names during a {lines:,}-line metrics reload ({big_nodes} nodes) ==")
    metrics_file = tmp / "reload.prom"
    metrics_file.write_text(metrics_text(1000))
    big = tmp / "big.prom"
    started = time.perf_counter()
    big.write_text(metrics_text(big_nodes))
    print(f"wrote {big.stat().st_size / 1e6:.0f} MB in {time.perf_counter() - started:.1f} s")
    server, url = start_server(metrics_file, METRICS_REFRESH_SECONDS="1")
    try:
        wait_loaded(url, 1000)
        request = args_body(pod(), names=[node_name(i) for i in range(0, 1000, 10)])
        with httpx.Client(base_url=url, timeout=60) as client:
            slowest: list[tuple[float, float]] = []  # (latency, seconds after the swap)

            def measure(until: Callable[[], bool], limit: float) -> tuple[list[float], float]:
                timings: list[float] = []
                started = time.perf_counter()
                polled = started
                while time.perf_counter() - started < limit:
                    begin = time.perf_counter()
                    answer = client.post("/filter", content=request, headers={"content-type": "application/json"})
                    timings.append(time.perf_counter() - begin)
                    slowest.append((timings[-1], begin - started))
                    answer.raise_for_status()
                    if time.perf_counter() - polled > 0.5:
                        polled = time.perf_counter()
                        if until():
                            break
                return timings, time.perf_counter() - started

            before, _ = measure(lambda: False, seconds_before)
            slowest.clear()
            os.replace(big, metrics_file)
            during, took = measure(lambda: nodes_with_metrics(url) >= big_nodes, 600)
        loaded = nodes_with_metrics(url) >= big_nodes
        b50, b99 = percentiles(before)
        d50, d99 = percentiles(during)
        print(f"{'':16} {'requests':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
        print(f"{'before reload':16} {len(before):8d} {ms(b50)} {ms(b99)} {ms(max(before))}")
        print(f"{'during reload':16} {len(during):8d} {ms(d50)} {ms(d99)} {ms(max(during))}")
        state = f"new snapshot served after {took:.1f} s" if loaded else f"not loaded after {took:.0f} s"
        print(f"p99 during / before: {d99 / b99:.1f}; {state}; goal: p99 during <= 20 ms")
        worst = ", ".join(f"{ms(lat).strip()} ms at {at:.1f} s" for lat, at in sorted(slowest, reverse=True)[:5])
        print(f"slowest during: {worst}")
    finally:
        stop(server)


def first_answer(
    command: list[str], url: str, env: dict[str, str], path: str = "/healthz"
) -> tuple[float, subprocess.Popen]:
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env)
    with httpx.Client(timeout=1) as client:
        while process.poll() is None and time.perf_counter() - started < 120:
            try:
                if client.get(url + path).status_code == 200:
                    return time.perf_counter() - started, process
            except httpx.HTTPError:
                time.sleep(0.002)
    raise RuntimeError(f"{command[2:4]}: no answer on {path}")


def startup(metrics_file: Path, nodes: int) -> None:
    """(4) From process start to the first /healthz answer, the bare ASGI app on the same uvicorn as baseline."""
    print(f"\n== (4) process start -> first answer ({nodes}-node metrics file) ==")
    bare_port = free_port()
    bare_command = [sys.executable, "-m", "uvicorn", "--app-dir", str(Path(__file__).parent), "bare_asgi:app"]
    bare_command += ["--port", str(bare_port), "--log-level", "warning"]
    bare, process = first_answer(bare_command, f"http://127.0.0.1:{bare_port}", dict(os.environ))
    stop(process)
    env = {**os.environ, "METRICS_SOURCE": "file", "METRICS_FILE": str(metrics_file), "METRICS_MAX_AGE_SECONDS": "0"}
    env["KUBE_API"] = "off"
    port = free_port()
    command = [sys.executable, "-m", "gpufleet_extender", "serve", "--port", str(port), "--log-level", "warning"]
    healthz, process = first_answer(command, f"http://127.0.0.1:{port}", env)
    try:
        since_answer = time.perf_counter()
        with httpx.Client(timeout=5) as client:  # the start-up responder answers "starting" until the app serves
            while client.get(f"http://127.0.0.1:{port}/healthz").json() != {"status": "ok"}:
                time.sleep(0.002)
        app_serving = healthz + time.perf_counter() - since_answer
        wait_loaded(f"http://127.0.0.1:{port}", nodes)
        loaded = healthz + time.perf_counter() - since_answer
    finally:
        stop(process)
    print(f"bare ASGI app on uvicorn:  first answer after {ms(bare)} ms (Python start-up and imports)")
    print(f"extender /healthz:         first answer after {ms(healthz)} ms (start-up responder, before the imports)")
    print(f"extender app serving:      after {ms(app_serving)} ms ({ms(app_serving - bare)} ms over the bare app)")
    print(f"extender snapshot loaded:  after {loaded:.2f} s (up to 0.2 s polling); goal: /healthz within 100 ms")


def asgi_overhead(metrics_file: Path, snapshot: MetricsSnapshot, nodes: int, count: int) -> None:
    """(5) What HTTP costs: the bare ASGI app vs the extender on the same requests, same uvicorn flags."""
    print(f"\n== (5) HTTP overhead: bare ASGI app answering the same bytes vs the extender, {nodes}-name filter ==")
    bodies = Bodies(nodes, False).repeated
    # The bare app answers the very bytes the extender answers: the difference is the framework and the handler.
    answer_file = metrics_file.with_name("bare-answer.json")
    answer_file.write_bytes(
        Extender(load_settings(METRICS_MAX_AGE_SECONDS=0, KUBE_API="off"), snapshot_provider=lambda: snapshot).filter(
            bodies[0]
        )
    )
    bare_port = free_port()
    command = [sys.executable, "-m", "uvicorn", "--app-dir", str(Path(__file__).parent), "bare_asgi:app"]
    command += ["--port", str(bare_port), "--log-level", "warning", "--http", "httptools", "--loop", "uvloop"]
    bare_env = {**os.environ, "BARE_ANSWER_FILE": str(answer_file)}
    _, bare = first_answer(command, f"http://127.0.0.1:{bare_port}", bare_env)
    server, url = start_server(metrics_file)
    print(f"{'server':10} {'clients':>7} {'mean ms':>8} {'p50 ms':>8} {'req/s':>8} {'handler ms':>10}")
    try:
        wait_loaded(url, nodes)
        for concurrency in (1, 16):
            means = {}
            for label, base in (("bare ASGI", f"http://127.0.0.1:{bare_port}"), ("extender", url)):
                asyncio.run(drive(base, "/filter", bodies, 50, concurrency))  # warm-up
                before = server_histogram(url, "filter")
                timings, elapsed = asyncio.run(drive(base, "/filter", bodies, count, concurrency))
                after = server_histogram(url, "filter")
                handler = (after[0] - before[0]) / max(1.0, after[1] - before[1])
                means[label] = statistics.mean(timings)
                print(
                    f"{label:10} {concurrency:7d} {ms(means[label])} {ms(percentiles(timings)[0])} "
                    f"{len(timings) / elapsed:8.0f} {ms(handler) if label == 'extender' else '':>10}"
                )
            gap = means["extender"] - means["bare ASGI"]
            print(
                f"{'':10} {concurrency:7d} gap {ms(gap)} ms per request: the handler (above), the rest is the framework"
            )
    finally:
        stop(server)
        stop(bare)


async def load(metrics_file: Path, settings: Settings) -> MetricsSnapshot:
    source = FileSource(metrics_file, settings.NODE_NAME_LABELS)
    try:
        return await source.fetch(1)
    finally:
        aclose = getattr(source, "aclose", None)  # the parse worker process, where there is one
        if aclose is not None:
            await aclose()


SECTIONS = ("inproc", "http", "binding", "shapes", "reload", "startup", "asgi")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="500,5000", help="comma-separated fleet sizes (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    parser.add_argument("--skip-http", action="store_true", help="in-process figures only")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated subset of %(default)s")
    parser.add_argument("--binding-nodes", type=int, default=1000, help="fleet of (1) (default: %(default)s)")
    parser.add_argument("--shape-nodes", type=int, default=5000, help="fleet of (2) (default: %(default)s)")
    parser.add_argument(
        "--reload-lines", type=int, default=1_000_000, help="metrics file swapped in by (3) (default: %(default)s)"
    )
    args = parser.parse_args()
    sizes = sorted(int(n) for n in args.nodes.split(","))
    sections = set(args.sections.split(","))
    if args.skip_http:
        sections -= {"http", "reload", "startup", "asgi"}
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-") as tmp:
        metrics_file = Path(tmp) / "dcgm.prom"
        needed = {
            "inproc": max(sizes),
            "http": max(sizes),
            "startup": max(sizes),
            "binding": args.binding_nodes,
            "asgi": args.binding_nodes,
            "shapes": args.shape_nodes,
        }
        largest = max([needed.get(section, 1000) for section in sections] or [1000])
        started = time.perf_counter()
        metrics_file.write_text(metrics_text(largest))
        settings = load_settings(
            METRICS_SOURCE="file",
            METRICS_FILE=str(metrics_file),
            METRICS_MAX_AGE_SECONDS=0,
            MAX_BODY_BYTES=256 * 1024 * 1024,
            KUBE_API="off",
        )
        snapshot = asyncio.run(load(metrics_file, settings))
        print(
            f"fleet: {largest} nodes x 8 H100 (1 in 4 split 3g.40gb + 2x 2g.20gb), "
            f"{metrics_file.stat().st_size / 1e6:.1f} MB of dcgm-exporter text, "
            f"parsed in {time.perf_counter() - started:.1f} s; python {sys.version.split()[0]}, "
            f"{os.cpu_count()} CPUs"
        )
        gc.freeze()  # the client's own fleet objects: keep its GC from pausing the timed loops
        if "inproc" in sections:
            in_process(settings, snapshot, sizes, args.quick)
        if "binding" in sections:
            while_binding(snapshot, args.binding_nodes, 300 if args.quick else 1000)
        if "shapes" in sections:
            shapes(snapshot, args.shape_nodes, 100 if args.quick else 400)
        if "http" in sections:
            over_http(metrics_file, sizes, args.quick)
        if "startup" in sections:
            startup(metrics_file, largest)
        if "asgi" in sections:
            asgi_overhead(metrics_file, snapshot, args.binding_nodes, 500 if args.quick else 2000)
        if "reload" in sections:
            reload(Path(tmp), args.reload_lines, 3 if args.quick else 10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
