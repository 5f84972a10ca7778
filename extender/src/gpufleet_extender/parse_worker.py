"""Large METRICS_FILEs are parsed in a worker process, so parsing never holds this process's GIL.

The text parser (prometheus-client) is pure Python: a million-line file keeps a thread busy for minutes,
and a parsing thread takes the GIL from request handlers for 5 ms at a time. The worker process parses and
folds the file into a snapshot, then hands it back as pickled chunks of ``NodeRow`` tuples; the event loop
turns one chunk at a time into NodeMetrics and yields between chunks, so requests wait a chunk at most.
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import os
import pickle
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Generic, TypeVar

from gpufleet_extender.snapshot import MetricsSnapshot, NodeMetrics, NodeRow, node_from_row, node_row

CHUNK_NODES = 50  # nodes per chunk: well under a millisecond of object building on the event loop

Report = TypeVar("Report")
# (path, node labels, file mtime) -> the file's snapshot and what was found wrong in its data. The parser is
# injected (metrics_source passes its file loader), so this module does not import it back; it must be a module-level
# function: the worker process receives it pickled, by name.
Loader = Callable[[str, tuple[str, ...], float], tuple[MetricsSnapshot, Report]]


def load_rows(
    loader: Loader[Report], path: str, node_labels: tuple[str, ...], mtime: float
) -> tuple[list[bytes], Report]:
    """Run in the worker: the file's nodes as pickled chunks of NodeRows, and the loader's report of the data
    (its errors raise)."""
    snapshot, report = loader(path, node_labels, mtime)
    rows = [node_row(metrics) for metrics in snapshot.nodes.values()]
    chunks = [
        pickle.dumps(rows[start : start + CHUNK_NODES], protocol=pickle.HIGHEST_PROTOCOL)
        for start in range(0, len(rows), CHUNK_NODES)
    ]
    return chunks, report


def _worker_init(parent: int) -> None:
    """Worker initializer: yield the CPU to request handling, and end when the server process is gone however
    it ended (kill -9 included)."""
    os.nice(10)  # parsing is background work: on a busy node the server's event loop comes first

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


class WorkerUnavailable(RuntimeError):
    """No worker process can be started here (no /dev/shm, process limits): parse in a thread instead."""


class ParseWorker(Generic[Report]):
    """One worker process, started on first use (spawned: the parent runs watch threads, fork is unsafe), that
    parses with `loader`."""

    def __init__(self, loader: Loader[Report]) -> None:
        self._loader = loader
        self._pool: ProcessPoolExecutor | None = None
        self._busy = False
        self.usable = True
        # The rows of the last load and their objects: unchanged nodes keep their NodeMetrics object.
        self._kept: dict[str, tuple[NodeRow, NodeMetrics]] = {}

    async def load(
        self, path: str, node_labels: tuple[str, ...], mtime: float
    ) -> tuple[dict[str, NodeMetrics], Report]:
        loop = asyncio.get_running_loop()
        self._busy = True
        try:
            try:
                if self._pool is None:
                    self._pool = ProcessPoolExecutor(
                        max_workers=1,
                        mp_context=multiprocessing.get_context("spawn"),
                        initializer=_worker_init,
                        initargs=(os.getpid(),),
                    )
                future = loop.run_in_executor(self._pool, load_rows, self._loader, path, node_labels, mtime)
            except OSError as exc:  # semaphores or the process itself could not be created
                self.usable = False
                raise WorkerUnavailable(f"cannot start a parse worker process ({exc})") from exc
            chunks, report = await future
        except BrokenProcessPool:
            self._pool = None  # the worker died (killed, out of memory): the next load starts a new one
            raise
        finally:
            self._busy = False
        kept = self._kept
        fresh: dict[str, tuple[NodeRow, NodeMetrics]] = {}
        for chunk in chunks:
            for row in pickle.loads(chunk):
                before = kept.pop(row[0], None)  # the old rows go a chunk at a time, not all at once at the end
                fresh[row[0]] = (row, before[1] if before is not None and before[0] == row else node_from_row(row))
            # Hundreds of thousands of new long-lived objects would set off full collections of the cyclic GC,
            # each walking all of them (300 ms stalls at 26,000 nodes). Freeze them as they come, as the app
            # freezes each snapshot; refcounting still frees them with the snapshot.
            gc.freeze()
            await asyncio.sleep(0)  # let requests in between chunks
        self._kept = fresh
        return nodes_of(fresh), report

    def close(self) -> None:
        if self._pool is not None:
            # Idle: wait for a clean exit. Mid-parse: do not wait; the worker ends when it sees its parent gone.
            self._pool.shutdown(wait=not self._busy, cancel_futures=True)
            self._pool = None


def nodes_of(entries: Mapping[str, tuple[NodeRow, NodeMetrics]]) -> dict[str, NodeMetrics]:
    return {name: entry[1] for name, entry in entries.items()}
