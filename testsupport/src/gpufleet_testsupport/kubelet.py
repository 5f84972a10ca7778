"""A kubelet pod-resources endpoint for tests: a real gRPC server on a unix socket, speaking v1.PodResourcesLister
with the collection's generated messages (proto/kubelet_podresources_v1.proto).

Imported as `gpufleet_testsupport.kubelet`."""

from __future__ import annotations

from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from ansible_collections.gpufleet.mig.plugins.module_utils import kubelet_podresources_v1_pb2 as pb


@dataclass
class NodeDevices:
    """What the fake kubelet answers: pods -> containers -> {resource: [device ids]}, and the allocatable devices."""

    pods: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = field(default_factory=dict)
    allocatable: dict[str, list[str]] = field(default_factory=dict)
    # Raw ContainerResources fields the collection's proto does not declare (a newer kubelet's cpu_ids, memory...),
    # appended to every container: they must be skipped, not break parsing.
    extra_container_bytes: bytes = b""

    def list_response(self) -> pb.ListPodResourcesResponse:
        response = pb.ListPodResourcesResponse()
        for (namespace, name), containers in self.pods.items():
            pod = response.pod_resources.add(name=name, namespace=namespace)
            for container_name, devices in containers.items():
                container = pb.ContainerResources(name=container_name)
                for resource, ids in devices.items():
                    container.devices.add(resource_name=resource, device_ids=ids)
                if self.extra_container_bytes:
                    container = pb.ContainerResources.FromString(
                        container.SerializeToString() + self.extra_container_bytes
                    )
                pod.containers.append(container)
        return response

    def allocatable_response(self) -> pb.AllocatableResourcesResponse:
        response = pb.AllocatableResourcesResponse()
        for resource, ids in self.allocatable.items():
            entry = response.devices.add(resource_name=resource, device_ids=ids)
            entry.topology.nodes.add(ID=0)
        return response


class FakeKubelet:
    """Serve `devices` on `socket_path` until stop(). `methods` limits what it serves (an older kubelet answers
    UNIMPLEMENTED for the rest, as gRPC does for any unregistered method)."""

    def __init__(self, socket_path: Path, devices: NodeDevices, methods=("List", "GetAllocatableResources")):
        self.socket_path = socket_path
        self.devices = devices
        self.calls: list[str] = []
        handlers = {
            "List": grpc.unary_unary_rpc_method_handler(
                self._list,
                request_deserializer=pb.ListPodResourcesRequest.FromString,
                response_serializer=pb.ListPodResourcesResponse.SerializeToString,
            ),
            "GetAllocatableResources": grpc.unary_unary_rpc_method_handler(
                self._allocatable,
                request_deserializer=pb.AllocatableResourcesRequest.FromString,
                response_serializer=pb.AllocatableResourcesResponse.SerializeToString,
            ),
        }
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("v1.PodResourcesLister", {m: handlers[m] for m in methods}),)
        )
        self.server.add_insecure_port(f"unix://{socket_path}")

    def _list(self, request, context):
        self.calls.append("List")
        return self.devices.list_response()

    def _allocatable(self, request, context):
        self.calls.append("GetAllocatableResources")
        return self.devices.allocatable_response()

    def __enter__(self) -> FakeKubelet:
        self.server.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop(grace=None)
