#!/usr/bin/env python3
"""What the push form costs Prometheus itself: its CPU while it scrapes a fleet's dcgm-exporter series and sends
them to the receivers (remote write, the entries `gpufleet-extender remote-write-config` writes, filtered to the
four series a decision reads), against the same Prometheus only scraping, in one run per fleet size:

- ``scrape``: Prometheus scraping the fleet and nothing else, the baseline every form pays;
- ``push-1`` / ``push-4``: and sending to one receiver, or to four (two extenders and two gpufleet-schedulers
  in plugin mode: each receiver needs the whole stream);
- ``rules``: and evaluating a rule group, when --rules names a file of one (a pull form's recording rules, to
  compare with what push replaced).

    python3 benchmarks/bench_prometheus_push.py [--nodes 1000,5000] [--interval 15] [--intervals 6]

The fleet is gpufleet_testsupport.dcgm_fleet's (every instance of the Hong Kong layouts, the exporter's full label
set, fields no decision reads), scraped every --interval seconds by a real Prometheus (Debian's package). Each way
starts its own Prometheus, waits until every series is in and two more intervals have passed, then takes the
process' CPU time (utime + stime from /proc) over --intervals intervals. The receivers answer 204 and count what
they receive; a push figure counts only if every interval delivered the fleet's filtered series to every receiver
(Prometheus' own prometheus_remote_storage_samples_total agrees), a rules figure only if no evaluation was missed.
Prints figures only, with the load average: no goal is asserted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import yaml
from gpufleet_extender.push_config import PushTarget, remote_write
from gpufleet_extender.snapshot import DCGM_METRICS
from gpufleet_testsupport.dcgm_fleet import EXPORTER_NAMESPACE, FleetPrometheus, make_fleet
from prometheus_client.parser import text_string_to_metric_families

NODE_LABELS = ("Hostname", "hostname")
TICKS = os.sysconf("SC_CLK_TCK")


class NullReceiver:
    """A remote-write receiver on 127.0.0.1 that takes every request (204) and counts requests and bytes."""

    def __init__(self) -> None:
        self.requests = 0
        self.bytes = 0
        lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with lock:
                    receiver.requests += 1
                    receiver.bytes += len(body)
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/v1/write"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def self_metrics(url: str) -> dict[str, float]:
    """Prometheus' own counters this benchmark reads, summed over their labels."""
    wanted = (
        "prometheus_remote_storage_samples_total",
        "prometheus_remote_storage_samples_failed_total",
        "prometheus_remote_storage_samples_dropped_total",
        "prometheus_rule_group_iterations_missed_total",
        "prometheus_rule_evaluation_failures_total",
        "prometheus_rule_group_last_duration_seconds",
    )
    totals = dict.fromkeys(wanted, 0.0)
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text):
        for sample in family.samples:
            if sample.name in totals and not math.isnan(sample.value):
                totals[sample.name] += sample.value
    return totals


def measure(fleet, way: str, args, workdir: Path, rules: dict | None) -> str:
    receivers = [NullReceiver() for _ in range(int(way.split("-")[1]))] if way.startswith("push") else []
    entries = (
        remote_write([PushTarget(r.url) for r in receivers], NODE_LABELS, "dcgm-exporter", EXPORTER_NAMESPACE)
        if receivers
        else None
    )
    directory = workdir / way
    directory.mkdir(parents=True)
    prometheus = FleetPrometheus(
        fleet, directory, interval=args.interval, rules=rules if way == "rules" else None, remote_write=entries
    )
    try:
        url = prometheus.__enter__()
        assert prometheus.process is not None
        pid = prometheus.process.pid
        time.sleep(2 * args.interval)  # the first scrapes' series created, the queues at their pace
        before_metrics, before_cpu = self_metrics(url), cpu_seconds(pid)
        before_received = [(r.requests, r.bytes) for r in receivers]
        began = time.monotonic()
        time.sleep(args.intervals * args.interval)
        spent = cpu_seconds(pid) - before_cpu
        elapsed = time.monotonic() - began
        after = self_metrics(url)
    finally:
        prometheus.__exit__()
        for receiver in receivers:
            receiver.close()
    per_interval = spent / (elapsed / args.interval)
    line = (
        f"  {way:7s} Prometheus CPU {per_interval:6.3f} s per {args.interval} s interval "
        f"= {100 * spent / elapsed:5.1f} % of one core; load average {os.getloadavg()[0]:.1f}"
    )
    if receivers:
        intervals = elapsed / args.interval
        sent = (
            after["prometheus_remote_storage_samples_total"] - before_metrics["prometheus_remote_storage_samples_total"]
        ) / intervals
        failed = (
            after["prometheus_remote_storage_samples_failed_total"]
            - before_metrics["prometheus_remote_storage_samples_failed_total"]
        )
        wanted = fleet.series_of(DCGM_METRICS) * len(receivers)
        requests = [r.requests - b[0] for r, b in zip(receivers, before_received, strict=True)]
        sizes = [r.bytes - b[1] for r, b in zip(receivers, before_received, strict=True)]
        ok = failed == 0 and min(requests) > 0 and sent >= 0.95 * wanted
        line += (
            f"\n          sent {sent:,.0f} samples per interval to {len(receivers)} receiver(s) (the filtered fleet: "
            f"{wanted:,}), {failed:.0f} failed; {sum(requests) / intervals:,.0f} requests, "
            f"{sum(sizes) / intervals / 1e6:.1f} MB snappy per interval"
            + ("" if ok else "\n          NOT COUNTED: the receivers did not get the whole stream every interval")
        )
    if way == "rules":
        missed = (
            after["prometheus_rule_group_iterations_missed_total"]
            - before_metrics["prometheus_rule_group_iterations_missed_total"]
        )
        last = after["prometheus_rule_group_last_duration_seconds"]
        line += f"\n          the rule group's last evaluation {last:.2f} s, {missed:.0f} evaluations missed" + (
            "" if missed == 0 else " (NOT COUNTED: the group does not fit its interval here)"
        )
    return line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="1000,5000", help="comma-separated fleet sizes")
    parser.add_argument("--interval", type=int, default=15, help="scrape (and rule evaluation) interval, seconds")
    parser.add_argument("--intervals", type=int, default=6, help="intervals measured per way")
    parser.add_argument("--ways", default="scrape,push-1,push-4", help="comma-separated: scrape, push-N, rules")
    parser.add_argument("--rules", type=Path, help="a file holding one rule group (YAML or JSON), for the rules way")
    args = parser.parse_args()
    ways = [w for w in args.ways.split(",") if w]
    for way in ways:
        if way not in ("scrape", "rules") and not re.fullmatch(r"push-[1-9]", way):
            parser.error(f"unknown way {way!r}: scrape, push-N (N 1-9), rules")
    rules = None
    if "rules" in ways:
        if args.rules is None:
            parser.error("the rules way needs --rules FILE (one rule group)")
        loaded = yaml.safe_load(args.rules.read_text())
        rules = loaded["groups"][0] if "groups" in loaded else loaded
        rules = {**rules, "interval": f"{args.interval}s"}
    if not Path("/usr/bin/prometheus").exists():
        print("bench-prometheus-push: no Prometheus (Debian package 'prometheus'): nothing measured.")
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="gpufleet-bench-prometheus-push-"))
    for nodes in [int(n) for n in args.nodes.split(",") if n]:
        fleet = make_fleet(nodes, hot_every=10)
        print(
            f"{nodes} nodes: {fleet.series:,} exporter series, {fleet.series_of(DCGM_METRICS):,} of them sent "
            f"(the dcgm metrics a decision reads), scraped every {args.interval} s; {json.dumps(ways)}"
        )
        for way in ways:
            print(measure(fleet, way, args, workdir / str(nodes), rules), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
