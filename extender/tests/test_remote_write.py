"""METRICS_SOURCE=push: Prometheus' remote write into the extender, over real HTTP on 127.0.0.1.

A valid write reaches the snapshot and decides as the same samples read from a file do; every refusal (malformed
snappy or protobuf, a series without a name, too large by header or body, no or a wrong token, another media type)
answers its status, counts its reason and leaves the snapshot as it was; out-of-order samples are ignored and
counted, the stale marker removes a series. The decoder's fast path agrees with the protobuf runtime.
"""

from __future__ import annotations

import logging
import math
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cramjam
import httpx
import pytest
from fastapi.testclient import TestClient
from gpufleet_testsupport.controlplane import serving_files
from gpufleet_testsupport.exposition import DeviceLoad, remote_write_series, render_exposition
from gpufleet_testsupport.ports import free_port
from gpufleet_testsupport.scheduler_requests import make_pod, names_args
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet_extender import remote_write, settings_contract
from gpufleet_extender.app import create_app
from gpufleet_extender.config import load_settings
from gpufleet_extender.errors import ExtenderError
from gpufleet_extender.metrics_source import load_file
from gpufleet_extender.remote_write import (
    MAX_BODY_BYTES,
    MAX_DECODED_BYTES,
    WRITE_PATH,
    Refused,
    SampleStore,
    TimeSeries,
    WriteRequest,
    encode_write_request,
    series_field,
    stale_nan,
)

from extender_helpers import gpus, mig

TOKEN = "s3cret-token"
HEADERS = {
    "Authorization": f"Bearer {TOKEN}",
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}
FLEET: dict[str, list[DeviceLoad]] = {
    "node-a": gpus(0.2, 0.95),
    "node-b": mig(0, "3g.40gb", 0.5, 0.1) + mig(1, "1g.10gb", 0.3, first_id=7),
}


def now_ms() -> int:
    return int(time.time() * 1000)


class Receiver:
    """An extender with METRICS_SOURCE=push, its receiver on a free port, and ways to look at both."""

    def __init__(self, client: TestClient, url: str, tls: httpx.Client | None = None) -> None:
        self.client = client
        self.url = url
        self.http = tls or httpx.Client()

    def post(self, content: bytes, **headers: str) -> httpx.Response:
        sent = {k: v for k, v in {**HEADERS, **headers}.items() if v}
        return self.http.post(self.url, content=content, headers=sent)

    @property
    def snapshot(self) -> Any:
        return self.client.app.state.refresher.snapshot  # type: ignore[attr-defined]

    def next_snapshot(self, timeout: float = 20.0) -> Any:
        """The snapshot after the next refresh (the push source refreshes every second)."""
        before = self.snapshot.taken_at
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.snapshot.taken_at != before:
                return self.snapshot
            time.sleep(0.05)
        raise AssertionError("no refresh within the timeout")

    def counter(self, name: str, **labels: str) -> float:
        text = self.client.get("/metrics").text
        wanted = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
        for line in text.splitlines():
            if line.startswith(wanted + " "):
                return float(line.split()[-1])
        return 0.0


def push_settings(tmp_path: Path, port: int, **overrides: Any) -> Any:
    token = tmp_path / "token"
    if not token.exists():
        token.write_text(TOKEN + "\n")
    values = {
        "METRICS_SOURCE": "push",
        "REMOTE_WRITE_ADDRESS": f"127.0.0.1:{port}",
        "REMOTE_WRITE_TOKEN_FILE": str(token),
        "KUBE_API": "off",
        "EXPORTER_JOB": "dcgm-exporter",
        "EXPORTER_NAMESPACE": "gpufleet-node-agents",
        **overrides,
    }
    return load_settings(**values)


@pytest.fixture(autouse=True)
def short_first_sample_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """Most tests look at a receiver before anything is pushed: its first snapshot waits a moment only."""
    monkeypatch.setattr(remote_write, "FIRST_SAMPLE_WAIT_SECONDS", 0.1)
    monkeypatch.setattr(remote_write, "FIRST_SAMPLE_SETTLE_SECONDS", 0.0)


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Receiver]:
    port = free_port()
    with TestClient(create_app(push_settings(tmp_path, port))) as client:
        yield Receiver(client, f"http://127.0.0.1:{port}{WRITE_PATH}")


def test_a_write_reaches_the_snapshot_as_the_same_samples_from_a_file_would(receiver, tmp_path):
    stamp = now_ms()
    answer = receiver.post(encode_write_request(remote_write_series(FLEET, stamp)))
    assert (answer.status_code, answer.content) == (204, b"")
    snapshot = receiver.next_snapshot()
    exposition = tmp_path / "metrics.prom"
    exposition.write_text(render_exposition(FLEET, timestamp_ms=stamp))
    from_file, _ = load_file(exposition, ("Hostname", "hostname"), default_time=0, taken_at=0, version=0)
    assert set(snapshot.nodes) == {"node-a", "node-b"}
    assert dict(snapshot.nodes) == dict(from_file.nodes)
    assert snapshot.nodes["node-b"].sample_time == stamp / 1000
    assert receiver.counter("gpufleet_extender_remote_write_samples_total") == 5 * 3  # 5 devices
    assert receiver.client.get("/readyz").json()["metrics_source"] == "push"
    assert [d.util for d in snapshot.nodes["node-a"].devices["nvidia.com/gpu"]] == [0.2, 0.95]


def test_the_verbs_decide_with_pushed_loads(receiver):
    busy = {"node-busy": gpus(0.95, 0.97), "node-free": gpus(0.1, 0.2)}
    assert receiver.post(encode_write_request(remote_write_series(busy, now_ms()))).status_code == 204
    receiver.next_snapshot()
    pod = make_pod({"nvidia.com/gpu": "1"})
    result = receiver.client.post("/filter", json=names_args(pod, ["node-busy", "node-free"])).json()
    assert result["NodeNames"] == ["node-free"] and set(result["FailedNodes"]) == {"node-busy"}


def _snappy(data: bytes) -> bytes:
    return bytes(cramjam.snappy.compress_raw(data))


def _nameless() -> bytes:
    return encode_write_request([({"Hostname": "node-a", "gpu": "0"}, [(1.0, now_ms())])])


def _claims_too_much() -> bytes:
    # A valid snappy block's length header raised past the limit: refused before anything is decompressed.
    body = encode_write_request(remote_write_series(FLEET, now_ms()))
    length = MAX_DECODED_BYTES + 1
    header = bytes([(length >> (7 * i) & 0x7F) | (0x80 if i < 3 else 0) for i in range(4)])
    return header + body[1:] if body[0] < 0x80 else header + body[2:]


REFUSALS = [
    ("not snappy", lambda: b"\xff\xff\xff\xff\xff\xff", {}, 400, "malformed"),
    ("not a WriteRequest", lambda: _snappy(b"\x0a\xff\xff\xff\x0f garbage"), {}, 400, "malformed"),
    ("a series without __name__", _nameless, {}, 400, "malformed"),
    ("decodes past the limit", _claims_too_much, {}, 413, "too_large"),
    ("a body past the limit", lambda: b"\x00" * (MAX_BODY_BYTES + 1), {}, 413, "too_large"),
    ("no token", lambda: encode_write_request([]), {"Authorization": ""}, 401, "unauthenticated"),
    ("a wrong token", lambda: encode_write_request([]), {"Authorization": "Bearer guess"}, 401, "unauthenticated"),
    ("JSON", lambda: b"{}", {"Content-Type": "application/json"}, 415, "unsupported_media"),
    ("gzip", lambda: encode_write_request([]), {"Content-Encoding": "gzip"}, 415, "unsupported_media"),
    (
        "remote write 2.0",
        lambda: encode_write_request([]),
        {"Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request"},
        415,
        "unsupported_media",
    ),
]


def test_refused_writes_count_their_reason_and_leave_the_snapshot_as_it_was(receiver):
    assert receiver.post(encode_write_request(remote_write_series(FLEET, now_ms()))).status_code == 204
    before = dict(receiver.next_snapshot().nodes)
    for what, make, headers, status, reason in REFUSALS:
        counted = receiver.counter("gpufleet_extender_remote_write_refused_total", reason=reason)
        answer = receiver.post(make(), **headers)
        assert answer.status_code == status, what
        assert "Traceback" not in answer.text and answer.text.strip(), what
        assert receiver.counter("gpufleet_extender_remote_write_refused_total", reason=reason) == counted + 1, what
    after = receiver.next_snapshot()
    assert dict(after.nodes) == before
    assert all(after.nodes[name] is before[name] for name in before)  # not even rebuilt: nothing changed


def test_another_method_is_refused_and_counted_as_gpuscore_counts_it(receiver):
    counted = receiver.counter("gpufleet_extender_remote_write_refused_total", reason="method")
    answer = receiver.http.get(receiver.url, headers={"Authorization": HEADERS["Authorization"]})
    assert answer.status_code == 405
    assert receiver.counter("gpufleet_extender_remote_write_refused_total", reason="method") == counted + 1


def test_a_malformed_series_refuses_the_whole_write(receiver):
    # Good series first, then one without a name: none of it is applied.
    good = remote_write_series(FLEET, now_ms())
    body = encode_write_request([*good, ({"Hostname": "node-a"}, [(1.0, now_ms())])])
    assert receiver.post(body).status_code == 400
    assert receiver.next_snapshot().nodes == {}


def test_out_of_order_samples_are_ignored_and_counted_and_the_stale_marker_removes_a_series(receiver):
    stamp = now_ms()
    assert receiver.post(encode_write_request(remote_write_series(FLEET, stamp))).status_code == 204
    receiver.next_snapshot()
    series = remote_write_series(FLEET, 0)
    older = [(labels, [(0.99, stamp - 15_000)]) for labels, _ in series if labels["Hostname"] == "node-b"]
    assert receiver.post(encode_write_request(older)).status_code == 204
    assert receiver.counter("gpufleet_extender_remote_write_out_of_order_total") == len(older)
    snapshot = receiver.next_snapshot()
    assert [d.util for d in snapshot.nodes["node-b"].devices["nvidia.com/mig-3g.40gb"]] == [0.5, 0.1]
    # Prometheus marks node-a's series stale (its target is gone): node-a leaves the snapshot, node-b stays.
    marker = [(labels, [(stale_nan(), stamp + 1)]) for labels, _ in series if labels["Hostname"] == "node-a"]
    assert receiver.post(encode_write_request(marker)).status_code == 204
    assert set(receiver.next_snapshot().nodes) == {"node-b"}


def test_series_of_another_job_or_namespace_are_not_read(receiver):
    foreign = remote_write_series({"node-x": gpus(0.1)}, now_ms(), job="tenant-exporter")
    elsewhere = remote_write_series({"node-y": gpus(0.1)}, now_ms(), namespace="team-a")
    assert receiver.post(encode_write_request(foreign + elsewhere)).status_code == 204
    assert receiver.next_snapshot().nodes == {}
    assert receiver.counter("gpufleet_extender_remote_write_samples_total") == 0


def test_a_rotated_token_is_read_when_the_file_changes(receiver, tmp_path):
    body = encode_write_request(remote_write_series(FLEET, now_ms()))
    assert receiver.post(body).status_code == 204
    (tmp_path / "token").write_text("rotated-token-longer\n")
    assert receiver.post(body).status_code == 401
    assert receiver.post(body, Authorization="Bearer rotated-token-longer").status_code == 204
    # No file, or an empty one: nobody is let in (logged once), until it holds a token again.
    (tmp_path / "token").unlink()
    assert receiver.post(body, Authorization="Bearer rotated-token-longer").status_code == 401
    (tmp_path / "token").write_text("\n")
    assert receiver.post(body, Authorization="Bearer back-again").status_code == 401
    (tmp_path / "token").write_text("back-again\n")
    assert receiver.post(body, Authorization="Bearer back-again").status_code == 204


def test_the_receiver_serves_https_with_its_pair(tmp_path):
    ca, cert, key = serving_files(tmp_path / "tls", "server", ("127.0.0.1",)).values()
    port = free_port()
    settings = push_settings(tmp_path, port, REMOTE_WRITE_CERT_FILE=str(cert), REMOTE_WRITE_KEY_FILE=str(key))
    with (
        TestClient(create_app(settings)) as client,
        httpx.Client(verify=str(ca)) as tls,
    ):
        receiver = Receiver(client, f"https://127.0.0.1:{port}{WRITE_PATH}", tls)
        assert receiver.post(encode_write_request(remote_write_series(FLEET, now_ms()))).status_code == 204
        assert set(receiver.next_snapshot().nodes) == {"node-a", "node-b"}
        with pytest.raises(httpx.HTTPError):
            httpx.post(f"http://127.0.0.1:{port}{WRITE_PATH}", content=b"", headers=HEADERS, timeout=2)


def test_an_address_in_use_or_a_broken_pair_is_refused_in_one_line(tmp_path):
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(ExtenderError, match=rf"^cannot listen on REMOTE_WRITE_ADDRESS 127\.0\.0\.1:{port}: "):
            create_app(push_settings(tmp_path, port))
    (tmp_path / "bad.pem").write_text("not a certificate")
    pair = {"REMOTE_WRITE_CERT_FILE": str(tmp_path / "bad.pem"), "REMOTE_WRITE_KEY_FILE": str(tmp_path / "bad.pem")}
    with pytest.raises(ExtenderError, match=r"^cannot use REMOTE_WRITE_CERT_FILE/KEY_FILE"):
        create_app(push_settings(tmp_path, free_port(), **pair))


# --- the decoder against the protobuf runtime ------------------------------------------------------------------

_names = st.sampled_from(["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "up"])
_text = st.text(min_size=0, max_size=12)
_stamps = st.one_of(st.integers(0, 2**63 - 1), st.integers(1_700_000_000_000, 1_800_000_000_000))
_values = st.one_of(st.floats(allow_nan=False), st.just(stale_nan()), st.just(math.nan))


def _reference(data: bytes) -> list[tuple[dict[str, str], float, int]]:
    request = WriteRequest.FromString(data)
    return [
        ({label.name: label.value for label in ts.labels}, sample.value, sample.timestamp)
        for ts in request.timeseries
        for sample in ts.samples
    ]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            _names,
            st.sampled_from(["node-a", "node-b", ""]),
            st.dictionaries(st.sampled_from(["gpu", "GPU_I_ID", "pod", "x"]), _text, max_size=3),
            st.lists(st.tuples(_values, _stamps), max_size=3),
        ),
        max_size=6,
    ),
    st.booleans(),
)
def test_the_fast_path_reads_what_the_protobuf_runtime_reads(series, metadata):
    request = WriteRequest()
    for name, node, extra, samples in series:
        ts = request.timeseries.add()
        for key, value in sorted({"__name__": name, "Hostname": node, **extra}.items()):
            ts.labels.add(name=key, value=value)
        for value, stamp in samples:
            ts.samples.add(value=value, timestamp=stamp)
    data = request.SerializeToString()
    if metadata:  # a metadata entry (field 3), which 1.0 receivers skip
        data += b"\x1a\x04\x08\x01\x12\x00"
    store = SampleStore(("Hostname",))
    for _ in range(2):  # the second time every series comes from the label cache
        got = store.decode(data)
        want = [(labels, v, t) for labels, v, t in _reference(data) if labels.get("Hostname")]
        want = [w for w in want if w[0]["__name__"] != "up"]
        read = [(s, v, t) for s, v, t in got if s]  # series the store keeps (the others are skipped)
        assert [(s[2], s[3]["Hostname"], struct.pack("<d", v), t) for s, v, t in read] == [
            (labels["__name__"], labels["Hostname"], struct.pack("<d", v), t) for labels, v, t in want
        ]


def test_the_decoder_refuses_what_is_not_a_write_request():
    store = SampleStore(("Hostname",))
    for data in (b"\x0a\x05ab", b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", b"\x0f", b"\x00\x01"):
        with pytest.raises(Refused) as refused:
            store.decode(data)
        assert refused.value.reason == "malformed"
    assert TimeSeries.FromString(b"").labels == []  # the runtime classes are there


def test_known_series_in_prometheus_framing_take_the_fast_path(monkeypatch):
    # One sample per series at a millisecond timestamp of this century: read without the protobuf runtime once the
    # labels are known (the benchmark's figures depend on it).
    store = SampleStore(("Hostname",))
    series = remote_write_series({**FLEET, "node-idle": gpus(0.0, mem_used_mib=0.0)}, now_ms())  # 0: no value field
    data = b"".join(series_field(labels, samples) for labels, samples in series)
    store.decode(data)

    def runtime(*args: Any) -> None:
        raise AssertionError("the protobuf runtime decoded a known series")

    monkeypatch.setattr(store, "_decode_series", runtime)
    monkeypatch.setattr(store, "_learn", runtime)
    assert [value for _, value, _ in store.decode(data)] == [samples[0][0] for _, samples in series]


_VALID = b"".join(series_field(labels, samples) for labels, samples in remote_write_series(FLEET, 1_796_000_000_000))


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(st.binary(max_size=300), st.tuples(st.integers(0, len(_VALID) - 1), st.binary(min_size=1, max_size=4)))
)
def test_any_bytes_are_read_or_refused_as_malformed(data):
    # Random bytes, or a valid request with a few bytes overwritten: a WriteRequest or Refused(malformed), nothing else
    # (no IndexError, no runtime error escaping), and a refused write leaves the store as it was.
    if isinstance(data, tuple):
        at, patch = data
        data = _VALID[:at] + patch + _VALID[at + len(patch) :]
    store = SampleStore(("Hostname",))
    try:
        store.write(data)
    except Refused as refused:
        assert refused.reason == "malformed"
        assert store.empty()


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_any_body_is_taken_or_refused(body):
    from gpufleet_extender.remote_write import Receiver as WriteReceiver
    from gpufleet_extender.remote_write import TokenFile

    receiver = WriteReceiver(SampleStore(("Hostname",)), TokenFile(Path("/nonexistent")))
    try:
        receiver.process(body)
    except Refused as refused:
        assert refused.reason in ("malformed", "too_large")
    finally:
        receiver.close()


def test_a_new_receiver_is_loading_until_the_first_push_then_ready(tmp_path: Path):
    # As GPUScore's first pod: the first snapshot waits for the first pushed sample (and the rest of its scrape), so
    # a restarted replica stays out of its Service instead of deciding blind until Prometheus' next send.
    from gpufleet_testsupport.extender import start_extender  # the real server: its lifespan as deployed
    from gpufleet_testsupport.processes import stop_process

    port = free_port()
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    env = {"METRICS_SOURCE": "push", "REMOTE_WRITE_ADDRESS": f"127.0.0.1:{port}", "REMOTE_WRITE_TOKEN_FILE": str(token)}
    process, url = start_extender(tmp_path, {"KUBE_API": "off", **env}, ready=False)
    try:
        time.sleep(1.0)
        loading = httpx.get(f"{url}/readyz")
        assert loading.status_code == 503 and loading.json()["loading"] is True
        receiver = httpx.post(
            f"http://127.0.0.1:{port}{WRITE_PATH}",
            content=encode_write_request(remote_write_series(FLEET, now_ms())),
            headers=HEADERS,
        )
        assert receiver.status_code == 204
        deadline = time.monotonic() + 15
        while (answer := httpx.get(f"{url}/readyz")).status_code != 200:
            assert time.monotonic() < deadline, answer.json()
            time.sleep(0.1)
        assert answer.json()["metrics_age_seconds"] is not None
    finally:
        stop_process(process)


def test_the_first_snapshot_waits_until_no_new_node_comes(monkeypatch: pytest.MonkeyPatch):
    # Prometheus catching up sends a scrape's nodes over seconds: the first snapshot holds them all, not the first few.
    import asyncio
    import threading

    from gpufleet_extender.remote_write import PushSource

    monkeypatch.setattr(remote_write, "FIRST_SAMPLE_WAIT_SECONDS", 20.0)
    monkeypatch.setattr(remote_write, "FIRST_SAMPLE_SETTLE_SECONDS", 0.5)
    store = SampleStore(("Hostname",))
    nodes = {f"node-{i}": FLEET["node-a"] for i in range(6)}

    def send() -> None:
        for node, devices in nodes.items():
            series = remote_write_series({node: devices}, now_ms())
            store.write(b"".join(series_field(labels, samples) for labels, samples in series))
            time.sleep(0.2)

    sender = threading.Thread(target=send)
    sender.start()
    snapshot = asyncio.run(PushSource(store, ("Hostname",)).fetch(1))
    sender.join()
    assert snapshot is not None and set(snapshot.nodes) == set(nodes)


def test_the_store_holds_at_most_its_most_series_and_says_so(receiver, caplog):
    """A sender that lets through more series than a fleet has cannot grow the store without bound: new series
    beyond its most are not kept and are counted (one log line), the series held keep taking samples, and a series
    that ends makes room. The bound is the settings contract's, as GPUScore's."""
    store = receiver.client.app.state.refresher.source.store
    assert store.max_series == settings_contract.RECEIVER_MAX_SERIES
    stamp = now_ms()
    assert receiver.post(encode_write_request(remote_write_series(FLEET, stamp))).status_code == 204
    receiver.next_snapshot()
    store.max_series = store.series
    newcomer = remote_write_series({"node-c": gpus(0.9)}, stamp + 1)
    update = remote_write_series({"node-a": gpus(0.6, 0.95)}, stamp + 1)
    with caplog.at_level(logging.WARNING):
        assert receiver.post(encode_write_request(newcomer + update)).status_code == 204
    assert receiver.counter("gpufleet_extender_remote_write_series_over_limit_total") == len(newcomer)
    assert "samples of new series not kept" in caplog.text
    snapshot = receiver.next_snapshot()
    assert "node-c" not in snapshot.nodes
    assert snapshot.nodes["node-a"].devices["nvidia.com/gpu"][0].util == 0.6
    # node-b's target is gone (stale markers): its series make room for node-c's.
    ended = [
        (labels, [(stale_nan(), stamp + 2)])
        for labels, _ in remote_write_series(FLEET, 0)
        if labels["Hostname"] == "node-b"
    ]
    assert len(ended) >= len(newcomer)
    assert receiver.post(encode_write_request(ended)).status_code == 204
    assert receiver.post(encode_write_request(remote_write_series({"node-c": gpus(0.9)}, stamp + 3))).status_code == 204
    assert set(receiver.next_snapshot().nodes) == {"node-a", "node-c"}
    assert store.series <= store.max_series
