"""The real kube-scheduler calls the extender over TLS with the tlsConfig the kube_scheduler role renders: the CA
inline (caData) and the server name of the extender's Service, while the URL names an address the certificate
does not cover (as a static-pod scheduler calls the ClusterIP). A scheduler holding another CA refuses the
extender's certificate, so no Pod spec reaches it; a plain-http client gets no answer from the https port.

The extender is required here (ignorable: false): a pod binds only if the TLS call succeeded."""

from __future__ import annotations

import ssl

import httpx
import pytest
from gpufleet_testsupport.controlplane import serving_files
from gpufleet_testsupport.extender import start_extender
from gpufleet_testsupport.processes import stop_process
from gpufleet_testsupport.scheduling import (
    MIG_RESOURCE,
    create_mig_pods,
    create_nodes,
    failed_scheduling,
    rendered_scheduler_config,
    write_mig_metrics,
)
from gpufleet_testsupport.waits import wait_for

pytestmark = pytest.mark.integration

POOL = {"gpufleet.test/scheduling": "extender-tls"}
COOL, HOT = "tls-cool", "tls-hot"
SERVER_NAME = "gpufleet-extender.gpufleet-system.svc"  # the role's default tlsConfig.serverName


@pytest.fixture(scope="module")
def nodes(core):
    create_nodes(core, [COOL, HOT], {MIG_RESOURCE: "3"}, labels=POOL)


@pytest.fixture(scope="module")
def tls_extender(nodes, tmp_path_factory):
    """The extender serving https with a certificate for the Service's name only; yields (url, its CA file)."""
    workdir = tmp_path_factory.mktemp("extender-tls")
    files = serving_files(workdir / "pki", "gpufleet-extender", (SERVER_NAME,))
    metrics = write_mig_metrics(workdir / "dcgm.prom", {COOL: [0.1, 0.2, 0.1], HOT: [0.95, 0.97, 0.96]})
    env = {"METRICS_SOURCE": "file", "METRICS_FILE": str(metrics), "KUBE_API": "off", "METRICS_REFRESH_SECONDS": "1"}
    process, url = start_extender(workdir, env, tls=files, server_name=SERVER_NAME)
    yield url, files
    stop_process(process)


@pytest.fixture
def scheduler(schedulers, tmp_path):
    started = []

    def start(url: str, ca_file) -> None:
        config = rendered_scheduler_config(
            tmp_path,
            kube_scheduler_extender_url_prefix=url,
            kube_scheduler_extender_ignorable=False,
            kube_scheduler_extender_tls_ca=ca_file.read_text(),
        )
        extender = config["extenders"][0]
        assert extender["enableHTTPS"] is True
        assert extender["tlsConfig"]["serverName"] == SERVER_NAME and extender["tlsConfig"]["caData"]
        started.append(schedulers(config, name=f"gpufleet-scheduler-tls-{len(started)}"))

    return start


def test_the_scheduler_calls_the_extender_over_tls_and_follows_it(core, tls_extender, scheduler, namespace):
    namespace, bindings = namespace
    url, files = tls_extender
    scheduler(url, files["ca.crt"])

    create_mig_pods(core, namespace, 3, POOL)

    assert bindings.wait(3, timeout=60), f"bound: {bindings.bound}"
    # Only the extender knows the hot node is hot: every pod on the cool one means its answers arrived.
    assert {node for node, _ in bindings.bound.values()} == {COOL}


def test_a_scheduler_with_another_ca_refuses_the_extender(core, tls_extender, scheduler, namespace, tmp_path):
    namespace, bindings = namespace
    url, _ = tls_extender
    impostor = serving_files(tmp_path, "impostor", (SERVER_NAME,))
    scheduler(url, impostor["ca.crt"])

    create_mig_pods(core, namespace, 1, POOL)

    messages = wait_for(lambda: failed_scheduling(core, namespace), what="a FailedScheduling event")
    assert any("certificate signed by unknown authority" in m for m in messages), messages
    assert bindings.bound == {}


def test_plain_http_and_unknown_ca_clients_get_no_answer(tls_extender, tmp_path):
    url, files = tls_extender
    port = url.rsplit(":", 1)[1]
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
    impostor = serving_files(tmp_path, "impostor", (SERVER_NAME,))
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{url}/readyz", timeout=5, verify=ssl.create_default_context(cafile=str(impostor["ca.crt"])))
    # With the right CA but without the server name pinned, the address is not in the certificate either.
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{url}/readyz", timeout=5, verify=ssl.create_default_context(cafile=str(files["ca.crt"])))
