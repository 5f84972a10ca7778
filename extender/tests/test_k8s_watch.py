"""The thin Kubernetes edge: without a configured API the extender runs without one."""

from __future__ import annotations

from gpufleet_extender import k8s_watch
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
