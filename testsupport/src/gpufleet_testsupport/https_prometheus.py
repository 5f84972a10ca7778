"""An https Prometheus stand-in that answers the readers' instant queries (GPUScore's and the extender's raw form)
from a dcgm-exporter exposition a test sets, only to the bearer token in its token file."""

from __future__ import annotations

import ssl
import time
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from gpufleet_extender.metrics_source import parse_exposition

from gpufleet_testsupport import servers
from gpufleet_testsupport.controlplane import serving_files
from gpufleet_testsupport.scheduling import write_mig_metrics
from gpufleet_testsupport.servers import QuietHandler

PROFILE = "1g.10gb"


class FakePrometheus:
    """/api/v1/query for GPUScore's two queries: the dcgm series, and the newest sample time per node. https with a
    certificate `ca` issued; a request without `Bearer <token>` (the token file's content) gets 401."""

    def __init__(self, workdir, pki: dict[str, Path] | None = None):
        """``pki``: {"ca.crt", "tls.crt", "tls.key"} files to serve with (default: a CA of its own, for 127.0.0.1)."""
        self.workdir = workdir
        self.samples = []
        pki = pki or serving_files(workdir / "prometheus-pki", "prometheus", ("127.0.0.1",))
        self.ca = pki["ca.crt"]
        self.token_file = workdir / "prometheus-token"
        self.rotate_token("first-token")
        self.authorizations: list[str] = []  # the Authorization header of every query, in order
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pki["tls.crt"], pki["tls.key"])
        self.server = servers.start(self._handler(), context)
        self.url = servers.url(self.server)

    def rotate_token(self, token: str) -> None:
        """A new token, accepted from now on (the old one no more), written where the plugin reads it."""
        self.token = token
        self.token_file.write_text(token + "\n")

    def set_loads(self, loads: dict[str, list[float]], pods: dict[str, list[int]] | None = None) -> None:
        """Instance loads per node; `pods`: how many pods hold each instance (time-slicing), one series per pod
        as dcgm-exporter's pod mapping writes them (none: no pod label at all)."""
        exposition = write_mig_metrics(self.workdir / "dcgm.prom", loads, profile=PROFILE).read_text()
        self.samples = []
        for sample in parse_exposition(exposition):
            labels = sample.labels
            index = int(labels["gpu"]) * 3 + int(labels["GPU_I_ID"]) - 1  # write_mig_metrics: 3 instances per GPU
            holders = (pods or {}).get(labels["Hostname"])
            if holders is None:
                self.samples.append(sample)
                continue
            names = [f"clf-{index}-{i}" for i in range(holders[index])] or [""]
            for pod in names:
                self.samples.append(
                    sample._replace(labels={**labels, "pod": pod, "namespace": "finnlp" if pod else ""})
                )

    def answer(self, query: str) -> list[dict]:
        now = time.time()
        if "timestamp(" in query:  # max by (Hostname, hostname) (timestamp(...)) or ...
            nodes = sorted({sample.labels["Hostname"] for sample in self.samples})
            return [{"metric": {"Hostname": node}, "value": [now, repr(now)]} for node in nodes]
        return [
            {"metric": {"__name__": sample.name, **sample.labels}, "value": [now, repr(sample.value)]}
            for sample in self.samples
        ]

    def _handler(self):
        prometheus = self

        class Handler(QuietHandler):
            def do_GET(self):
                query = parse_qs(urlparse(self.path).query).get("query", [""])[0]
                authorization = self.headers.get("Authorization", "")
                prometheus.authorizations.append(authorization)
                if authorization != f"Bearer {prometheus.token}":
                    self.send_json({"status": "error", "errorType": "unauthorized", "error": "bad token"}, 401)
                else:
                    result = prometheus.answer(query)
                    self.send_json({"status": "success", "data": {"resultType": "vector", "result": result}})

        return Handler

    def close(self) -> None:
        servers.stop(self.server)
