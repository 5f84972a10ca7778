"""The thin Kubernetes edge: without a configured API the extender runs without one."""

from __future__ import annotations

import json

from gpufleet_extender import k8s_watch
from gpufleet_extender.cluster import ClusterState
from gpufleet_extender.config import KubeApiMode


def test_off_never_connects():
    assert k8s_watch.connect(KubeApiMode.OFF) is None


def test_auto_without_cluster_or_kubeconfig_runs_without_api(monkeypatch, tmp_path):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    assert k8s_watch.connect(KubeApiMode.AUTO) is None


def test_broken_kubeconfig_is_a_warning_not_a_crash(monkeypatch, tmp_path, caplog):
    config = tmp_path / "kubeconfig"
    config.write_text("this: is not a kubeconfig\n")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(config))
    assert k8s_watch.connect(KubeApiMode.AUTO) is None
    assert "running without the API" in caplog.text


class FakeResponse:
    def __init__(self, payload: dict):
        self.data = json.dumps(payload).encode()


def test_watcher_lists_then_applies_events_and_relists_after_an_error(monkeypatch):
    state = ClusterState("gpufleet.io/tenant", 120)
    listed: list[str] = []

    def list_namespaces(**kwargs):
        assert kwargs.get("_preload_content") is False
        listed.append("Namespace")
        items = [{"metadata": {"name": "img", "labels": {"gpufleet.io/tenant": "imagegen"}}}]
        if len(listed) > 1:  # the namespace added while the first watch ran
            items.append({"metadata": {"name": "llm", "labels": {"gpufleet.io/tenant": "llm"}}})
        return FakeResponse({"metadata": {"resourceVersion": "10"}, "items": items})

    streams: list[dict] = []
    applied: list[tuple] = []

    def stream(func, **kwargs):
        streams.append(kwargs)
        if len(streams) == 1:
            yield {
                "type": "ADDED",
                "raw_object": {
                    "metadata": {"name": "llm", "resourceVersion": "11", "labels": {"gpufleet.io/tenant": "llm"}}
                },
            }
            applied.append(state.namespace_tenant("llm"))  # the consumer applied ADDED before asking for more
            yield {"type": "ERROR", "raw_object": {"message": "too old resource version"}}
        else:
            watcher.stop()
            yield {"type": "DELETED", "raw_object": {"metadata": {"name": "img", "resourceVersion": "12"}}}

    watcher = k8s_watch.ClusterWatcher(None, state, lists={"Namespace": list_namespaces}, stream=stream)
    monkeypatch.setattr(k8s_watch, "_RETRY_SECONDS", (0,))
    watcher._run("Namespace")
    assert applied == [(True, "llm")]
    assert listed == ["Namespace", "Namespace"]  # listed again after the ERROR event
    assert streams[0]["resource_version"] == "10" and streams[0]["timeout_seconds"] > 0
    assert state.namespace_tenant("llm") == (True, "llm")
    assert state.namespace_tenant("img") == (False, None)  # deleted by the last event


class Unauthorized(Exception):
    """What the kubernetes client raises for a 401 (kubernetes.client.rest.ApiException's attributes)."""

    def __init__(self):
        super().__init__("(401)\nReason: Unauthorized\n")
        self.status = 401
        self.reason = "Unauthorized"
        self.body = json.dumps({"kind": "Status", "code": 401, "message": "Unauthorized", "reason": "Unauthorized"})


class Forbidden(Exception):
    """What the kubernetes client raises for a 403 (kubernetes.client.rest.ApiException's attributes)."""

    def __init__(self, verb: str, resource: str):
        super().__init__("(403)\nReason: Forbidden\nHTTP response headers: HTTPHeaderDict({...})\n")
        self.status = 403
        self.reason = "Forbidden"
        message = f'{resource} is forbidden: User "system:serviceaccount:gpufleet-system:gpufleet-extender" cannot '
        self.body = json.dumps({"kind": "Status", "code": 403, "message": message + f'{verb} resource "{resource}"'})


class RecordingStop:
    """Stands in for the watcher's stop event: records each retry delay, stops after ``rounds`` of them."""

    def __init__(self, rounds: int):
        self.rounds = rounds
        self.delays: list[float] = []

    def is_set(self) -> bool:
        return len(self.delays) >= self.rounds

    def wait(self, delay: float) -> bool:
        self.delays.append(delay)
        return self.is_set()


def test_a_refused_list_is_an_error_naming_the_permission_until_a_watch_is_accepted(caplog):
    state = ClusterState("gpufleet.io/tenant", 120)
    errors: list[tuple[str, str]] = []
    calls: list[str] = []

    def list_namespaces(**kwargs):
        calls.append("watch" if kwargs.get("watch") else "list")
        if len(calls) <= 2:
            raise Forbidden("list", "namespaces")
        return FakeResponse({"metadata": {"resourceVersion": "5"}, "items": []})

    def stream(func, **kwargs):
        refused_then = watcher.refused()
        func(watch=True, **kwargs)  # the API accepts the watch (what Watch.stream does first)
        assert refused_then and not watcher.refused()
        watcher._stop.rounds = 0  # stop after this watch
        yield {"type": "ADDED", "raw_object": {"metadata": {"name": "llm", "labels": {"gpufleet.io/tenant": "llm"}}}}

    watcher = k8s_watch.ClusterWatcher(
        None, state, lists={"Namespace": list_namespaces}, stream=stream, on_error=lambda *e: errors.append(e)
    )
    watcher._stop = RecordingStop(rounds=10)
    watcher._run("Namespace")

    assert calls == ["list", "list", "list", "watch"]
    assert errors == [("Namespace", "403"), ("Namespace", "403")]
    assert watcher._stop.delays == [1, 2]
    refusals = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(refusals) == 2
    message = refusals[0].getMessage()
    assert 'cannot list resource "namespaces"' in message and "403 Forbidden" in message
    assert "needs get, list and watch on pods, nodes and namespaces" in message
    assert "tenant pools cannot be trusted" in message and "HTTP response headers" not in message
    assert watcher.refused() == {}
    assert state.namespace_tenant("llm") == (True, "llm")


def test_a_refused_watch_backs_off_instead_of_relisting_every_second():
    state = ClusterState("gpufleet.io/tenant", 120)
    lists: list[int] = []

    def list_pods(**kwargs):
        if kwargs.get("watch"):
            raise Forbidden("watch", "pods")
        lists.append(1)
        return FakeResponse({"metadata": {"resourceVersion": "5"}, "items": []})

    def stream(func, **kwargs):
        yield from func(watch=True, **kwargs)

    watcher = k8s_watch.ClusterWatcher(None, state, lists={"Pod": list_pods}, stream=stream)
    watcher._stop = RecordingStop(rounds=6)
    watcher._run("Pod")

    # The list works, the watch is refused: wait longer each round (it relisted every second before).
    assert watcher._stop.delays == [1, 2, 5, 10, 30, 30]
    assert len(lists) == 6
    refused = watcher.refused()
    assert list(refused) == ["Pod"] and 'cannot watch resource "pods"' in refused["Pod"]


def test_describe_error_keeps_the_apis_message_on_one_line():
    assert k8s_watch.describe_error(Forbidden("watch", "pods")) == (
        403,
        '403 Forbidden: pods is forbidden: User "system:serviceaccount:gpufleet-system:gpufleet-extender" cannot '
        'watch resource "pods"',
    )
    assert k8s_watch.describe_error(ConnectionResetError("Response\nended prematurely")) == (
        None,
        "Response ended prematurely",
    )


def test_rejected_credentials_are_an_error_about_the_credentials(caplog):
    def list_nodes(**kwargs):
        raise Unauthorized()

    watcher = k8s_watch.ClusterWatcher(None, ClusterState("gpufleet.io/tenant", 120), lists={"Node": list_nodes})
    watcher._stop = RecordingStop(rounds=1)
    watcher._run("Node")

    assert watcher.refused() == {"Node": "401 Unauthorized: Unauthorized"}
    (record,) = [r for r in caplog.records if r.levelname == "ERROR"]
    assert "does not accept the extender's credentials" in record.getMessage()
