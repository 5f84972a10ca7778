"""Which devices the kubelet has handed to which pods: a client of the kubelet's pod-resources gRPC API.

The kubelet serves `v1.PodResourcesLister` on a unix socket (by default /var/lib/kubelet/pod-resources/kubelet.sock,
root only). `List` says which device IDs each container of each running pod holds; `GetAllocatableResources` says
which device IDs the kubelet can hand out at all. With the NVIDIA device plugin's default device-ID strategy a MIG
instance's device ID is its MIG device UUID (`MIG-...`, as nvidia_gpu_info reports it), so joining the two tells
which instances are allocated - whether or not their pod runs a process on them yet - and which are free.

The protobuf messages come from proto/kubelet_podresources_v1.proto, generated into kubelet_podresources_v1_pb2.py
at build time. Only the messages are generated: the two unary calls are made on the channel directly, which keeps
the host's needs to grpcio and protobuf (no generated service stub pinned to a grpcio version).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any

from .exceptions import MigError
from .names import MIG_RESOURCE_PREFIX  # the device plugin's mixed strategy: nvidia.com/mig-<profile>

# Both optional (see missing_dependencies). protoc's generated module creates its message classes at import
# time, where mypy cannot see them (grpcio has no type information either: mypy.ini).
pb: Any
_GRPC_IMPORT_ERROR: str | None
_PB_IMPORT_ERROR: str | None
try:
    import grpc
except ImportError as exc:  # reported by missing_dependencies(); module_utils must import without grpcio
    grpc = None
    _GRPC_IMPORT_ERROR = str(exc)
else:
    _GRPC_IMPORT_ERROR = None

try:
    from . import kubelet_podresources_v1_pb2 as pb
except ImportError as exc:  # no protobuf on this Python, or the generated file was not built
    pb = None
    _PB_IMPORT_ERROR = str(exc)
else:
    _PB_IMPORT_ERROR = None

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_TIMEOUT = 10.0  # seconds per call, as the kubelet's own pod-resources client
# The kubelet's pod-resources client accepts answers up to 16 MiB (gRPC's default is 4 MiB); a node with many pods
# and devices can exceed 4 MiB.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
SERVICE = "v1.PodResourcesLister"


class PodResourcesError(MigError):
    """The pod-resources API could not be read (socket missing, no permission, kubelet without the API, ...)."""


def missing_dependencies() -> str | None:
    """Why this Python cannot talk to the API (grpcio, protobuf or the generated messages missing), or None."""
    if grpc is None:
        return f"grpcio is not installed for this Python ({_GRPC_IMPORT_ERROR})"
    if pb is None:
        if "kubelet_podresources_v1_pb2" in (_PB_IMPORT_ERROR or ""):
            return (
                "the generated kubelet_podresources_v1_pb2.py is missing from the collection (it is generated from "
                "proto/kubelet_podresources_v1.proto when the collection is built: make venv or make build)"
            )
        return f"protobuf cannot load the pod-resources messages on this Python ({_PB_IMPORT_ERROR})"
    return None


@dataclass(frozen=True)
class DeviceAllocation:
    """One device ID held by one container."""

    resource_name: str
    device_id: str
    namespace: str
    pod: str
    container: str

    def as_dict(self) -> dict[str, str]:
        return {
            "resource_name": self.resource_name,
            "device_id": self.device_id,
            "namespace": self.namespace,
            "pod": self.pod,
            "container": self.container,
        }


@dataclass
class PodResourcesReading:
    """The node's device allocations (filtered to a resource-name prefix) and what it can allocate."""

    allocations: list[DeviceAllocation] = field(default_factory=list)
    allocatable: dict[str, list[str]] = field(default_factory=dict)  # resource name -> device IDs

    def free(self) -> dict[str, list[str]]:
        """Allocatable device IDs no container holds, per resource name."""
        held = {(a.resource_name, a.device_id) for a in self.allocations}
        return {
            resource: [d for d in ids if (resource, d) not in held]
            for resource, ids in sorted(self.allocatable.items())
        }

    def pods(self) -> list[dict[str, Any]]:
        """Pods holding devices, with each container's device IDs per resource name."""
        by_pod: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = {}
        for a in self.allocations:
            containers = by_pod.setdefault((a.namespace, a.pod), {})
            containers.setdefault(a.container, {}).setdefault(a.resource_name, []).append(a.device_id)
        return [
            {
                "namespace": namespace,
                "name": name,
                "containers": [
                    {"name": container, "devices": [{"resource_name": r, "device_ids": ids} for r, ids in devs.items()]}
                    for container, devs in containers.items()
                ],
            }
            for (namespace, name), containers in sorted(by_pod.items())
        ]

    def devices(self) -> dict[str, dict[str, Any]]:
        """Every device ID seen (allocatable or allocated), keyed by ID: its resource, MIG profile, holder."""
        holders = {a.device_id: a for a in self.allocations}
        result = {}
        for resource, ids in self.allocatable.items():
            for device_id in ids:
                result[device_id] = _device_entry(resource, holders.get(device_id), allocatable=True)
        for device_id, holder in holders.items():
            if device_id not in result:  # held but no longer allocatable (e.g. the device went unhealthy)
                result[device_id] = _device_entry(holder.resource_name, holder, allocatable=False)
        return dict(sorted(result.items()))


def mig_profile(resource_name: str) -> str | None:
    """The MIG profile of a mixed-strategy resource name (nvidia.com/mig-3g.40gb -> 3g.40gb), else None."""
    if resource_name.startswith(MIG_RESOURCE_PREFIX):
        return resource_name[len(MIG_RESOURCE_PREFIX) :]
    return None


def _device_entry(resource: str, holder: DeviceAllocation | None, allocatable: bool) -> dict[str, Any]:
    return {
        "resource_name": resource,
        "mig_profile": mig_profile(resource),
        "allocatable": allocatable,
        "allocated": holder is not None,
        "namespace": holder.namespace if holder else None,
        "pod": holder.pod if holder else None,
        "container": holder.container if holder else None,
    }


def _no_permission(path: str) -> str:
    return f"no permission to connect to {path} (the kubelet makes it root-only: run the task with become)"


def check_socket(path: str) -> None:
    """Fail with a one-line reason when the socket cannot be connected to (before gRPC's retrying connect)."""
    try:
        os.stat(path)
    except FileNotFoundError:
        raise PodResourcesError(
            f"the kubelet pod-resources socket {path} does not exist (is this a Kubernetes node with a running "
            "kubelet? the kubelet serves the API there unless its root directory was moved)"
        ) from None
    except PermissionError:  # the kubelet's pod-resources directory is root-only too
        raise PodResourcesError(_no_permission(path)) from None
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(5)
        probe.connect(path)
    except PermissionError:
        raise PodResourcesError(_no_permission(path)) from None
    except ConnectionRefusedError:
        raise PodResourcesError(f"nothing listens on {path} (is the kubelet running?)") from None
    except OSError as exc:
        raise PodResourcesError(f"cannot connect to {path}: {exc.strerror or exc}") from None
    finally:
        probe.close()


def _call(channel: Any, method: str, request: Any, response_type: Any, timeout: float, path: str) -> Any:
    """One unary call (grpc channels and protobuf messages are untyped here); gRPC failures as PodResourcesError."""
    call = channel.unary_unary(
        f"/{SERVICE}/{method}",
        request_serializer=type(request).SerializeToString,
        response_deserializer=response_type.FromString,
    )
    try:
        return call(request, timeout=timeout)
    except grpc.RpcError as exc:
        code = exc.code()
        if code == grpc.StatusCode.UNIMPLEMENTED:
            needs = (
                "Kubernetes 1.20 or newer"
                if method == "List"
                else "Kubernetes 1.23 or newer (1.21-1.22: the KubeletPodResourcesGetAllocatable feature gate)"
            )
            raise PodResourcesError(
                f"the kubelet at {path} does not serve {SERVICE}/{method} (it needs {needs})"
            ) from None
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise PodResourcesError(f"{SERVICE}/{method} on {path} did not answer within {timeout:g} s") from None
        detail = (exc.details() or "").replace("\n", " ")
        raise PodResourcesError(f"{SERVICE}/{method} on {path} failed: {code.name}: {detail}") from None


def read_pod_resources(
    path: str = DEFAULT_SOCKET, timeout: float = DEFAULT_TIMEOUT, resource_prefix: str = "nvidia.com/"
) -> PodResourcesReading:
    """List the node's device allocations and allocatable devices whose resource name starts with the prefix."""
    missing = missing_dependencies()
    if missing:
        raise PodResourcesError(missing)
    if timeout <= 0:
        raise PodResourcesError(f"timeout must be a positive number of seconds, got {timeout:g}")
    path = os.path.abspath(path)
    check_socket(path)
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    with grpc.insecure_channel(f"unix://{path}", options=options) as channel:
        listed = _call(channel, "List", pb.ListPodResourcesRequest(), pb.ListPodResourcesResponse, timeout, path)
        allocatable = _call(
            channel,
            "GetAllocatableResources",
            pb.AllocatableResourcesRequest(),
            pb.AllocatableResourcesResponse,
            timeout,
            path,
        )
    reading = PodResourcesReading()
    for pod in listed.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if not devices.resource_name.startswith(resource_prefix):
                    continue
                reading.allocations.extend(
                    DeviceAllocation(devices.resource_name, device_id, pod.namespace, pod.name, container.name)
                    for device_id in devices.device_ids
                )
    for devices in allocatable.devices:
        if devices.resource_name.startswith(resource_prefix):
            reading.allocatable.setdefault(devices.resource_name, []).extend(devices.device_ids)
    reading.allocatable = {r: sorted(set(ids)) for r, ids in sorted(reading.allocatable.items())}
    reading.allocations.sort(key=lambda a: (a.resource_name, a.device_id, a.namespace, a.pod, a.container))
    return reading
