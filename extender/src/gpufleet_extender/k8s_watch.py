"""The thin Kubernetes side: connect when an API is configured, then list+watch into ClusterState.

All accounting lives in cluster.py; this file only moves JSON objects from the API into
``ClusterState.replace`` (after each list) and ``ClusterState.apply_event`` (for each watch event). One
daemon thread per kind (bound pods, nodes, namespaces); a failed watch logs, waits and lists again, waiting
longer after each failure until a watch is accepted. A list or watch the API refuses (401, 403: the
extender lacks a permission) is logged as an error naming what is missing and kept in ``refused()`` until a
watch of that kind is accepted; /readyz reports it and answers 503 meanwhile.
The ``kubernetes`` package is the optional ``k8s`` extra: without it the extender runs without the API.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from gpufleet_extender.cluster import ClusterState
from gpufleet_extender.config import KubeApiMode

log = logging.getLogger(__name__)

_WATCH_TIMEOUT_SECONDS = 60  # the server ends each watch after this; the loop re-checks stop() between
_RETRY_SECONDS = (1, 2, 5, 10, 30)
# What the API refusing a list or watch means, per HTTP status: a configuration problem, not a passing one.
_REFUSED = {
    401: "the API does not accept the extender's credentials (an expired or revoked ServiceAccount token?)",
    403: "the extender needs get, list and watch on pods, nodes and namespaces (the gpu_extender role's ClusterRole)",
}
_FEATURE = {"Pod": "in-flight accounting", "Node": "tenant pools", "Namespace": "tenant pools"}


def connect(mode: KubeApiMode) -> Any | None:
    """A kubernetes ApiClient per ``mode``, or None when no API is configured (or the extra is missing)."""
    if mode is KubeApiMode.OFF:
        return None
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    kubeconfig = os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    if mode is KubeApiMode.AUTO and not in_cluster and not Path(kubeconfig.split(os.pathsep)[0]).is_file():
        log.info("no Kubernetes API configured: in-flight accounting and namespace tenants are off")
        return None
    try:
        from kubernetes import client, config
    except ImportError:
        log.warning("KUBE_API=%s but the kubernetes package is missing (install gpufleet-extender[k8s])", mode)
        return None
    try:
        if mode is KubeApiMode.IN_CLUSTER or (mode is KubeApiMode.AUTO and in_cluster):
            config.load_incluster_config()
        else:
            config.load_kube_config()
    except Exception as exc:  # the library raises several unrelated types for a bad config
        log.warning("cannot load Kubernetes configuration (%s): running without the API", exc)
        return None
    return client.ApiClient()


ListFunction = Callable[..., Any]  # a CoreV1Api list_* method: (_preload_content=False, ...) -> response
StreamFunction = Callable[..., Iterable[Mapping[str, Any]]]  # kubernetes.watch.Watch().stream


def _watch_stream(func: ListFunction, **kwargs: Any) -> Iterable[Mapping[str, Any]]:
    from kubernetes import watch

    events: Iterable[Mapping[str, Any]] = watch.Watch().stream(func, **kwargs)
    return events


def describe_error(exc: BaseException) -> tuple[int | None, str]:
    """(HTTP status or None, one line) for an exception of the kubernetes client: the API's own message
    (``pods is forbidden: User ... cannot watch resource "pods" ...``) instead of the response headers."""
    status = getattr(exc, "status", None)
    if not isinstance(status, int):
        return None, " ".join(str(exc).split()) or type(exc).__name__
    message = None
    with contextlib.suppress(ValueError, TypeError, KeyError):
        message = json.loads(getattr(exc, "body", None) or "null")["message"]
    line = f"{status} {getattr(exc, 'reason', None) or ''}" + (f": {message}" if message else "")
    return status, " ".join(line.split())


class ClusterWatcher:
    """Lists then watches bound pods, nodes and namespaces into ``state``, one daemon thread per kind.

    ``lists`` and ``stream`` default to the kubernetes client's; tests pass fakes. ``on_error(kind, status)``
    is called for each failed list or watch (status: the HTTP status as text, or ``error``).
    """

    def __init__(
        self,
        api: Any,
        state: ClusterState,
        lists: Mapping[str, ListFunction] | None = None,
        stream: StreamFunction = _watch_stream,
        on_error: Callable[[str, str], None] = lambda kind, status: None,
    ):
        if lists is None:
            from kubernetes import client

            core = client.CoreV1Api(api)
            # Only bound pods matter for in-flight accounting; the field selector keeps the stream small.
            lists = {
                "Pod": lambda **kw: core.list_pod_for_all_namespaces(field_selector="spec.nodeName!=", **kw),
                "Node": lambda **kw: core.list_node(**kw),
                "Namespace": lambda **kw: core.list_namespace(**kw),
            }
        self._lists = lists
        self._stream = stream
        self._state = state
        self._on_error = on_error
        self._refused: dict[str, str] = {}
        self._listed: set[str] = set()  # kinds whose first list is in the state
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(kind,), name=f"watch-{kind.lower()}", daemon=True)
            for kind in self._lists
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()

    def unsynced(self) -> list[str]:
        """The kinds not listed yet since the start: until each is, the state misses what it holds (bound pods:
        the in-flight bindings), and decisions made on it could pile pods onto nodes that already took some."""
        return sorted(set(self._lists) - self._listed)

    def refused(self) -> dict[str, str]:
        """The kinds the API refuses to list or watch (a missing permission), with the API's message."""
        return dict(self._refused)

    def _run(self, kind: str) -> None:
        failures = 0

        def accepted() -> None:
            # A watch the API accepted (or an event from it): the permissions are there, the trouble is over.
            nonlocal failures
            failures = 0
            if self._refused.pop(kind, None) is not None:
                log.info("the Kubernetes API accepts the extender's %s watch again (%s)", kind, _FEATURE.get(kind))

        def watch(**kwargs: Any) -> Any:
            response = self._lists[kind](**kwargs)  # raises on 401/403 before any event
            accepted()
            return response

        while not self._stop.is_set():
            try:
                listed = json.loads(self._lists[kind](_preload_content=False).data)
                self._state.replace(kind, listed.get("items") or [])
                self._listed.add(kind)
                version = (listed.get("metadata") or {}).get("resourceVersion")
                # failures is reset only once a watch is accepted: a list that works followed by a watch that
                # is refused must not relist every second.
                while not self._stop.is_set():
                    events = self._stream(watch, resource_version=version, timeout_seconds=_WATCH_TIMEOUT_SECONDS)
                    for event in events:
                        if failures or kind in self._refused:
                            accepted()
                        raw = event.get("raw_object") or event.get("object") or {}
                        if event.get("type") == "ERROR":  # e.g. 410 Gone: list again
                            raise RuntimeError(raw.get("message", "watch error"))
                        self._state.apply_event(kind, event.get("type", ""), raw)
                        version = (raw.get("metadata") or {}).get("resourceVersion", version)
                        if self._stop.is_set():
                            return
            except Exception as exc:  # any API trouble: keep serving, list again later
                delay = _RETRY_SECONDS[min(failures, len(_RETRY_SECONDS) - 1)]
                failures += 1
                status, detail = describe_error(exc)
                self._on_error(kind, str(status or "error"))
                if status in _REFUSED:
                    self._refused[kind] = detail
                    log.error(
                        "the Kubernetes API refuses the extender's %s watch (%s): %s cannot be trusted until it "
                        "may; %s; /readyz answers 503 meanwhile; listing again in %ss",
                        kind,
                        detail,
                        _FEATURE.get(kind, kind),
                        _REFUSED[status],
                        delay,
                    )
                else:
                    log.warning("watching %ss failed (%s); listing again in %ss", kind, detail, delay)
                self._stop.wait(delay)
