"""kube-scheduler's extender wire format (k8s.io/kube-scheduler/extender/v1), decoded with msgspec.

The Go structs carry no json tags, so the JSON keys are the Go field names and nil pointers, slices and
maps travel as ``null``:

- request ``ExtenderArgs``: ``{"Pod": {...}, "Nodes": {"items": [...]} | null, "NodeNames": [...] | null}``;
  exactly one of Nodes (nodeCacheCapable false) and NodeNames (nodeCacheCapable true) is set;
- filter answer ``ExtenderFilterResult``: ``Nodes``, ``NodeNames``, ``FailedNodes``,
  ``FailedAndUnresolvableNodes``, ``Error``;
- prioritize answer ``HostPriorityList``: ``[{"Host": "...", "Score": 0..10}]``.

Only the parts of a Pod and a Node the extender reads are decoded (msgspec skips the rest without building
it). Full Node objects are kept as raw JSON so the filter answer returns them byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec


class WireError(ValueError):
    """The request body is not a usable ExtenderArgs; ``status`` is the HTTP status to answer."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


# --- the parts of Kubernetes objects the extender reads -------------------------------------------------


class ObjectMeta(msgspec.Struct, omit_defaults=True):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    labels: dict[str, str] | None = None


class ResourceRequirements(msgspec.Struct, omit_defaults=True):
    # Quantities: extended resources are whole numbers, sent as strings ("2") or, by hand, as numbers.
    limits: dict[str, str | int | float] | None = None
    requests: dict[str, str | int | float] | None = None


class Container(msgspec.Struct, omit_defaults=True):
    name: str = ""
    resources: ResourceRequirements | None = None


class PodSpec(msgspec.Struct, omit_defaults=True):
    containers: list[Container] | None = None
    initContainers: list[Container] | None = None
    nodeName: str = ""


class Pod(msgspec.Struct, omit_defaults=True):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: PodSpec = msgspec.field(default_factory=PodSpec)


class NodeView(msgspec.Struct):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)


class RawNodeList(msgspec.Struct):
    items: list[msgspec.Raw] | None = None


class ExtenderArgs(msgspec.Struct):
    Pod: Pod | None
    Nodes: RawNodeList | None = None
    NodeNames: list[str] | None = None


# --- answers ---------------------------------------------------------------------------------------------


class NodeListOut(msgspec.Struct):
    # What Go writes for the &v1.NodeList{} kube-scheduler builds: empty TypeMeta omitted, ListMeta as {}.
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    items: list[msgspec.Raw] = msgspec.field(default_factory=list)


class ExtenderFilterResult(msgspec.Struct):
    # Every field is always written, null where Go would have a nil pointer, as kube-scheduler writes them.
    Nodes: NodeListOut | None = None
    NodeNames: list[str] | None = None
    FailedNodes: dict[str, str] = msgspec.field(default_factory=dict)
    FailedAndUnresolvableNodes: dict[str, str] = msgspec.field(default_factory=dict)
    Error: str = ""


class HostPriority(msgspec.Struct):
    Host: str
    Score: int


# --- decoding --------------------------------------------------------------------------------------------

_args_decoder = msgspec.json.Decoder(ExtenderArgs)
_node_decoder = msgspec.json.Decoder(NodeView)
_encoder = msgspec.json.Encoder()


@dataclass(slots=True)
class CandidateNodes:
    """The nodes of a request in one shape whichever form came in."""

    names: list[str]
    # Full form only: raw JSON of each node (same order as names) and their labels.
    raw: list[msgspec.Raw] | None = None
    labels: list[dict[str, str] | None] | None = None

    @property
    def full(self) -> bool:
        return self.raw is not None


@dataclass(slots=True)
class SchedulingRequest:
    pod: Pod
    nodes: CandidateNodes


def decode_args(body: bytes) -> SchedulingRequest:
    """Decode and validate an ExtenderArgs body; raise WireError (400 bad JSON, 422 bad shape)."""
    if not body:
        raise WireError("empty request body: expected kube-scheduler ExtenderArgs JSON", 400)
    try:
        args = _args_decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise WireError(f"request is not ExtenderArgs: {exc}") from None
    except msgspec.DecodeError as exc:
        raise WireError(f"malformed JSON: {exc}", 400) from None
    if args.Pod is None:
        raise WireError("ExtenderArgs.Pod is null: the pod being scheduled is required")
    if (args.Nodes is None) == (args.NodeNames is None):
        raise WireError(
            "ExtenderArgs must set exactly one of Nodes (nodeCacheCapable: false) and "
            "NodeNames (nodeCacheCapable: true), the other null"
        )
    if args.NodeNames is not None:
        return SchedulingRequest(args.Pod, CandidateNodes(args.NodeNames))
    raw_items = args.Nodes.items or []
    names: list[str] = []
    labels: list[dict[str, str] | None] = []
    for index, raw in enumerate(raw_items):
        try:
            node = _node_decoder.decode(raw)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise WireError(f"Nodes.items[{index}] is not a Node: {exc}") from None
        if not node.metadata.name:
            raise WireError(f"Nodes.items[{index}] has no metadata.name")
        names.append(node.metadata.name)
        labels.append(node.metadata.labels)
    return SchedulingRequest(args.Pod, CandidateNodes(names, raw_items, labels))


def encode_filter_result(
    nodes: CandidateNodes,
    passed: list[int],
    failed: dict[str, str],
    unresolvable: dict[str, str],
) -> bytes:
    """Answer a filter call in the form the request came in; ``passed`` are indexes into ``nodes``."""
    if nodes.full:
        result = ExtenderFilterResult(
            Nodes=NodeListOut(items=[nodes.raw[i] for i in passed]),
            FailedNodes=failed,
            FailedAndUnresolvableNodes=unresolvable,
        )
    else:
        result = ExtenderFilterResult(
            NodeNames=[nodes.names[i] for i in passed],
            FailedNodes=failed,
            FailedAndUnresolvableNodes=unresolvable,
        )
    return _encoder.encode(result)


def encode_filter_error(message: str) -> bytes:
    """A filter answer kube-scheduler reads as an error (it then fails or ignores the extender)."""
    return _encoder.encode(ExtenderFilterResult(Error=message))


def encode_priorities(hosts: list[str], scores: list[int]) -> bytes:
    return _encoder.encode([HostPriority(host, score) for host, score in zip(hosts, scores, strict=True)])


def encode(value: Any) -> bytes:
    return _encoder.encode(value)
