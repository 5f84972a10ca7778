"""The images the project builds, as `make images` builds them on this machine (podman, no registry): tagged with the
collection's version, their digests printed; each one run here on 127.0.0.1 (host network).

- gpufleet-extender holds the server alone: it answers /healthz and kube-scheduler's captured filter and prioritize
  bodies, read-only, as the unprivileged user, and no module of the lab can be found in it.
- gpufleet-scheduler starts on the configuration the kube_scheduler role renders in plugin mode, against the suite's
  control plane, and binds a MIG pod with its GPUScore plugin reading a Prometheus over https with a token.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import REPO
from gpufleet_testsupport.ports import free_port
from gpufleet_testsupport.scheduling import create_nodes, rendered_scheduler_config
from test_scheduler_plugin import RESOURCE, SCHEDULER, FakePrometheus, make_pods

pytestmark = pytest.mark.integration

CAPTURES = REPO / "extender" / "tests" / "data" / "kube-scheduler"
# The lab (gpufleet-lab), and of the collection's library every module but the two rules the server shares with it
# (extender/pyproject.toml's py-modules: names, pod_requests).
LAB = (
    "gpufleet_lab",
    "gpufleet_extender.simulate",
    "gpufleet_extender.mig_utils.nvml_sim",
    "gpufleet_extender.mig_utils.planner",
    "gpufleet_extender.mig_utils.advisor",
)


def _wait_healthy(url: str, container: str, timeout: float = 90) -> None:
    """Until `url` answers 200; else fail with the container's log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, verify=False, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    logs = podman("logs", "--tail", "40", container)
    pytest.fail(f"{container} did not answer {url} in {timeout:.0f} s:\n{logs.stdout}{logs.stderr}")


def podman(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    # The same containers.conf molecule uses (runc, cgroupfs): the only one that works on the CI machines.
    command = 'source tests/molecule/podman-env.sh && podman "$@"'
    return subprocess.run(
        ["bash", "-c", command, "podman", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def images():
    """`make images` with tags of this run's own (removed afterwards): {"extender": tag, "scheduler": tag}."""
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed: `make system-deps` installs it")
    suffix = uuid.uuid4().hex[:8]
    tags = {
        "extender": f"localhost/gpufleet-extender:test-{suffix}",
        "scheduler": f"localhost/gpufleet-scheduler:test-{suffix}",
    }
    started = time.monotonic()
    built = subprocess.run(
        ["make", "--no-print-directory", "images", f"EXTENDER_IMAGE={tags['extender']}",
         f"SCHEDULER_IMAGE={tags['scheduler']}"],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    print(f"make images: {time.monotonic() - started:.0f} s")
    try:
        yield {**tags, "output": built.stdout}
    finally:
        podman("rmi", "--force", tags["extender"], tags["scheduler"])


def test_make_images_prints_each_images_digest(images):
    for kind in ("extender", "scheduler"):
        digest = podman("image", "inspect", "--format", "{{.Digest}}", images[kind]).stdout.strip()
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), digest
        assert f"{images[kind]} {digest}" in images["output"].splitlines()


def test_the_default_tags_are_the_collections_version():
    version = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    defaults = subprocess.run(
        ["make", "--no-print-directory", "-n", "images"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert f"localhost/gpufleet-extender:{version}" in defaults
    assert f"localhost/gpufleet-scheduler:{version}" in defaults


def test_the_extender_image_is_the_server_alone_as_an_unprivileged_user(images):
    inspected = json.loads(podman("image", "inspect", images["extender"]).stdout)[0]
    assert inspected["Config"]["User"] == "65532:65532"
    assert inspected["Config"]["Entrypoint"] == ["gpufleet-extender", "serve"]
    probe = (
        "import importlib.util, json; "
        f"print(json.dumps([m for m in {LAB!r} if importlib.util.find_spec(m)] + "
        "[m for m in ('gpufleet_extender.app', 'gpufleet_extender.cli', 'gpufleet_extender.mig_utils.pod_requests') "
        "if not importlib.util.find_spec(m)]))"
    )
    ran = podman("run", "--rm", "--network", "none", "--entrypoint", "python3", images["extender"], "-c", probe)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == []  # no lab module found, and the server's found


def test_the_extender_image_serves_kube_schedulers_requests(images):
    port, closed = free_port(), free_port()
    name = f"gpufleet-extender-test-{uuid.uuid4().hex[:8]}"
    started = podman(
        "run", "--detach", "--rm", "--name", name, "--network", "host", "--read-only",
        "--env", "KUBE_API=off", "--env", f"PROMETHEUS_URL=http://127.0.0.1:{closed}",
        images["extender"], "--host", "127.0.0.1", "--port", str(port),
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_healthy(f"{base}/healthz", name)
        # The verbs answer 503 ("starting") until the settings and the first metrics refresh are in: /readyz says when.
        _wait_healthy(f"{base}/readyz", name)
        filtered = httpx.post(f"{base}/filter", content=(CAPTURES / "mig-job.filter.json").read_bytes(), timeout=10)
        assert filtered.status_code == 200
        answer = filtered.json()
        # kube-scheduler's ExtenderFilterResult: the nodes it may use, or an error it will report.
        assert set(answer) & {"NodeNames", "Nodes", "nodenames", "nodes"} or answer.get("Error")
        prioritized = httpx.post(
            f"{base}/prioritize", content=(CAPTURES / "mig-job.prioritize.json").read_bytes(), timeout=10
        )
        assert prioritized.status_code == 200 and isinstance(prioritized.json(), list)
    finally:
        podman("rm", "--force", "--time", "5", name)


def _embedded_kubeconfig(control_plane, path):
    """The admin kubeconfig with its files embedded: the container reads one file, as the unprivileged user."""
    config = yaml.safe_load(control_plane.kubeconfig.read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    for entry, key in ((cluster, "certificate-authority"), (user, "client-certificate"), (user, "client-key")):
        entry[f"{key}-data"] = base64.b64encode(Path(entry.pop(key)).read_bytes()).decode()
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o644)


def test_the_scheduler_image_starts_on_the_rendered_configuration_and_binds_a_pod(
    images, control_plane, core, namespace, tmp_path
):
    namespace, bindings = namespace
    mounted = tmp_path / "mounted"
    mounted.mkdir(mode=0o755)
    prometheus = FakePrometheus(mounted)
    try:
        config = rendered_scheduler_config(
            tmp_path / "render",
            kube_scheduler_mode="plugin",
            kube_scheduler_prometheus_url=prometheus.url,
            kube_scheduler_plugin_extra_args={
                "prometheusCAFile": str(prometheus.ca),
                "prometheusTokenFile": str(prometheus.token_file),
                "metricsRefreshSeconds": 1,
            },
        )
        _embedded_kubeconfig(control_plane, mounted / "kubeconfig")
        config["clientConnection"] = {**config.get("clientConnection", {}), "kubeconfig": str(mounted / "kubeconfig")}
        config["leaderElection"] = {"leaderElect": False}
        (mounted / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        # Readable by the image's unprivileged user: the CA, the token, the kubeconfig and the configuration.
        for path in mounted.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        port = free_port()
        name = f"gpufleet-scheduler-test-{uuid.uuid4().hex[:8]}"
        started = podman(
            "run", "--detach", "--rm", "--name", name, "--network", "host", "--read-only",
            "--volume", f"{mounted}:{mounted}:ro", "--tmpfs", "/certs:rw,mode=1777",
            images["scheduler"], f"--config={mounted / 'config.yaml'}", "--bind-address=127.0.0.1",
            f"--secure-port={port}", "--cert-dir=/certs", f"--authentication-kubeconfig={mounted / 'kubeconfig'}",
            f"--authorization-kubeconfig={mounted / 'kubeconfig'}",
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        try:
            _wait_healthy(f"https://127.0.0.1:{port}/healthz", name)
            pool = {"gpufleet.test/scheduling": "image"}
            create_nodes(core, ["image-cool", "image-hot"], {RESOURCE: "2"}, labels=pool)
            prometheus.set_loads({"image-cool": [0.1, 0.1], "image-hot": [0.95, 0.95]})
            time.sleep(2.5)
            make_pods(core, namespace, ["in-image"], pool)
            assert bindings.wait(1, timeout=60), podman("logs", "--tail", "40", name).stderr
            assert bindings.bound["in-image"][0] == "image-cool"
            assert set(prometheus.authorizations) == {f"Bearer {prometheus.token}"}
            assert config["profiles"][0]["schedulerName"] == SCHEDULER
        finally:
            podman("rm", "--force", "--time", "5", name)
            for node in ("image-cool", "image-hot"):
                core.delete_node(node)
    finally:
        prometheus.close()
