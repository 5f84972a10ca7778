"""`gpufleet-extender probe-prometheus`, the preflight's look at Prometheus, run as the preflight role runs it (a
process, the token and CA on standard input) against an https Prometheus stand-in that answers only to its token."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from gpufleet_testsupport.controlplane import serving_files
from gpufleet_testsupport.https_prometheus import FakePrometheus


def probe(url: str, token: str = "", ca: str = "", *args: str, stdin: str | None = None):
    """(exit code, the JSON it printed or None, stderr)."""
    result = subprocess.run(
        [sys.executable, "-m", "gpufleet_extender", "probe-prometheus", "--url", url, "--timeout", "3", *args],
        input=json.dumps({"token": token, "ca": ca}) if stdin is None else stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    found = json.loads(result.stdout) if result.stdout.strip() else None
    return result.returncode, found, result.stderr


@pytest.fixture
def prometheus(tmp_path):
    fake = FakePrometheus(tmp_path)
    yield fake
    fake.close()


def test_the_readers_view_answers_with_the_nodes_prometheus_holds(prometheus):
    prometheus.set_loads({"gpu-01": [0.2, 0.3, 0.1], "gpu-02": [0.9, 0.9, 0.9]})
    code, found, _ = probe(prometheus.url, prometheus.token, prometheus.ca.read_text(), "--expect-series")
    assert (code, found["kind"], found["nodes"]) == (0, "ok", 2), found
    assert found["newest_age_seconds"] is not None and found["newest_age_seconds"] < 30
    assert prometheus.authorizations[-1] == f"Bearer {prometheus.token}"


def test_a_refused_token_is_a_credential_problem(prometheus):
    code, found, _ = probe(prometheus.url, "not-the-token", prometheus.ca.read_text())
    assert (code, found["kind"]) == (1, "credential"), found
    assert "401" in found["message"]


def test_no_token_at_all_is_refused_alike(prometheus):
    code, found, _ = probe(prometheus.url, "", prometheus.ca.read_text())
    assert (code, found["kind"]) == (1, "credential"), found
    assert prometheus.authorizations[-1] == ""


def test_a_certificate_from_another_ca_is_a_tls_problem(prometheus, tmp_path):
    other = serving_files(tmp_path / "other", "other", ("127.0.0.1",))["ca.crt"].read_text()
    code, found, _ = probe(prometheus.url, prometheus.token, other)
    assert (code, found["kind"]) == (1, "tls"), found
    assert "CERTIFICATE_VERIFY_FAILED" in found["message"]
    assert prometheus.authorizations == []  # the token never left


def test_a_port_forward_is_checked_against_the_name_in_the_certificate(tmp_path):
    """Prometheus' certificate names its Service; the controller reaches it on 127.0.0.1 (kubectl port-forward)."""
    pki = serving_files(tmp_path / "svc", "prometheus", ("prometheus-operated.monitoring.svc",))
    fake = FakePrometheus(tmp_path, pki=pki)
    try:
        fake.set_loads({"gpu-01": [0.1, 0.1, 0.1]})
        ca = pki["ca.crt"].read_text()
        code, found, _ = probe(fake.url, fake.token, ca)
        assert (code, found["kind"]) == (1, "tls"), found  # 127.0.0.1 is not in the certificate
        code, found, _ = probe(fake.url, fake.token, ca, "--server-name", "prometheus-operated.monitoring.svc")
        assert (code, found["kind"], found["nodes"]) == (0, "ok", 1), found
        code, found, _ = probe(fake.url, fake.token, ca, "--server-name", "prometheus.other.svc")
        assert (code, found["kind"]) == (1, "tls"), found
    finally:
        fake.close()


def test_nothing_listening_is_unreachable():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed when the block ends: nothing listens there
    code, found, _ = probe(f"https://127.0.0.1:{port}", "token")
    assert (code, found["kind"]) == (1, "unreachable"), found


def test_series_are_required_only_once_dcgm_exporter_runs(prometheus):
    code, found, _ = probe(prometheus.url, prometheus.token, prometheus.ca.read_text())
    assert (code, found["kind"], found["nodes"]) == (0, "ok", 0), found  # before the first install: nothing yet
    code, found, _ = probe(prometheus.url, prometheus.token, prometheus.ca.read_text(), "--expect-series")
    assert (code, found["kind"]) == (1, "no_series"), found
    assert "dcgm series" in found["message"]


def test_http_is_refused_unless_allowed(prometheus):
    url = prometheus.url.replace("https://", "http://")
    code, found, _ = probe(url, prometheus.token)
    assert (code, found["kind"]) == (1, "answer"), found
    assert "not an https:// URL" in found["message"]
    assert prometheus.authorizations == []


@pytest.mark.parametrize("stdin", ["{not json", '["token"]', '{"token": 5}'])
def test_bad_standard_input_is_one_line_not_a_traceback(prometheus, stdin):
    code, found, stderr = probe(prometheus.url, stdin=stdin)
    assert (code, found) == (2, None)
    assert stderr.startswith("gpufleet-extender probe-prometheus: ") and "Traceback" not in stderr
    assert len(stderr.strip().splitlines()) == 1


def test_a_ca_that_is_no_certificate_is_a_tls_problem_without_a_temporary_path(prometheus):
    code, found, _ = probe(prometheus.url, prometheus.token, "not a certificate")
    assert (code, found["kind"]) == (1, "tls"), found
    assert found["message"] == "the CA given is not a PEM certificate (bundle) Python's ssl can load"
    assert prometheus.authorizations == []
