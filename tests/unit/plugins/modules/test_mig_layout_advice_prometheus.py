"""mig_layout_advice's demand from recent usage, through a real Prometheus (Debian package) scraping a small
dcgm-exporter stand-in on 127.0.0.1 whose MIG series the test changes: three 1g.10gb instances busy, then one."""

from __future__ import annotations

import json
import ssl
import time

import pytest
from ansible_collections.gpufleet.mig.plugins.module_utils import gpu_info
from ansible_collections.gpufleet.mig.plugins.module_utils.advisor import AdviceError
from ansible_collections.gpufleet.mig.plugins.module_utils.nvml_sim import SimulatedNvml, new_state
from ansible_collections.gpufleet.mig.plugins.module_utils.runner import apply
from ansible_collections.gpufleet.mig.plugins.modules import mig_layout_advice
from gpufleet_testsupport import servers
from gpufleet_testsupport.controlplane import serving_files
from gpufleet_testsupport.ports import free_port
from gpufleet_testsupport.prometheus import busy_count, mig_series
from gpufleet_testsupport.prometheus import prometheus as start_prometheus
from gpufleet_testsupport.servers import QuietHandler, serve
from gpufleet_testsupport.waits import wait_for


@pytest.fixture
def prometheus(tmp_path):
    with start_prometheus(tmp_path) as running:
        yield running


def _node(tmp_path) -> dict:
    """hk-gpu-11: one simulated GPU of 2 x 3g.40gb, nothing allocated."""
    path = tmp_path / "hk-gpu-11.json"
    path.write_text(json.dumps(new_state(gpus=1, product="NVIDIA H100 80GB HBM3")))
    sim = SimulatedNvml(str(path))
    apply(sim, [{"devices": [0], "mig_enabled": True, "mig_devices": {"3g.40gb": 2}}])
    return {"name": "hk-gpu-11", "gpus": gpu_info.collect(sim), "pod_resources": None}


def test_recent_usage_adds_the_instances_busy_lately_and_free_now(prometheus, tmp_path):
    url, exporter = prometheus
    # First: on hk-gpu-11 three 1g.10gb and one 3g.40gb busy; hk-gpu-99 (not in the pool) has two busy 1g.10gb;
    # hk-gpu-12's exporter, a newer image, labels its busy 1g.10gb `hostname`.
    exporter.text = (
        "".join(mig_series("hk-gpu-11", gi, "1g.10gb", 0.9) for gi in (7, 8, 9))
        + mig_series("hk-gpu-11", 1, "3g.40gb", 0.8)
        + mig_series("hk-gpu-12", 7, "1g.10gb", 0.9, host_label="hostname")
        + "".join(mig_series("hk-gpu-99", gi, "1g.10gb", 0.9) for gi in (7, 8))
    )
    wait_for(lambda: busy_count(url, "hk-gpu-11", "1g.10gb") == 3, what="three busy 1g.10gb scraped")
    time.sleep(2)  # a few samples of the busy state inside the look-back
    # Then: two of the 1g.10gb go idle (their pods ended), the 3g.40gb stays busy, hk-gpu-99 goes idle.
    exporter.text = (
        mig_series("hk-gpu-11", 7, "1g.10gb", 0.9)
        + "".join(mig_series("hk-gpu-11", gi, "1g.10gb", 0.0) for gi in (8, 9))
        + mig_series("hk-gpu-11", 1, "3g.40gb", 0.8)
        + "".join(mig_series("hk-gpu-99", gi, "1g.10gb", 0.0) for gi in (7, 8))
        + mig_series("hk-gpu-12", 7, "1g.10gb", 0.0, host_label="hostname")
    )
    wait_for(lambda: busy_count(url, "hk-gpu-11", "1g.10gb") == 1, what="one busy 1g.10gb scraped")
    options = {"url": url, "window": "60s", "step": "1s", "busy_above": 0.05, "host_label": None, "timeout": 5}
    query, usage = mig_layout_advice.demand_from_prometheus(options, ["hk-gpu-11", "hk-gpu-12"])
    # 1g.10gb: 4 busy at most over the minute (either host label), 1 now -> 3; 3g.40gb: 1 and 1 -> 0 (left out);
    # hk-gpu-99 not counted.
    assert usage == {"1g.10gb": 3}
    assert 'Hostname=~"hk\\\\-gpu\\\\-11|hk\\\\-gpu\\\\-12"' in query
    assert 'hostname=~"hk\\\\-gpu\\\\-11|hk\\\\-gpu\\\\-12"' in query
    # A label named in the options is the only one read.
    pinned = dict(options, host_label="Hostname")
    assert mig_layout_advice.demand_from_prometheus(pinned, ["hk-gpu-11", "hk-gpu-12"])[1] == {"1g.10gb": 2}
    # The module: the usage joins the demand, and the pool's node names are the default hostnames.
    params = {
        "nodes": [_node(tmp_path)],
        "demand": {"3g.40gb": 1},
        "pending_pods": [],
        "demand_file": None,
        "minimums": None,
        "allowed_profiles": None,
        "max_states": 200,
        "prometheus": dict(options, hostnames=None),
    }
    result = mig_layout_advice.run(params)
    assert result["usage"] == {"1g.10gb": 2} and result["demand"] == {"1g.10gb": 2, "3g.40gb": 1}
    assert result["served"] == {"1g.10gb": 2, "3g.40gb": 1}  # one 3g.40gb kept, the other made 1g.10gb
    assert 'Hostname=~"hk\\\\-gpu\\\\-11"' in result["usage_query"]
    # Nothing busy now, the 3g.40gb gone altogether: no series to subtract ("or peak"), so the demand is the peak.
    exporter.text = "".join(mig_series("hk-gpu-11", gi, "1g.10gb", 0.0) for gi in (7, 8, 9))
    wait_for(lambda: busy_count(url, "hk-gpu-11", "1g.10gb") == 0, what="no busy 1g.10gb scraped")
    assert mig_layout_advice.demand_from_prometheus(options, ["hk-gpu-11"])[1] == {"1g.10gb": 3, "3g.40gb": 1}


def test_an_unreachable_prometheus_or_a_bad_window_is_one_clear_error():
    options = {"url": f"http://127.0.0.1:{free_port()}", "window": "1h", "step": "1m", "busy_above": 0.05}
    options.update(host_label="Hostname", timeout=2)
    with pytest.raises(AdviceError, match=r"prometheus: cannot query http://127\.0\.0\.1:"):
        mig_layout_advice.demand_from_prometheus(options, ["hk-gpu-11"])
    with pytest.raises(AdviceError, match=r"prometheus\.window must be a PromQL duration"):
        mig_layout_advice.demand_from_prometheus(dict(options, window="an hour"), ["hk-gpu-11"])


@pytest.fixture
def https_prometheus(tmp_path):
    """A Prometheus stand-in over https (a certificate from a CA of its own) answering the usage query only to the
    bearer token in its token file, as the fleet's Prometheus does: 401 otherwise."""
    pki = serving_files(tmp_path / "pki", "prometheus", ("127.0.0.1",))
    token = tmp_path / "token"
    token.write_text("fleet-token\n")
    seen: list[str | None] = []

    class Handler(QuietHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            seen.append(self.headers.get("Authorization"))
            ok = self.headers.get("Authorization") == "Bearer fleet-token"
            body = (
                {
                    "status": "success",
                    "data": {
                        "resultType": "vector",
                        "result": [{"metric": {"GPU_I_PROFILE": "1g.10gb"}, "value": [0, "2"]}],
                    },
                }
                if ok
                else {"status": "error"}
            )
            self.send_json(body, 200 if ok else 401)

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki["tls.crt"], pki["tls.key"])
    with serve(Handler, context) as server:
        yield servers.url(server), pki["ca.crt"], token, seen


def test_an_https_prometheus_with_a_token_is_read_with_its_ca_and_token(https_prometheus, tmp_path):
    url, ca, token, seen = https_prometheus
    options = {"url": url, "window": "1h", "step": "1m", "busy_above": 0.05, "host_label": "Hostname", "timeout": 5}
    _query, usage = mig_layout_advice.demand_from_prometheus(
        dict(options, ca_file=str(ca), token_file=str(token)), ["hk-gpu-11"]
    )
    assert usage == {"1g.10gb": 2} and seen == ["Bearer fleet-token"]
    # Without the CA the certificate is refused; without the token Prometheus is; each is one clear line.
    with pytest.raises(
        AdviceError, match=r"prometheus: cannot query https://127\.0\.0\.1:\d+/api/v1/query: .*CERTIFICATE"
    ):
        mig_layout_advice.demand_from_prometheus(dict(options, token_file=str(token)), ["hk-gpu-11"])
    with pytest.raises(AdviceError, match=r"prometheus: cannot query .*401"):
        mig_layout_advice.demand_from_prometheus(dict(options, ca_file=str(ca)), ["hk-gpu-11"])
    with pytest.raises(AdviceError, match=r"prometheus\.token_file .*missing: No such file or directory"):
        mig_layout_advice.demand_from_prometheus(dict(options, token_file=str(tmp_path / "missing")), ["hk-gpu-11"])
    assert "fleet-token" not in str(seen[1:])  # the token never travels where it was not given
