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
from typing import Any, TypeVar

import msgspec

from gpufleet_extender.errors import ExtenderError


class WireError(ExtenderError, ValueError):
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
    restartPolicy: str | None = None  # init containers: "Always" makes a sidecar


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
    # Kept raw: decoded below once we know which form came in; the raw names also key the answer memo.
    Nodes: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"null"))
    NodeNames: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"null"))


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
_names_decoder = msgspec.json.Decoder(list[str] | None)
_node_list_decoder = msgspec.json.Decoder(RawNodeList | None)
_node_decoder = msgspec.json.Decoder(NodeView)

_T = TypeVar("_T")
_encoder = msgspec.json.Encoder()


class CandidateNodes:
    """The nodes of a request in one shape whichever form came in.

    For the NodeNames form the names are decoded on first use: a repeated candidate list can be answered
    from the memo by its JSON text alone (it was validated when first seen).
    """

    __slots__ = ("_names", "labels", "names_json", "raw")

    def __init__(
        self,
        names: list[str] | None = None,
        names_json: bytes | None = None,
        raw: list[msgspec.Raw] | None = None,
        labels: list[dict[str, str] | None] | None = None,
    ):
        self._names = names
        self.names_json = names_json  # NodeNames form: the JSON text of the list as received
        self.raw = raw  # Nodes form: each node's JSON, same order as names
        self.labels = labels  # Nodes form: each node's labels

    @property
    def full(self) -> bool:
        return self.raw is not None

    @property
    def names(self) -> list[str]:
        if self._names is None:
            assert self.names_json is not None  # a CandidateNodes is built with names or with names_json
            self._names = _decode_part(_names_decoder, self.names_json, "NodeNames") or []
        return self._names


@dataclass(slots=True)
class SchedulingRequest:
    pod: Pod
    nodes: CandidateNodes


def decode_args(body: bytes) -> SchedulingRequest:
    """Decode and validate an ExtenderArgs body; raise WireError (400 bad JSON, 422 bad shape)."""
    if not body:
        raise WireError("empty request body: expected kube-scheduler ExtenderArgs JSON", 400)
    args = _decode(_args_decoder, body, "request is not ExtenderArgs: ", "")
    if args.Pod is None:
        raise WireError("ExtenderArgs.Pod is null: the pod being scheduled is required")
    has_nodes, has_names = bytes(args.Nodes) != b"null", bytes(args.NodeNames) != b"null"
    if has_nodes == has_names:
        raise WireError(
            "ExtenderArgs must set exactly one of Nodes (nodeCacheCapable: false) and "
            "NodeNames (nodeCacheCapable: true), the other null"
        )
    if has_names:
        if not bytes(args.NodeNames).startswith(b"["):
            raise WireError("ExtenderArgs.NodeNames must be a list of node names")
        return SchedulingRequest(args.Pod, CandidateNodes(names_json=bytes(args.NodeNames)))
    # Node objects go back byte for byte in the answer, including fields msgspec skipped without reading:
    # an answer must not carry invalid UTF-8 that came in.
    _require_utf8(args.Nodes, "Nodes")
    nodes = _decode_part(_node_list_decoder, args.Nodes, "Nodes")
    assert nodes is not None  # has_nodes: Nodes is not null
    raw_items = nodes.items or []
    names: list[str] = []
    labels: list[dict[str, str] | None] = []
    for index, raw in enumerate(raw_items):
        node = _decode(_node_decoder, raw, f"Nodes.items[{index}] is not a Node: ", f"Nodes.items[{index}]: ")
        if not node.metadata.name:
            raise WireError(f"Nodes.items[{index}] has no metadata.name")
        names.append(node.metadata.name)
        labels.append(node.metadata.labels)
    return SchedulingRequest(args.Pod, CandidateNodes(names, raw=raw_items, labels=labels))


def _decode(decoder: msgspec.json.Decoder[_T], raw: bytes | msgspec.Raw, shape_prefix: str, json_prefix: str) -> _T:
    """``decoder.decode(raw)``, every way it can fail turned into a WireError (422 shape, 400 not JSON)."""
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise WireError(f"{shape_prefix}{exc}") from None
    except msgspec.DecodeError as exc:  # also invalid UTF-8 inside a string
        raise WireError(f"{json_prefix}malformed JSON: {exc}", 400) from None
    except RecursionError:  # msgspec's own depth limit; the body is a few KB of brackets, not a pod
        raise WireError(f"{json_prefix}malformed JSON: nested too deeply", 400) from None


def _decode_part(decoder: msgspec.json.Decoder[_T], raw: bytes | msgspec.Raw, field: str) -> _T:
    try:
        return _decode(decoder, raw, f"ExtenderArgs.{field}: ", f"ExtenderArgs.{field}: ")
    except WireError as exc:
        raise WireError(str(exc).replace("`$", f"`$.{field}"), exc.status) from None


def _require_utf8(raw: bytes | msgspec.Raw, field: str) -> None:
    try:
        str(memoryview(raw), "utf-8")
    except UnicodeDecodeError as exc:
        raise WireError(f"ExtenderArgs.{field}: malformed JSON: invalid UTF-8 at byte {exc.start}", 400) from None


# The answer when every candidate passed, cut where the NodeNames list goes (the first "[]" of the JSON).
_ALL_PASSED_PREFIX, _ALL_PASSED_SUFFIX = _encoder.encode(ExtenderFilterResult(NodeNames=[])).split(b"[]", 1)


# The empty answer cut inside its three lists ("[" | "],...{" | "},...{" | "},..."), for answers joined from
# already encoded pieces.
_PIECES_HEAD, _PIECES_FAILED, _PIECES_UNRESOLVABLE, _PIECES_TAIL = (
    _encoder.encode(ExtenderFilterResult(NodeNames=[])).replace(b"[]", b"[\0]").replace(b"{}", b"{\0}").split(b"\0")
)


def encode_filter_pieces(names: bytes, failed: bytes, unresolvable: bytes) -> bytes:
    """A NodeNames answer from encoded pieces: the passing names ('"a","b"'), the FailedNodes entries
    ('"c":"why"') and the FailedAndUnresolvableNodes entries, each comma-joined; the very bytes
    encode_filter_result writes for the same answer."""
    return b"".join((_PIECES_HEAD, names, _PIECES_FAILED, failed, _PIECES_UNRESOLVABLE, unresolvable, _PIECES_TAIL))


def encode_filter_result(
    nodes: CandidateNodes,
    passed: list[int] | None,
    failed: dict[str, str],
    unresolvable: dict[str, str],
) -> bytes:
    """Answer a filter call in the form the request came in.

    ``passed`` are indexes into ``nodes``, None when every node passed.
    """
    if nodes.raw is not None:  # nodes.full
        items = nodes.raw if passed is None else [nodes.raw[i] for i in passed]
        result = ExtenderFilterResult(
            Nodes=NodeListOut(items=items),
            FailedNodes=failed,
            FailedAndUnresolvableNodes=unresolvable,
        )
    elif passed is None and not failed and not unresolvable and nodes.names_json is not None:
        # Everything passed: the list goes back as the very bytes that came in.
        return _ALL_PASSED_PREFIX + nodes.names_json + _ALL_PASSED_SUFFIX
    else:
        names = nodes.names  # a property: read once, not per passing node
        result = ExtenderFilterResult(
            NodeNames=names if passed is None else list(map(names.__getitem__, passed)),
            FailedNodes=failed,
            FailedAndUnresolvableNodes=unresolvable,
        )
    return _encoder.encode(result)


def encode(value: Any) -> bytes:
    return _encoder.encode(value)
