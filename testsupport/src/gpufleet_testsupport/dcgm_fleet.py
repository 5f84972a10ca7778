"""A fleet's dcgm-exporter series as a real exporter publishes them, for the scale benchmarks and tests: every
instance of the Hong Kong pools' layouts (inventories/hongkong: finnlp 7 x 1g.10gb per GPU, imagegen 2 x 3g.40gb on
GPUs 0-3 and 3 x 2g.20gb + 1 x 1g.10gb on GPUs 4-7, llm whole GPUs), the exporter's full label set (UUID, PCI bus,
model, driver, the pod/namespace/container of a busy device), a few fields decisions do not read, and both host
label spellings (`Hostname` on even nodes, `hostname` on odd ones, as released and newer images write them).

`FleetExporter` serves the text in shards (one Prometheus target per SHARD_NODES nodes, as many exporters would be)
and a real Prometheus (Debian's package) scrapes them: `FleetPrometheus`.
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from gpufleet_testsupport import servers
from gpufleet_testsupport.ports import free_port
from gpufleet_testsupport.prometheus import launch
from gpufleet_testsupport.servers import QuietHandler

POOLS = ("finnlp", "imagegen", "llm")
# Per pool, per GPU: the MIG profiles of its instances (None: MIG off, a whole GPU).
LAYOUTS: dict[str, list[list[str] | None]] = {
    "finnlp": [["1g.10gb"] * 7 for _ in range(8)],
    "imagegen": [["3g.40gb"] * 2 for _ in range(4)] + [["2g.20gb"] * 3 + ["1g.10gb"] for _ in range(4)],
    "llm": [None] * 8,
}
MEMORY_MIB = {"1g.10gb": 9984, "2g.20gb": 19968, "3g.40gb": 40192, None: 81559}
# Fields a default dcgm-exporter also publishes per GPU, which no decision reads.
OTHER_FIELDS = (
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
)
SHARD_NODES = 100
# The target labels the dcgm_exporter role's scrape gives (job dcgm-exporter, the node agents' namespace): the
# extender's and GPUScore's queries are pinned to them.
EXPORTER_NAMESPACE = "gpufleet-node-agents"
HOT_UTIL = 0.95  # every instance of a hot node: above the default 0.8 threshold


@dataclass(frozen=True)
class Fleet:
    nodes: list[str]
    pools: dict[str, str]  # node -> pool
    hot: set[str]
    shards: list[bytes]  # exposition text per SHARD_NODES nodes

    @property
    def series(self) -> int:
        return sum(shard.count(b"\n") - shard.count(b"# ") for shard in self.shards)

    def series_of(self, metrics: tuple[str, ...] | list[str]) -> int:
        """How many of the fleet's series are of these metrics."""
        names = tuple(f"\n{m}{{".encode() for m in metrics)
        return sum((b"\n" + shard).count(name) for shard in self.shards for name in names)

    @property
    def devices(self) -> int:
        """Whole GPUs and MIG instances: the devices a decision weighs."""
        return sum(sum(len(p) if p else 1 for p in LAYOUTS[pool]) for pool in self.pools.values())


def node_name(index: int) -> str:
    return f"node-{index:05d}"


def _node_lines(node: str, index: int, pool: str, hot: bool, rng: random.Random) -> Iterator[str]:
    host_label = "Hostname" if index % 2 == 0 else "hostname"
    for gpu, profiles in enumerate(LAYOUTS[pool]):
        base = (
            f'gpu="{gpu}",UUID="GPU-{zlib.crc32(node.encode()):08x}-0000-4000-8000-{gpu:012x}",'
            f'pci_bus_id="00000000:{0x18 + gpu * 0x10:02X}:00.0",device="nvidia{gpu}",'
            f'modelName="NVIDIA H100 80GB HBM3",{host_label}="{node}",DCGM_FI_DRIVER_VERSION="550.54.15"'
        )
        for field in OTHER_FIELDS:
            yield f"{field}{{{base}}} {rng.randint(30, 1980)}"
        devices = [(None, "")]
        if profiles is not None:
            devices = [(p, f'GPU_I_PROFILE="{p}",GPU_I_ID="{i + 1}",') for i, p in enumerate(profiles)]
        for slot, (profile, instance) in enumerate(devices):
            util = HOT_UTIL if hot else round(rng.uniform(0.0, 0.7), 3)
            busy = hot or rng.random() < 0.5
            pod = f',container="main",namespace="tenant-{pool}",pod="{pool}-{index}-{gpu}-{slot}"' if busy else ""
            labels = instance + base + pod
            total = MEMORY_MIB[profile]
            used = round(total * util)
            if profile is None:
                yield f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {round(util * 100)}"
            yield f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{labels}}} {util:.6f}"
            yield f"DCGM_FI_DEV_FB_USED{{{labels}}} {used}"
            yield f"DCGM_FI_DEV_FB_FREE{{{labels}}} {total - used}"


def make_fleet(count: int, hot_every: int = 10, seed: int = 1) -> Fleet:
    """`count` nodes, pools in turn, every `hot_every`-th node hot (0: none)."""
    rng = random.Random(seed)
    nodes = [node_name(i) for i in range(count)]
    pools = {node: POOLS[i % len(POOLS)] for i, node in enumerate(nodes)}
    hot = {node for i, node in enumerate(nodes) if hot_every and i % hot_every == hot_every - 1}
    shards = []
    for start in range(0, count, SHARD_NODES):
        lines = []
        for index in range(start, min(start + SHARD_NODES, count)):
            node = nodes[index]
            lines.extend(_node_lines(node, index, pools[node], node in hot, rng))
        shards.append(("\n".join(lines) + "\n").encode())
    return Fleet(nodes, pools, hot, shards)


class FleetExporter:
    """Serves shard k at /metrics/k on 127.0.0.1 (a delay before each answer makes a slow exporter)."""

    def __init__(self, fleet: Fleet):
        shards = fleet.shards

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                try:
                    payload = shards[int(self.path.rsplit("/", 1)[1])]
                except (ValueError, IndexError):
                    self.send_error(404)
                    return
                self.send_body(payload)

        self.server = servers.start(Handler)
        self.port = self.server.server_address[1]
        self.shards = len(shards)

    def close(self) -> None:
        servers.stop(self.server)


class FleetPrometheus:
    """A real Prometheus on 127.0.0.1 scraping a FleetExporter's shards (job dcgm-exporter, namespace
    EXPORTER_NAMESPACE) every `interval` s, sending to `remote_write`'s receivers, evaluating the rule group `rules`
    (a benchmark's comparison) when given; `__enter__` returns its URL once every series of the fleet is in."""

    def __init__(
        self,
        fleet: Fleet,
        workdir: Path,
        binary: str = "/usr/bin/prometheus",
        interval: int = 30,
        remote_write: list[dict] | None = None,
        rules: dict | None = None,
    ):
        self.fleet, self.workdir, self.binary, self.interval = fleet, workdir, binary, interval
        self.remote_write = remote_write  # a remote_write list (push_config.remote_write) sent to as it scrapes
        self.rules = rules
        self.process: subprocess.Popen | None = None
        self.exporter: FleetExporter | None = None
        self.port = 0

    def __enter__(self) -> str:
        self.exporter = FleetExporter(self.fleet)
        targets = "".join(
            f"      - targets: ['127.0.0.1:{self.exporter.port}']\n"
            f"        labels: {{__metrics_path__: /metrics/{k}, namespace: {EXPORTER_NAMESPACE}}}\n"
            for k in range(self.exporter.shards)
        )
        config = self.workdir / "prometheus.yml"
        rule_files = ""
        if self.rules is not None:
            rules_file = self.workdir / "rules.yml"
            rules_file.write_text(json.dumps({"groups": [self.rules]}))  # JSON is YAML
            rule_files = f"rule_files: [{json.dumps(str(rules_file))}]\n"
        config.write_text(
            f"global: {{scrape_interval: {self.interval}s, scrape_timeout: {self.interval}s,"
            f" evaluation_interval: {self.interval}s}}\n{rule_files}"
            f"scrape_configs:\n  - job_name: dcgm-exporter\n    static_configs:\n{targets}"
            + (f"remote_write: {json.dumps(self.remote_write)}\n" if self.remote_write else "")
        )
        self.port = free_port()
        self._launch()
        url = self.url
        log = self.workdir / "prometheus.log"
        wanted = [('count({job="dcgm-exporter"})', self.fleet.series)]
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, KeyError, IndexError, ValueError):
                if all(
                    int(
                        httpx.get(f"{url}/api/v1/query", params={"query": query}, timeout=30).json()["data"]["result"][
                            0
                        ]["value"][1]
                    )
                    >= want
                    for query, want in wanted
                ):
                    return url
            time.sleep(1)
        self.__exit__()
        raise RuntimeError(f"Prometheus did not hold the fleet's series ({wanted}) in 300 s: see {log}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _launch(self) -> None:
        self.process, _ = launch(self.workdir, port=self.port, binary=self.binary)

    def kill(self) -> None:
        """SIGKILL the Prometheus (by its PID), as a node lost or an OOM kill would end it."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def restart(self, timeout: float = 120) -> float:
        """Start the Prometheus again on the same port and data directory (its WAL replayed); return when
        /-/ready answers 200, with that moment (time.time(), to compare with its samples' timestamps)."""
        self._launch()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return time.time()
            if self.process is not None and self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"Prometheus did not start again: see {self.workdir / 'prometheus.log'}")

    def __exit__(self, *exc: object) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.exporter:
            self.exporter.close()


class SlowPrometheus:
    """A Prometheus that is too slow: forwards each request to a real one after `delay` seconds (a Prometheus
    busy with a fleet larger than it was sized for, as its clients see it)."""

    def __init__(self, upstream: str, delay: float):
        class Handler(QuietHandler):
            def do_GET(self) -> None:
                time.sleep(delay)
                with contextlib.suppress(httpx.HTTPError, ConnectionError):
                    answer = httpx.get(upstream + self.path, timeout=30)
                    self.send_body(
                        answer.content, answer.headers.get("content-type", "application/json"), answer.status_code
                    )

        self.server = servers.start(Handler)
        self.url = servers.url(self.server)

    def close(self) -> None:
        servers.stop(self.server)
