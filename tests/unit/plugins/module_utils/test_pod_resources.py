"""pod_resources against a real gRPC server on a unix socket (gpufleet_testsupport.kubelet): what is allocated to whom,
what is free, and one-line errors for a missing socket, no permission, nothing listening, an older kubelet."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

import pytest
import yaml
from ansible_collections.gpufleet.mig.plugins.module_utils import pod_resources
from ansible_collections.gpufleet.mig.plugins.module_utils.pod_resources import PodResourcesError, read_pod_resources
from gpufleet_testsupport.collection import REPO
from gpufleet_testsupport.kubelet import FakeKubelet, NodeDevices

MIG_3G, MIG_1G = "nvidia.com/mig-3g.40gb", "nvidia.com/mig-1g.10gb"


def node() -> NodeDevices:
    return NodeDevices(
        pods={
            ("imagegen", "sdxl-1"): {"worker": {MIG_3G: ["MIG-a"]}, "sidecar": {}},
            ("finnlp", "bert-1"): {"main": {MIG_1G: ["MIG-c", "MIG-b"], "example.com/fpga": ["fpga0"]}},
            ("kube-system", "coredns"): {"coredns": {}},
        },
        allocatable={MIG_3G: ["MIG-d", "MIG-a"], MIG_1G: ["MIG-b", "MIG-c", "MIG-e"], "example.com/fpga": ["fpga0"]},
    )


@pytest.fixture
def sock(tmp_path):
    return tmp_path / "kubelet.sock"


def test_allocations_free_devices_and_pods(sock):
    with FakeKubelet(sock, node()) as kubelet:
        reading = read_pod_resources(str(sock))
    assert kubelet.calls == ["List", "GetAllocatableResources"]
    assert [(a.resource_name, a.device_id, a.namespace, a.pod, a.container) for a in reading.allocations] == [
        (MIG_1G, "MIG-b", "finnlp", "bert-1", "main"),
        (MIG_1G, "MIG-c", "finnlp", "bert-1", "main"),
        (MIG_3G, "MIG-a", "imagegen", "sdxl-1", "worker"),
    ]
    assert reading.allocatable == {MIG_1G: ["MIG-b", "MIG-c", "MIG-e"], MIG_3G: ["MIG-a", "MIG-d"]}
    assert reading.free() == {MIG_1G: ["MIG-e"], MIG_3G: ["MIG-d"]}
    devices = reading.devices()
    assert devices["MIG-d"] == {
        "resource_name": MIG_3G,
        "mig_profile": "3g.40gb",
        "allocatable": True,
        "allocated": False,
        "namespace": None,
        "pod": None,
        "container": None,
    }
    assert devices["MIG-a"]["allocated"] and devices["MIG-a"]["pod"] == "sdxl-1"
    assert "fpga0" not in devices  # outside the nvidia.com/ prefix
    assert [(p["namespace"], p["name"]) for p in reading.pods()] == [("finnlp", "bert-1"), ("imagegen", "sdxl-1")]


def test_empty_prefix_reports_every_resource(sock):
    with FakeKubelet(sock, node()):
        reading = read_pod_resources(str(sock), resource_prefix="")
    assert reading.free()["example.com/fpga"] == []
    assert reading.devices()["fpga0"]["mig_profile"] is None


def test_device_held_but_no_longer_allocatable_is_reported(sock):
    devices = node()
    devices.allocatable[MIG_3G] = ["MIG-d"]  # MIG-a went unhealthy: still held by its pod
    with FakeKubelet(sock, devices):
        reading = read_pod_resources(str(sock))
    assert reading.devices()["MIG-a"]["allocatable"] is False
    assert reading.devices()["MIG-a"]["allocated"] is True


def test_fields_of_a_newer_kubelet_are_skipped(sock):
    devices = node()
    # ContainerResources.cpu_ids = [4, 5] (field 3, packed int64) and memory (field 4): not in the collection's proto.
    devices.extra_container_bytes = b"\x1a\x02\x04\x05" + b"\x22\x04\x0a\x02hp"
    with FakeKubelet(sock, devices):
        reading = read_pod_resources(str(sock))
    assert len(reading.allocations) == 3


def test_answers_over_grpc_default_4_mib_are_read(sock):
    ids = [f"MIG-{i:036d}" for i in range(120_000)]  # about 5 MiB of device IDs
    with FakeKubelet(sock, NodeDevices(allocatable={MIG_1G: ids})):
        reading = read_pod_resources(str(sock))
    assert len(reading.free()[MIG_1G]) == len(ids)


def test_missing_socket(sock):
    with pytest.raises(PodResourcesError, match=r"socket .*kubelet.sock does not exist"):
        read_pod_resources(str(sock))


def test_nothing_listening(sock):
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(sock))  # the file of a kubelet that died: bound, never listening
    stale.close()
    with pytest.raises(PodResourcesError, match=r"nothing listens on .*is the kubelet running"):
        read_pod_resources(str(sock))


def test_kubelet_without_allocatable_call(sock):
    with FakeKubelet(sock, node(), methods=("List",)), pytest.raises(PodResourcesError) as info:
        read_pod_resources(str(sock))
    assert "does not serve v1.PodResourcesLister/GetAllocatableResources" in info.value.message
    assert "1.23" in info.value.message


def test_kubelet_without_the_v1_api(sock):
    with FakeKubelet(sock, node(), methods=()), pytest.raises(PodResourcesError, match=r"PodResourcesLister/List"):
        read_pod_resources(str(sock))


def test_bad_timeout(sock):
    with pytest.raises(PodResourcesError, match="positive number of seconds"):
        read_pod_resources(str(sock), timeout=0)


def _as_nobody(function, *args) -> str:
    """Run function(*args) in a forked child as user nobody; the PodResourcesError message it raised, or ''.
    (Forked, not exec'd: the test's interpreter may live where nobody cannot read it.)"""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: no gRPC here, the reader fails in its socket check before any channel exists
        message = ""
        try:
            os.setgid(65534)
            os.setuid(65534)
            function(*args)
        except PodResourcesError as exc:
            message = exc.message
        except BaseException as exc:  # reported to the parent, which fails the test
            message = f"unexpected {type(exc).__name__}: {exc}"
        os.write(write_end, message.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        message = pipe.read().decode()
    os.waitpid(pid, 0)
    return message


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run the reader as an unprivileged user")
@pytest.mark.parametrize("where", ["socket", "directory"])
def test_no_permission(tmp_path, where):
    """As the kubelet's socket and directory are root-only: an unprivileged reader gets one line saying so."""
    directory = tmp_path / "pod-resources"
    directory.mkdir()
    sock = directory / "kubelet.sock"
    tmp_path.chmod(0o755)
    directory.chmod(0o700 if where == "directory" else 0o755)
    with FakeKubelet(sock, node()):
        sock.chmod(0o600)
        message = _as_nobody(pod_resources.check_socket, str(sock))
        assert read_pod_resources(str(sock)).allocations  # root still reads it
    assert message.startswith("no permission to connect to"), message
    assert "become" in message


def test_missing_generated_messages_named(monkeypatch):
    monkeypatch.setattr(pod_resources, "pb", None)
    monkeypatch.setattr(pod_resources, "_PB_IMPORT_ERROR", "No module named 'kubelet_podresources_v1_pb2'")
    with pytest.raises(PodResourcesError, match=r"generated kubelet_podresources_v1_pb2.py is missing.*make venv"):
        read_pod_resources("/nonexistent")


def _floor(requirement: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.search(r">=([0-9.]+)", requirement).group(1).split("."))


def test_hosts_get_a_protobuf_the_generated_messages_accept():
    """protoc writes its version into the generated file and the runtime refuses to load it if older: the protobuf
    the role installs on hosts (and requirements-dev.txt for the tests and the lab) must start at or above that
    version."""
    generated = Path(pod_resources.__file__).with_name("kubelet_podresources_v1_pb2.py").read_text()
    written_for = tuple(int(x) for x in re.search(r"Protobuf Python Version: ([0-9.]+)", generated).group(1).split("."))
    defaults = yaml.safe_load((REPO / "roles/mig_partition/defaults/main.yml").read_text())
    host_protobuf = [r for r in defaults["mig_partition_pod_resources_packages"] if r.startswith("protobuf")]
    dev_protobuf = [
        line.split("#")[0].strip()
        for line in (REPO / "requirements-dev.txt").read_text().splitlines()
        if line.startswith("protobuf")
    ]
    assert host_protobuf and dev_protobuf
    for requirement in host_protobuf + dev_protobuf:
        floor = _floor(requirement)
        assert floor[0] == written_for[0] and floor >= written_for, (requirement, written_for)
