"""Metrics-source faults end to end: a fake Prometheus on 127.0.0.1 (and the file source) misbehaving in one
way at a time, against the whole app. For each fault: what the policy decides for the node concerned, what
/readyz says, and which counter moved.

METRICS_REFRESH_SECONDS is an hour: the app refreshes at start-up only (the lifespan's first refresh and the
refresher loop's first round). Counters are compared with the refreshes the fake Prometheus served.
"""

from __future__ import annotations

import json
import math
import re
import time

import pytest
from fastapi.testclient import TestClient
from gpufleet_testsupport import servers
from gpufleet_testsupport.exposition import render_exposition
from gpufleet_testsupport.scheduler_requests import make_pod, names_args
from gpufleet_testsupport.servers import QuietHandler
from prometheus_client.parser import text_string_to_metric_families

from gpufleet_extender.app import create_app
from gpufleet_extender.config import load_settings

from extender_helpers import gpus

GPU_POD = make_pod({"nvidia.com/gpu": "1"})
TIMEOUT = 0.5  # PROMETHEUS_TIMEOUT_SECONDS of these tests


def series(name: str, node: str, value, gpu: str = "0") -> dict:
    return {"metric": {"__name__": name, "Hostname": node, "gpu": gpu}, "value": [time.time(), str(value)]}


def healthy(node: str, util_percent: float = 10) -> list[dict]:
    return [
        series("DCGM_FI_DEV_GPU_UTIL", node, util_percent),
        series("DCGM_FI_DEV_FB_USED", node, 1000),
        series("DCGM_FI_DEV_FB_FREE", node, 79000),
    ]


class FakePrometheus:
    """Answers /api/v1/query like Prometheus, or misbehaves as ``mode`` says."""

    def __init__(self):
        self.mode = "ok"
        self.hits = 0  # series queries received: one per refresh
        self.series: list[dict] = []
        self.times: dict[str, float] = {}  # node -> newest sample time (the timestamp() query)
        fake = self

        class Handler(QuietHandler):
            def do_GET(self):
                query = self.path
                times_query = "timestamp" in query
                if not times_query:
                    fake.hits += 1
                if fake.mode == "slow":
                    time.sleep(TIMEOUT * 4)
                if fake.mode == "garbage":
                    return self._send(b"<html>this is not Prometheus</html>{", content_type="text/html")
                if fake.mode == "matrix":
                    return self._send(json.dumps({"status": "success", "data": {"resultType": "matrix"}}).encode())
                if times_query:
                    result = [
                        {"metric": {"Hostname": n}, "value": [time.time(), str(t)]} for n, t in fake.times.items()
                    ]
                else:
                    result = fake.series
                payload = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
                if fake.mode == "trickle":
                    return self._trickle(payload)
                self._send(payload)

            def _send(self, payload: bytes, content_type: str = "application/json"):
                self.send_body(payload, content_type)

            def _trickle(self, payload: bytes):
                # One byte every TIMEOUT/2: each read is within httpx's per-read timeout, the whole never is.
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                try:
                    for byte in payload[:40]:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(TIMEOUT / 2)
                except OSError:
                    pass  # the extender gave up, as it should

        self.handler = Handler

    def __enter__(self):
        self.server = servers.start(self.handler)
        self.url = servers.url(self.server)
        return self

    def __exit__(self, *exc):
        servers.stop(self.server)


@pytest.fixture
def prometheus():
    with FakePrometheus() as fake:
        now = time.time()
        fake.series = healthy("n1") + healthy("n2")
        fake.times = {"n1": now - 1, "n2": now - 1}
        yield fake


def app_for(policy: str, **settings):
    values = {
        "KUBE_API": "off",
        "METRICS_REFRESH_SECONDS": 3600,
        "ON_MISSING_METRICS": policy,
        **settings,
    }
    return create_app(load_settings(**values))


def prometheus_app(fake: FakePrometheus, policy: str):
    return app_for(policy, PROMETHEUS_URL=fake.url, PROMETHEUS_TIMEOUT_SECONDS=TIMEOUT)


def counter(client, family: str, **labels) -> float:
    for metric in text_string_to_metric_families(client.get("/metrics").text):
        if metric.name == family:
            for sample in metric.samples:
                if sample.name.endswith("_total") and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return sample.value
    return 0.0


def per_refresh(client, fake: FakePrometheus, family: str, **labels) -> float:
    """The counter once every refresh the fake served has been accounted for, divided by the refreshes."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        value = counter(client, family, **labels)
        if fake.hits and value == fake.hits * round(value / fake.hits):
            return value / fake.hits
        time.sleep(0.05)
    pytest.fail(f"{family}{labels}: {counter(client, family, **labels)} after {fake.hits} refreshes")


def decide(client) -> dict:
    answer = client.post("/filter", json=names_args(GPU_POD, ["n1", "n2"]))
    assert answer.status_code == 200, answer.text
    return answer.json()


def assert_policy_for_n2(result: dict, policy: str) -> None:
    """n2's data was left out: the missing-metrics policy decides for it; n1 is judged on its metrics."""
    if policy == "deny":
        assert result["NodeNames"] == ["n1"]
        assert "no GPU metrics for this node" in result["FailedNodes"]["n2"]
        assert "ON_MISSING_METRICS=deny" in result["FailedNodes"]["n2"]
    else:
        assert result["NodeNames"] == ["n1", "n2"] and result["FailedNodes"] == {}


# --- data faults: the source answers, some of what it says cannot be trusted --------------------------------


@pytest.mark.parametrize("policy", ["deny", "allow"])
@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        (series("DCGM_FI_DEV_GPU_UTIL", "n2", -5), "out of range on n2"),
        (series("DCGM_FI_DEV_GPU_UTIL", "n2", 250), "out of range on n2"),
        (series("DCGM_FI_DEV_FB_USED", "n2", -1), "out of range on n2"),
        (series("DCGM_FI_DEV_GPU_UTIL", "n2", "NaN"), "out of range on n2"),
    ],
    ids=["util-negative", "util-250pct", "fb-negative", "util-nan"],
)
def test_prometheus_out_of_range_values_leave_the_node_to_the_policy(prometheus, policy, bad, fragment):
    # A negative utilisation once won the best score (clamped to 0); now n2 has no trusted data at all.
    prometheus.series = healthy("n1") + [
        s for s in healthy("n2") if s["metric"]["__name__"] != bad["metric"]["__name__"]
    ]
    prometheus.series.append(bad)
    with TestClient(prometheus_app(prometheus, policy)) as client:
        assert_policy_for_n2(decide(client), policy)
        ready = client.get("/readyz").json()
        assert ready["metrics_source_error"] is None
        assert any(fragment in note for note in ready["metrics_source_warnings"]), ready
        assert per_refresh(client, prometheus, "gpufleet_extender_metrics_faults", fault="out_of_range") == 1
        assert counter(client, "gpufleet_extender_metrics_source_errors") == 0


@pytest.mark.parametrize("policy", ["deny", "allow"])
def test_prometheus_future_samples_are_not_fresh(prometheus, policy):
    # Dated an hour ahead, n2's samples would have counted as fresh for an hour, whatever the max age.
    prometheus.times["n2"] = time.time() + 3600
    with TestClient(prometheus_app(prometheus, policy)) as client:
        assert_policy_for_n2(decide(client), policy)
        ready = client.get("/readyz").json()
        assert any("n2" in note and "in the future" in note for note in ready["metrics_source_warnings"]), ready
        assert per_refresh(client, prometheus, "gpufleet_extender_metrics_faults", fault="future_timestamp") == 1
        assert ready["metrics_age_seconds"] is not None and ready["metrics_age_seconds"] >= 0


def test_prometheus_samples_within_the_allowed_skew_are_kept(prometheus):
    prometheus.times["n2"] = time.time() + 2  # default METRICS_MAX_CLOCK_SKEW_SECONDS is 5
    with TestClient(prometheus_app(prometheus, "deny")) as client:
        assert decide(client)["NodeNames"] == ["n1", "n2"]
        assert client.get("/readyz").json()["metrics_source_warnings"] == []
        assert counter(client, "gpufleet_extender_metrics_faults") == 0


def test_prometheus_duplicate_series_are_reported(prometheus):
    prometheus.series = healthy("n1") + healthy("n2") + [series("DCGM_FI_DEV_GPU_UTIL", "n2", 95)]
    with TestClient(prometheus_app(prometheus, "deny")) as client:
        ready = client.get("/readyz").json()
        assert any("1 duplicate series" in note and "n2" in note for note in ready["metrics_source_warnings"])
        assert per_refresh(client, prometheus, "gpufleet_extender_metrics_faults", fault="duplicate_series") == 1
        assert ready["ready"] is True


@pytest.mark.parametrize("policy", ["deny", "allow"])
def test_prometheus_without_dcgm_series_is_visible(prometheus, policy):
    prometheus.series, prometheus.times = [], {}
    with TestClient(prometheus_app(prometheus, policy)) as client:
        result = decide(client)
        if policy == "deny":
            assert result["NodeNames"] == [] and set(result["FailedNodes"]) == {"n1", "n2"}
        else:
            assert result["NodeNames"] == ["n1", "n2"]
        answer = client.get("/readyz")
        assert answer.status_code == (503 if policy == "deny" else 200)
        assert any("no dcgm-exporter series" in note for note in answer.json()["metrics_source_warnings"])
        assert per_refresh(client, prometheus, "gpufleet_extender_metrics_faults", fault="no_dcgm_series") == 1


# --- source faults: no usable answer at all ------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["deny", "allow"])
@pytest.mark.parametrize(
    ("mode", "fragment"),
    [
        ("trickle", "within PROMETHEUS_TIMEOUT_SECONDS"),
        ("slow", "PROMETHEUS_TIMEOUT_SECONDS|ReadTimeout"),  # whichever of the two deadlines fires first
        ("garbage", "without JSON"),
        ("matrix", "expected a vector"),
    ],
)
def test_prometheus_that_does_not_answer_properly_is_an_error(prometheus, policy, mode, fragment):
    prometheus.mode = mode
    started = time.monotonic()
    with TestClient(prometheus_app(prometheus, policy)) as client:
        # The app answers at once (it serves while the first refresh runs); the stuck refresh is abandoned
        # within the deadline, not never, and reported.
        ready = client.get("/readyz")
        while ready.json()["metrics_source_error"] is None and time.monotonic() - started < TIMEOUT * 6:
            time.sleep(0.05)
            ready = client.get("/readyz")
        assert time.monotonic() - started < TIMEOUT * 6
        assert re.search(fragment, ready.json()["metrics_source_error"])
        assert ready.status_code == (503 if policy == "deny" else 200)
        assert per_refresh(client, prometheus, "gpufleet_extender_metrics_source_errors", source="prometheus") == 1
        result = decide(client)
        if policy == "deny":
            assert result["NodeNames"] == []
        else:
            assert result["NodeNames"] == ["n1", "n2"]


# --- the file source ----------------------------------------------------------------------------------------


def file_app(tmp_path, text: str, policy: str):
    path = tmp_path / "dcgm.prom"
    path.write_text(text)
    return app_for(policy, METRICS_SOURCE="file", METRICS_FILE=str(path))


GOOD_FILE = render_exposition({"n1": gpus(0.1)}, host_label="Hostname")


@pytest.mark.parametrize("policy", ["deny", "allow"])
@pytest.mark.parametrize(
    ("extra", "fault", "fragment"),
    [
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="n2"} -3\n', "out_of_range", "out of range on n2"),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="n2"} 101\n', "out_of_range", "out of range on n2"),
        (
            'DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",GPU_I_ID="1",GPU_I_PROFILE="1g.10gb",Hostname="n2"} 1.5\n',
            "out_of_range",
            "out of range on n2",
        ),
        (
            f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",Hostname="n2"}} 5 {int((time.time() + 7200) * 1000)}\n',
            "future_timestamp",
            "in the future",
        ),
    ],
    ids=["negative", "over-100pct", "ratio-over-1", "future"],
)
def test_file_faults_leave_the_node_to_the_policy(tmp_path, policy, extra, fault, fragment):
    text = GOOD_FILE.replace("# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n", "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n" + extra)
    if "GR_ENGINE" in extra:
        text += "# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n" + extra
        text = text.replace("# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n" + extra, "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n")
    with TestClient(file_app(tmp_path, text, policy)) as client:
        assert_policy_for_n2(decide(client), policy)
        ready = client.get("/readyz").json()
        assert any(fragment in note for note in ready["metrics_source_warnings"]), ready
        assert counter(client, "gpufleet_extender_metrics_faults", source="file", fault=fault) == 1


def test_file_duplicates_are_reported(tmp_path):
    duplicate = 'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="n1"} 99\n'
    text = GOOD_FILE.replace("# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n", "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n" + duplicate)
    with TestClient(file_app(tmp_path, text, "deny")) as client:
        assert any("duplicate series" in n for n in client.get("/readyz").json()["metrics_source_warnings"])
        assert counter(client, "gpufleet_extender_metrics_faults", source="file", fault="duplicate_series") == 1


@pytest.mark.parametrize("text", ["", "# just a comment\n", "node_load1 0.5\n"], ids=["empty", "comment", "no-dcgm"])
def test_file_without_dcgm_series_is_visible(tmp_path, text):
    with TestClient(file_app(tmp_path, text, "deny")) as client:
        answer = client.get("/readyz")
        assert answer.status_code == 503
        assert answer.json()["metrics_source_error"] is None  # the file was read: not an error, a warning
        assert any("no dcgm-exporter series" in n for n in answer.json()["metrics_source_warnings"])
        assert counter(client, "gpufleet_extender_metrics_faults", source="file", fault="no_dcgm_series") == 1
        assert decide(client)["NodeNames"] == []


def test_file_garbage_is_an_error(tmp_path):
    with TestClient(file_app(tmp_path, 'DCGM_FI_DEV_GPU_UTIL{gpu="0" 5\n', "deny")) as client:
        ready = client.get("/readyz").json()
        assert "not Prometheus text format" in ready["metrics_source_error"]
        assert counter(client, "gpufleet_extender_metrics_source_errors", source="file") >= 1  # one per refresh


def test_a_healthy_refresh_reports_nothing(prometheus, tmp_path):
    with TestClient(prometheus_app(prometheus, "deny")) as client:
        assert decide(client)["NodeNames"] == ["n1", "n2"]
        ready = client.get("/readyz").json()
        assert ready["metrics_source_error"] is None and ready["metrics_source_warnings"] == []
        assert counter(client, "gpufleet_extender_metrics_faults") == 0
    assert math.isfinite(TIMEOUT)
