"""The FastAPI application: ``create_app()`` wires settings, metrics source, cluster watch and routers.

The lifespan owns everything that runs in the background: the snapshot refresher task and, when a
Kubernetes API is configured, the watch threads feeding ClusterState. Tests pass their own settings,
source or cluster state and drive the app with TestClient (inside ``with``, so the lifespan runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI

from gpufleet_extender import __version__, k8s_watch
from gpufleet_extender.cluster import ClusterState
from gpufleet_extender.config import MetricsSourceKind, Settings, get_settings
from gpufleet_extender.metrics_source import (
    FileSource,
    MetricsSource,
    PrometheusSource,
    SnapshotRefresher,
    exporter_matchers,
)
from gpufleet_extender.routers import health, scheduler
from gpufleet_extender.service import BlindnessLog, Extender
from gpufleet_extender.snapshot import MetricsSnapshot
from gpufleet_extender.telemetry import Telemetry

log = logging.getLogger(__name__)

# Start-up waits this long for the first snapshot, then serves without it (/readyz says "loading" until it
# is in): probes answer at once however large the metrics are, and small sources are in before the first request.
FIRST_SNAPSHOT_WAIT_SECONDS = 0.05


# METRICS_SOURCE=push refreshes the snapshot this often at least: a pushed sample reaches the decision within it.
PUSH_REFRESH_SECONDS = 1.0


def build_push_source(settings: Settings, telemetry: Telemetry) -> MetricsSource:
    """The remote-write store, its receiver and the source reading it (the listener opens in the app's lifespan).
    Imported here: the pull form's server loads neither protobuf nor snappy."""
    from gpufleet_extender.remote_write import (
        REFUSAL_REASONS,
        PushSource,
        Receiver,
        SampleStore,
        TokenFile,
        WriteResult,
        listen,
    )

    assert settings.REMOTE_WRITE_TOKEN_FILE is not None  # Settings refuses METRICS_SOURCE=push without it
    store = SampleStore(settings.NODE_NAME_LABELS, settings.EXPORTER_JOB, settings.EXPORTER_NAMESPACE)
    for reason in REFUSAL_REASONS:
        telemetry.remote_write_refused.labels(reason)

    def written(result: WriteResult) -> None:
        telemetry.remote_write_samples.inc(result.accepted)
        telemetry.remote_write_out_of_order.inc(result.out_of_order)
        telemetry.remote_write_over_limit.inc(result.over_limit)

    receiver = Receiver(
        store,
        TokenFile(settings.REMOTE_WRITE_TOKEN_FILE),
        on_refused=lambda reason: telemetry.remote_write_refused.labels(reason).inc(),
        on_written=written,
    )
    return PushSource(
        store,
        settings.NODE_NAME_LABELS,
        max_skew=settings.METRICS_MAX_CLOCK_SKEW_SECONDS,
        listener=listen(
            receiver, settings.REMOTE_WRITE_ADDRESS, settings.REMOTE_WRITE_CERT_FILE, settings.REMOTE_WRITE_KEY_FILE
        ),
    )


def build_source(settings: Settings, telemetry: Telemetry | None = None) -> MetricsSource:
    if settings.METRICS_SOURCE is MetricsSourceKind.PUSH:
        return build_push_source(settings, telemetry or Telemetry())
    if settings.METRICS_SOURCE is MetricsSourceKind.FILE:
        assert settings.METRICS_FILE is not None  # Settings refuses METRICS_SOURCE=file without METRICS_FILE
        return FileSource(
            settings.METRICS_FILE, settings.NODE_NAME_LABELS, max_skew=settings.METRICS_MAX_CLOCK_SKEW_SECONDS
        )
    return PrometheusSource(
        settings.PROMETHEUS_URL,
        settings.NODE_NAME_LABELS,
        settings.PROMETHEUS_TIMEOUT_SECONDS,
        max_skew=settings.METRICS_MAX_CLOCK_SKEW_SECONDS,
        matchers=exporter_matchers(settings.EXPORTER_JOB, settings.EXPORTER_NAMESPACE),
        ca_file=settings.PROMETHEUS_CA_FILE,
        token_file=settings.PROMETHEUS_TOKEN_FILE,
    )


def create_app(
    settings: Settings | None = None,
    *,
    source: MetricsSource | None = None,
    cluster: ClusterState | None = None,
    watch_cluster: bool = True,
) -> FastAPI:
    """Build the app. ``cluster`` given: use it as is (tests feed it); else watch the API when configured."""
    settings = settings or get_settings()
    telemetry = Telemetry()
    source = source or build_source(settings, telemetry)
    extenders: list[Extender] = []  # the lifespan's, once it runs
    warmed = {"version": -1}
    warm_tasks: set[asyncio.Task[None]] = set()  # referenced until done (the loop keeps only weak references)

    def on_update(snapshot: MetricsSnapshot) -> None:
        telemetry.nodes_with_metrics.set(len(snapshot.nodes))
        if snapshot.version == warmed["version"]:
            return
        warmed["version"] = snapshot.version
        # A snapshot is ~10 objects per device and lives until the next one: keep the cyclic GC from
        # walking it again and again in the middle of requests (refcounting still frees old ones).
        gc.freeze()
        if extenders:
            # Evaluate the new snapshot's nodes for recent pod shapes between requests, before they need them.
            task = asyncio.get_running_loop().create_task(extenders[0].warm(), name="warm-decision-tables")
            warm_tasks.add(task)
            task.add_done_callback(warm_tasks.discard)

    refresh_seconds = settings.METRICS_REFRESH_SECONDS
    if settings.METRICS_SOURCE is MetricsSourceKind.PUSH:
        refresh_seconds = min(refresh_seconds, PUSH_REFRESH_SECONDS)
    refresher = SnapshotRefresher(
        source,
        refresh_seconds,
        on_error=lambda name: telemetry.source_errors.labels(name).inc(),
        on_update=on_update,
        on_fault=lambda name, fault, count: telemetry.metrics_faults.labels(name, fault).inc(count),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        start = getattr(source, "start", None)
        if start is not None:  # the push source's receiver listens from here on
            await start()
        watcher = None
        state = cluster
        if state is None and watch_cluster:
            api = k8s_watch.connect(settings.KUBE_API)
            if api is not None:
                state = ClusterState(settings.TENANT_LABEL, settings.INFLIGHT_MAX_SECONDS)
                watcher = k8s_watch.ClusterWatcher(
                    api, state, on_error=lambda kind, status: telemetry.kube_api_errors.labels(kind, status).inc()
                )
                watcher.start()
        # Kinds the API refuses to the extender (missing RBAC): /readyz reports them and answers 503.
        refused = watcher.refused if watcher is not None else dict
        app.state.kube_api_refused = refused
        # Kinds not listed yet since the start (the in-flight bindings among them): /readyz answers 503 until each is.
        app.state.kube_api_unsynced = watcher.unsynced if watcher is not None else list
        extender = Extender(
            settings,
            telemetry,
            state,
            snapshot_provider=lambda: refresher.snapshot,
            source_error=lambda: refresher.last_error,
            source_warnings=lambda: refresher.warnings,
            loading=lambda: not refresher.first_attempt.is_set(),
        )
        telemetry.bind_live_values(
            extender.metrics_age,
            lambda: extender.ready() and not refused(),
            lambda: extender.blind_reason() is not None,
            lambda: extender.stale_nodes().count,
        )
        app.state.extender = extender
        extenders.append(extender)
        blindness = BlindnessLog()

        def watch_blindness() -> None:
            blindness.observe(extender.blind_reason(), extender.policy.missing_policy_name, extender.stale_nodes())

        task = asyncio.create_task(refresher.run(after=watch_blindness), name="metrics-refresher")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(refresher.first_attempt.wait(), FIRST_SNAPSHOT_WAIT_SECONDS)
        try:
            yield
        finally:
            for running in (task, *warm_tasks):
                running.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await running
            if watcher is not None:
                watcher.stop()
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                await aclose()

    app = FastAPI(
        title="gpufleet scheduler extender",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.include_router(scheduler.router)
    app.include_router(health.router)
    app.state.refresher = refresher  # the current snapshot, for tests and tools in the same process
    return app
