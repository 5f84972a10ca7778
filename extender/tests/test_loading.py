"""Loading metrics never blocks answers: large files parse in a worker process, start-up serves probes at once."""

from __future__ import annotations

import asyncio
import os

from fastapi.testclient import TestClient
from gpufleet_testsupport.exposition import DeviceLoad

from gpufleet_extender import app as app_module
from gpufleet_extender import metrics_source
from gpufleet_extender.app import create_app
from gpufleet_extender.config import load_settings
from gpufleet_extender.metrics_source import FileSource, load_file
from gpufleet_extender.snapshot import MetricsSnapshot, snapshot_of

from extender_helpers import write_metrics

NOW = 1_700_000_000


def fleet(nodes: int, util: float = 0.3) -> dict:
    return {f"n{i:04d}": [DeviceLoad(gpu, util, 1000.0 * gpu) for gpu in range(8)] for i in range(nodes)}


def test_a_large_file_parsed_in_the_worker_gives_the_snapshot_a_thread_gives(tmp_path):
    path = write_metrics(tmp_path / "dcgm.prom", fleet(300), timestamp_ms=NOW * 1000)
    assert path.stat().st_size >= metrics_source.WORKER_MIN_BYTES
    source = FileSource(path, ("Hostname",))

    async def fetch_twice() -> tuple[MetricsSnapshot, MetricsSnapshot]:
        try:
            first = await source.fetch(1)
            # One node changes; the file is rewritten (new mtime), so every node is read again.
            changed = fleet(300)
            changed["n0007"] = [DeviceLoad(0, 0.99, 80000.0)]
            write_metrics(path, changed, timestamp_ms=NOW * 1000)
            os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
            return first, await source.fetch(2)
        finally:
            await source.aclose()

    first, second = asyncio.run(fetch_twice())
    direct, _ = load_file(path, ("Hostname",), default_time=0.0, taken_at=0.0, version=2)
    assert dict(second.nodes) == dict(direct.nodes)
    assert second.newest_sample == direct.newest_sample == NOW and second.version == 2
    # Unchanged nodes keep their objects: the decision tables re-evaluate only the node that changed.
    kept = [name for name in first.nodes if second.nodes[name] is first.nodes[name]]
    assert len(kept) == 299 and "n0007" not in kept


class SlowSource:
    """A metrics source whose first answer waits until the test releases it."""

    name = "slow"

    def __init__(self, snapshot: MetricsSnapshot):
        self.release = asyncio.Event()
        self._snapshot = snapshot

    async def fetch(self, version: int) -> MetricsSnapshot | None:
        await self.release.wait()
        return snapshot_of(self._snapshot.nodes, self._snapshot.taken_at, version)


def test_probes_answer_while_the_first_snapshot_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(app_module, "FIRST_SNAPSHOT_WAIT_SECONDS", 0.05)  # production's: serve while it loads
    path = write_metrics(tmp_path / "dcgm.prom", fleet(2), timestamp_ms=NOW * 1000)
    settings = load_settings(METRICS_SOURCE="file", METRICS_FILE=str(path), KUBE_API="off", METRICS_MAX_AGE_SECONDS=0)
    source = SlowSource(load_file(path, ("Hostname",), NOW, NOW, 1)[0])
    with TestClient(create_app(settings, source=source)) as client:
        assert client.get("/healthz").status_code == 200
        loading = client.get("/readyz")
        assert loading.status_code == 503 and loading.json()["loading"] is True
        client.portal.call(source.release.set)
        for _ in range(100):
            if client.get("/readyz").status_code == 200:
                break
            client.portal.call(asyncio.sleep, 0.02)
        ready = client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["loading"] is False


def test_without_a_worker_process_large_files_parse_in_a_thread(tmp_path, monkeypatch):
    from gpufleet_extender import parse_worker

    def no_processes(*args, **kwargs):
        raise OSError(38, "Function not implemented")  # e.g. no /dev/shm for the pool's semaphores

    monkeypatch.setattr(parse_worker, "ProcessPoolExecutor", no_processes)
    path = write_metrics(tmp_path / "dcgm.prom", fleet(300), timestamp_ms=NOW * 1000)
    source = FileSource(path, ("Hostname",))
    snapshot = asyncio.run(source.fetch(1))
    assert len(snapshot.nodes) == 300 and not source._worker.usable
