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
