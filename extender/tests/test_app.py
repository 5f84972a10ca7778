"""The HTTP app through TestClient: verbs, limits, probes, /metrics, tenant pools, the answer memo."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
from fastapi.testclient import TestClient
from gpufleet_testsupport.scheduler_requests import make_pod, names_args, node_obj, nodes_args

from gpufleet_extender import k8s_watch
from gpufleet_extender.app import create_app
from gpufleet_extender.cluster import ClusterState

from extender_helpers import file_settings, gpus, mig, write_metrics

FLEET = {
    "hk-gpu-01": gpus(0.1, 0.2, 0.95, 0.97),
    "hk-gpu-02": gpus(0.9, 0.85, 0.99, 0.97),
    "hk-gpu-03": [*mig(0, "2g.20gb", 0.91, 0.95, mem_used_mib=8600, total=20480), *mig(1, "3g.40gb", 0.1)],
}
GPU_POD = make_pod({"nvidia.com/gpu": "1"})


@pytest.fixture
def metrics_file(tmp_path):
    return write_metrics(tmp_path / "dcgm.prom", FLEET)


@pytest.fixture
def client(metrics_file):
    with TestClient(create_app(file_settings(metrics_file)), raise_server_exceptions=False) as test_client:
        yield test_client


def test_filter_names_form(client):
    answer = client.post("/filter", json=names_args(GPU_POD, ["hk-gpu-01", "hk-gpu-02", "hk-gpu-03", "hk-gpu-99"]))
    assert answer.status_code == 200
    result = answer.json()
    # hk-gpu-03 has no whole GPU in the metrics, hk-gpu-99 no metrics at all: ON_MISSING_METRICS=allow.
    assert result["NodeNames"] == ["hk-gpu-01", "hk-gpu-03", "hk-gpu-99"]
    assert result["Nodes"] is None
    assert result["FailedNodes"] == {
        "hk-gpu-02": "hk-gpu-02: no nvidia.com/gpu GPU below thresholds (best: util 0.85 > 0.80, mem 0.10)"
    }


def test_filter_mig_profile(client):
    pod = make_pod({"nvidia.com/mig-2g.20gb": "1"})
    result = client.post("/filter", json=names_args(pod, ["hk-gpu-03"])).json()
    assert result["NodeNames"] == []
    assert result["FailedNodes"]["hk-gpu-03"] == (
        "hk-gpu-03: no nvidia.com/mig-2g.20gb instance below thresholds (best: util 0.91 > 0.80, mem 0.42)"
    )
    pod = make_pod({"nvidia.com/mig-3g.40gb": "1"})
    assert client.post("/filter", json=names_args(pod, ["hk-gpu-03"])).json()["NodeNames"] == ["hk-gpu-03"]


def test_filter_full_nodes_form_returns_the_node_objects(client):
    nodes = [node_obj("hk-gpu-01"), node_obj("hk-gpu-02")]
    result = client.post("/filter", json=nodes_args(GPU_POD, nodes)).json()
    assert result["NodeNames"] is None
    assert result["Nodes"]["items"] == [nodes[0]]
    assert list(result["FailedNodes"]) == ["hk-gpu-02"]


def test_prioritize_one_score_per_input_node_in_order(client):
    names = ["hk-gpu-02", "hk-gpu-01", "hk-gpu-99", "hk-gpu-01"]
    result = client.post("/prioritize", json=names_args(GPU_POD, names)).json()
    assert [entry["Host"] for entry in result] == names
    scores = {entry["Host"]: entry["Score"] for entry in result}
    assert scores["hk-gpu-01"] > scores["hk-gpu-02"]
    assert all(isinstance(entry["Score"], int) and 0 <= entry["Score"] <= 10 for entry in result)


def test_no_gpu_pod_passes_untouched_with_neutral_scores(client):
    pod = make_pod({"cpu": "4"})
    names = ["hk-gpu-02", "anything"]
    assert client.post("/filter", json=names_args(pod, names)).json()["NodeNames"] == names
    assert {e["Score"] for e in client.post("/prioritize", json=names_args(pod, names)).json()} == {5}


def test_decisions_follow_the_file(client, metrics_file):
    before = client.post("/filter", json=names_args(GPU_POD, ["hk-gpu-02"])).json()
    assert before["NodeNames"] == []
    write_metrics(metrics_file, {**FLEET, "hk-gpu-02": gpus(0.1)})
    stat = os.stat(metrics_file)
    os.utime(metrics_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the refresher polls the file in the background
        client.app.state.extender  # noqa: B018
        after = client.post("/filter", json=names_args(GPU_POD, ["hk-gpu-02"])).json()
        if after["NodeNames"] == ["hk-gpu-02"]:
            break
        time.sleep(0.1)
    assert after["NodeNames"] == ["hk-gpu-02"]


@pytest.mark.parametrize("verb", ["/filter", "/prioritize"])
def test_bad_bodies_get_4xx_with_a_message(client, verb):
    cases = [
        (b"not json", 400, "malformed JSON"),
        (b'{"NodeNames": ["a"]}', 422, "Pod"),
        (b'{"Pod": {}, "NodeNames": [1]}', 422, "NodeNames[0]"),
        (b'{"Pod": {}, "Nodes": null, "NodeNames": null}', 422, "exactly one"),
        (json.dumps(names_args(make_pod({"nvidia.com/gpu": "1.5"}), ["a"])).encode(), 422, "whole number"),
    ]
    for raw, status, fragment in cases:
        answer = client.post(verb, content=raw, headers={"content-type": "application/json"})
        assert answer.status_code == status, raw
        assert fragment in answer.json()["detail"]
    assert client.get("/healthz").status_code == 200  # still serving


def test_oversized_bodies_are_refused_before_reading(metrics_file):
    app = create_app(file_settings(metrics_file, MAX_BODY_BYTES=2048))
    with TestClient(app) as small:
        big = names_args(GPU_POD, [f"node-{i:05d}" for i in range(500)])
        answer = small.post("/filter", json=big)
        assert answer.status_code == 413 and "MAX_BODY_BYTES (2048 bytes)" in answer.json()["detail"]

        def chunks():  # no Content-Length: counted while streaming
            for _ in range(10):
                yield b" " * 1024

        assert small.post("/filter", content=chunks()).status_code == 413
        assert small.post("/filter", json=names_args(GPU_POD, ["hk-gpu-01"])).status_code == 200
        metrics = small.get("/metrics").text
        assert 'gpufleet_extender_bad_requests_total{status="413",verb="filter"} 2.0' in metrics


def test_probes_and_metrics(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["metrics_source"] == "file"
    assert ready.json()["kube_api_errors"] == {}
    client.post("/filter", json=names_args(GPU_POD, ["hk-gpu-01", "hk-gpu-02", "hk-gpu-99"]))
    metrics = client.get("/metrics").text
    assert 'gpufleet_extender_filter_decisions_total{outcome="pass"} 1.0' in metrics
    assert 'gpufleet_extender_filter_decisions_total{outcome="overloaded"} 1.0' in metrics
    assert 'gpufleet_extender_filter_decisions_total{outcome="missing_metrics_allowed"} 1.0' in metrics
    assert 'gpufleet_extender_request_duration_seconds_count{verb="filter"} 1.0' in metrics
    assert "gpufleet_extender_nodes_with_metrics 3.0" in metrics


def test_readyz_503_while_metrics_are_stale_and_policy_denies(tmp_path):
    path = write_metrics(tmp_path / "old.prom", FLEET)
    old = time.time() - 120
    os.utime(path, (old, old))
    with TestClient(create_app(file_settings(path, ON_MISSING_METRICS="deny"))) as deny:
        ready = deny.get("/readyz")
        assert ready.status_code == 503 and ready.json()["metrics_age_seconds"] > 100
        result = deny.post("/filter", json=names_args(GPU_POD, ["hk-gpu-01"])).json()
        assert result["NodeNames"] == []
        assert "s old (max 30s) (ON_MISSING_METRICS=deny)" in result["FailedNodes"]["hk-gpu-01"]
        assert 'outcome="missing_metrics_denied"' in deny.get("/metrics").text
    with TestClient(create_app(file_settings(path, ON_MISSING_METRICS="allow"))) as allow:
        assert allow.get("/readyz").status_code == 200


def test_blindness_shows_on_readyz_the_gauge_and_the_log_when_the_data_ages_out(tmp_path, caplog):
    path = write_metrics(tmp_path / "dcgm.prom", FLEET)
    with TestClient(create_app(file_settings(path, METRICS_REFRESH_SECONDS=0.05))) as client:
        fresh = client.get("/readyz").json()
        assert fresh["metrics_blind"] is False and fresh["metrics_blind_reason"] is None
        assert "gpufleet_extender_metrics_blind 0.0" in client.get("/metrics").text
        # The exporter stops writing: the same file, 40 s old against a maximum of 30 s (the case).
        old = time.time() - 40
        with caplog.at_level("WARNING", logger="gpufleet_extender.service"):
            os.utime(path, (old, old))
            deadline = time.monotonic() + 10
            while not client.get("/readyz").json()["metrics_blind"] and time.monotonic() < deadline:
                time.sleep(0.05)
            ready = client.get("/readyz")
            time.sleep(0.3)  # more refreshes: the state lasts, so no second line until BLIND_WARN_EVERY_SECONDS
        # ON_MISSING_METRICS=allow still answers (a 503 would take the extender out of its Service) but says so.
        assert ready.status_code == 200 and ready.json()["metrics_blind"] is True
        assert "newest GPU sample is 40s old (METRICS_MAX_AGE_SECONDS 30)" in ready.json()["metrics_blind_reason"]
        assert "gpufleet_extender_metrics_blind 1.0" in client.get("/metrics").text
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "GPU" in r.getMessage()]
        assert len(warnings) == 1 and "decisions use no GPU metrics (ON_MISSING_METRICS=allow)" in warnings[0]
        # ... and the filter passes the hot node it refused before, as the policy says: which is why it is shown.
        result = client.post("/filter", json=names_args(GPU_POD, ["hk-gpu-02"])).json()
        assert result["NodeNames"] == ["hk-gpu-02"]


def test_blindness_log_repeats_while_it_lasts_and_says_when_it_ends(caplog):
    from gpufleet_extender.service import BLIND_WARN_EVERY_SECONDS, BlindnessLog

    now = [0.0]
    blindness = BlindnessLog(clock=lambda: now[0])
    with caplog.at_level("WARNING", logger="gpufleet_extender.service"):
        for step in (0.0, 1.0, BLIND_WARN_EVERY_SECONDS - 1, BLIND_WARN_EVERY_SECONDS + 0.5):
            now[0] = step
            blindness.observe("no GPU metrics loaded", "allow")
        now[0] += 1
        blindness.observe(None, "allow")
        blindness.observe(None, "allow")
    lines = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert lines == [
        "decisions use no GPU metrics (ON_MISSING_METRICS=allow): no GPU metrics loaded",
        "decisions use no GPU metrics (ON_MISSING_METRICS=allow): no GPU metrics loaded",
        "decisions use GPU metrics again",
    ]


def test_readyz_503_while_the_kubernetes_api_refuses_a_watch(metrics_file, monkeypatch):
    message = '403 Forbidden: pods is forbidden: User "system:serviceaccount:x:y" cannot watch resource "pods"'

    class RefusedWatcher:
        def __init__(self, api, state, on_error):
            self.on_error = on_error

        def start(self):
            self.on_error("Pod", "403")

        def stop(self):
            pass

        def refused(self):
            return {"Pod": message}

        def unsynced(self):
            return []

    monkeypatch.setattr(k8s_watch, "connect", lambda mode: object())
    monkeypatch.setattr(k8s_watch, "ClusterWatcher", RefusedWatcher)
    with TestClient(create_app(file_settings(metrics_file))) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["ready"] is False and ready.json()["kube_api_errors"] == {"Pod": message}
        metrics = client.get("/metrics").text
        assert 'gpufleet_extender_kube_api_errors_total{kind="Pod",status="403"} 1.0' in metrics
        assert "gpufleet_extender_ready 0.0" in metrics


def test_readyz_503_when_the_source_never_answered(tmp_path):
    with TestClient(create_app(file_settings(tmp_path / "absent.prom", ON_MISSING_METRICS="deny"))) as deny:
        ready = deny.get("/readyz")
        assert ready.status_code == 503
        assert "cannot stat METRICS_FILE" in ready.json()["metrics_source_error"]
        assert 'gpufleet_extender_metrics_source_errors_total{source="file"}' in deny.get("/metrics").text
        assert ready.json()["metrics_blind"] is True
        assert ready.json()["metrics_blind_reason"].startswith("no GPU metrics loaded; last refresh: cannot stat")


def test_tenant_pools_full_form_with_namespace_labels_from_the_cluster(metrics_file):
    cluster = ClusterState("gpufleet.io/tenant", 120)
    cluster.replace("Namespace", [{"metadata": {"name": "team-a", "labels": {"gpufleet.io/tenant": "imagegen"}}}])
    with TestClient(create_app(file_settings(metrics_file), cluster=cluster)) as tenants:
        nodes = [
            node_obj("hk-gpu-01", {"gpufleet.io/tenant": "llm"}),
            node_obj("hk-gpu-03", {"gpufleet.io/tenant": "imagegen"}),
        ]
        result = tenants.post("/filter", json=nodes_args(GPU_POD, nodes)).json()
        assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["hk-gpu-03"]
        assert "tenant pool 'llm'" in result["FailedAndUnresolvableNodes"]["hk-gpu-01"]


def test_generic_reasons_name_no_node_pool_or_load_and_the_log_keeps_the_details(metrics_file, caplog):
    cluster = ClusterState("gpufleet.io/tenant", 120)
    cluster.replace("Namespace", [{"metadata": {"name": "team-a", "labels": {"gpufleet.io/tenant": "imagegen"}}}])
    settings = file_settings(metrics_file, FILTER_REASONS="generic")
    with (
        caplog.at_level("INFO", logger="gpufleet_extender.service"),
        TestClient(create_app(settings, cluster=cluster)) as app,
    ):
        hot = app.post("/filter", json=names_args(GPU_POD, ["hk-gpu-02"])).json()
        nodes = [
            node_obj("hk-gpu-01", {"gpufleet.io/tenant": "llm"}),
            node_obj("hk-gpu-03", {"gpufleet.io/tenant": "imagegen"}),
        ]
        pools = app.post("/filter", json=nodes_args(GPU_POD, nodes)).json()
    assert hot["FailedNodes"] == {"hk-gpu-02": "GPU devices of the requested kind are loaded above the thresholds"}
    assert pools["FailedAndUnresolvableNodes"] == {"hk-gpu-01": "node is not in this namespace's tenant pool"}
    # The pod waits (no node passed): an operator finds the node, its load and the thresholds in the log.
    assert "hk-gpu-02: no nvidia.com/gpu GPU below thresholds (best: util 0.85 > 0.80" in caplog.text


def test_without_cluster_knowledge_tenant_labels_are_not_enforced(client):
    nodes = [node_obj("hk-gpu-01", {"gpufleet.io/tenant": "llm"})]
    assert len(client.post("/filter", json=nodes_args(GPU_POD, nodes)).json()["Nodes"]["items"]) == 1


def test_repeated_candidate_list_answers_stay_right_after_the_metrics_change(client, metrics_file):
    request = names_args(GPU_POD, ["hk-gpu-01", "hk-gpu-02"])
    first = client.post("/prioritize", json=request).json()
    assert client.post("/prioritize", json=request).json() == first  # from the memo
    write_metrics(metrics_file, {**FLEET, "hk-gpu-01": gpus(0.99, 0.99), "hk-gpu-02": gpus(0.0)})
    stat = os.stat(metrics_file)
    os.utime(metrics_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and client.post("/prioritize", json=request).json() == first:
        time.sleep(0.1)
    flipped = {e["Host"]: e["Score"] for e in client.post("/prioritize", json=request).json()}
    assert flipped["hk-gpu-02"] > flipped["hk-gpu-01"]


def test_nodes_stale_while_others_are_fresh_show_on_readyz_the_gauge_and_the_log(tmp_path, caplog):
    """One exporter behind (its samples 45 s old against a maximum of 30 s) while the others are fresh: the extender
    is not blind, yet decisions use no metrics for that node, and ON_MISSING_METRICS=allow passes it hot."""
    from extender_helpers import render_exposition

    now_ms = int(time.time() * 1000)
    fresh = render_exposition({k: v for k, v in FLEET.items() if k != "hk-gpu-02"}, timestamp_ms=now_ms)
    behind = render_exposition({"hk-gpu-02": FLEET["hk-gpu-02"]}, timestamp_ms=now_ms - 45_000)
    body_lines = [line for line in behind.splitlines() if not line.startswith("#")]
    path = tmp_path / "dcgm.prom"
    path.write_text(fresh + "\n".join(body_lines) + "\n")
    settings = file_settings(path, METRICS_REFRESH_SECONDS=0.05)
    with caplog.at_level("WARNING", logger="gpufleet_extender.service"), TestClient(create_app(settings)) as client:
        time.sleep(0.3)  # several refreshes: a lasting state is logged once until BLIND_WARN_EVERY_SECONDS
        ready = client.get("/readyz").json()
        metrics = client.get("/metrics").text
        result = client.post("/filter", json=names_args(GPU_POD, ["hk-gpu-02"])).json()
    assert ready["metrics_blind"] is False
    assert ready["metrics_stale_nodes"] == 1 and ready["metrics_stale_node_names"] == ["hk-gpu-02"]
    assert "gpufleet_extender_metrics_stale_nodes 1.0" in metrics
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "nodes" in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].startswith("decisions use no GPU metrics for 1 of 3 nodes (ON_MISSING_METRICS=allow)")
    assert "older than METRICS_MAX_AGE_SECONDS 30 (the oldest 45s) on hk-gpu-02" in warnings[0]
    assert result["NodeNames"] == ["hk-gpu-02"]  # every GPU of it at 0.85 or more, passed for want of metrics


def test_stale_nodes_log_names_a_few_and_counts_all_and_says_when_it_ends(caplog):
    from gpufleet_extender.service import BLIND_WARN_EVERY_SECONDS, BlindnessLog, StaleNodes

    now = [0.0]
    blindness = BlindnessLog(clock=lambda: now[0])
    seven = StaleNodes(7, 100, 44.6, ("a", "b", "c", "d", "e"), 30.0)
    with caplog.at_level("WARNING", logger="gpufleet_extender.service"):
        for step, stale in ((0.0, seven), (1.0, seven), (BLIND_WARN_EVERY_SECONDS + 0.5, seven)):
            now[0] = step
            blindness.observe(None, "allow", stale)
        blindness.observe("no GPU metrics loaded", "allow", seven)  # the whole fleet: the blind line, not this one
        blindness.observe(None, "allow", StaleNodes(0, 100, 0.0, (), 30.0))
    lines = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    partial = (
        "decisions use no GPU metrics for 7 of 100 nodes (ON_MISSING_METRICS=allow): samples older than "
        "METRICS_MAX_AGE_SECONDS 30 (the oldest 45s) on a, b, c, d, e and 2 more"
    )
    assert lines == [
        partial,
        partial,
        "decisions use no GPU metrics (ON_MISSING_METRICS=allow): no GPU metrics loaded",
        "decisions use GPU metrics again",
    ]


def test_a_restarted_extender_is_ready_only_once_the_bindings_before_it_are_counted(tmp_path, monkeypatch):
    # Two identical nodes; pods were bound to hk-gpu-a just before the extender (re)started, and have not started
    # yet, so their load is in no metric: only the in-flight accounting, rebuilt from the API, knows of them.
    metrics = write_metrics(
        tmp_path / "dcgm.prom", {"hk-gpu-a": gpus(0.1, 0.1, 0.1, 0.1), "hk-gpu-b": gpus(0.1, 0.1, 0.1, 0.1)}
    )
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    bound = [
        {
            "metadata": {"name": f"early-{n}", "namespace": "team-a", "resourceVersion": "7"},
            "spec": {
                "nodeName": "hk-gpu-a",
                "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            },
            "status": {
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now}],
            },
        }
        for n in range(4)
    ]
    listed = threading.Event()

    def list_pods(**kwargs):
        listed.wait(30)  # the API answers the first list late (a restart in a busy cluster)
        return type(
            "Response", (), {"data": json.dumps({"metadata": {"resourceVersion": "7"}, "items": bound}).encode()}
        )

    def quiet_stream(func, **kwargs):
        time.sleep(0.05)
        return iter(())

    class Watcher(k8s_watch.ClusterWatcher):
        def __init__(self, api, state, on_error):
            super().__init__(api, state, lists={"Pod": list_pods}, stream=quiet_stream, on_error=on_error)

    monkeypatch.setattr(k8s_watch, "connect", lambda mode: object())
    monkeypatch.setattr(k8s_watch, "ClusterWatcher", Watcher)
    names = names_args(GPU_POD, ["hk-gpu-a", "hk-gpu-b"])
    with TestClient(create_app(file_settings(metrics, SCORING_STRATEGY="spread"))) as client:
        waiting = client.get("/readyz")
        assert waiting.status_code == 503 and waiting.json()["kube_api_unsynced"] == ["Pod"]
        listed.set()
        deadline = time.monotonic() + 10
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, client.get("/readyz").json()
            time.sleep(0.05)
        assert client.get("/readyz").json()["kube_api_unsynced"] == []
        scores = {entry["Host"]: entry["Score"] for entry in client.post("/prioritize", json=names).json()}
    # The first decision once ready counts the four bindings: every GPU of hk-gpu-a is taken, hk-gpu-b is preferred.
    assert scores["hk-gpu-b"] > scores["hk-gpu-a"], scores
