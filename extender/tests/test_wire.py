"""kube-scheduler's wire format: requests as Go marshals ExtenderArgs, answers as Go unmarshals them."""

from __future__ import annotations

import json

import pytest

from gpufleet_extender.wire import (
    WireError,
    decode_args,
    encode,
    encode_filter_pieces,
    encode_filter_result,
    encode_priorities,
)

from extender_helpers import body, make_pod, names_args, node_obj, nodes_args

# What kube-scheduler (HTTPExtender.Filter with nodeCacheCapable: true) writes: Go field names, nil as null.
GO_NAMES_REQUEST = (
    b'{"Pod":{"metadata":{"name":"p","namespace":"ns","uid":"u1","creationTimestamp":null},'
    b'"spec":{"containers":[{"name":"c","image":"i","resources":{"limits":{"nvidia.com/gpu":"1"},'
    b'"requests":{"nvidia.com/gpu":"1"}}}]},"status":{}},"Nodes":null,"NodeNames":["n1","n2"]}'
)

FILTER_RESULT_KEYS = ["Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"]


def test_decodes_go_names_request():
    request = decode_args(GO_NAMES_REQUEST)
    assert request.nodes.names == ["n1", "n2"]
    assert not request.nodes.full
    assert request.pod.metadata.namespace == "ns"
    assert request.pod.spec.containers[0].resources.limits == {"nvidia.com/gpu": "1"}


def test_names_answer_has_every_go_field_and_null_nodes():
    request = decode_args(GO_NAMES_REQUEST)
    answer = json.loads(encode_filter_result(request.nodes, [1], {"n1": "n1: busy"}, {}))
    assert list(answer) == FILTER_RESULT_KEYS
    assert answer["Nodes"] is None  # Go's nil *NodeList
    assert answer["NodeNames"] == ["n2"]
    assert answer["FailedNodes"] == {"n1": "n1: busy"}
    assert answer["FailedAndUnresolvableNodes"] == {}
    assert answer["Error"] == ""


def test_empty_names_answer_is_an_empty_list_not_null():
    # kube-scheduler reads NodeNames: null as "use Nodes"; with both null every node would vanish silently.
    request = decode_args(body(names_args(make_pod(), ["n1"])))
    answer = json.loads(encode_filter_result(request.nodes, [], {"n1": "x"}, {}))
    assert answer["NodeNames"] == []


def test_full_nodes_come_back_byte_for_byte():
    nodes = [node_obj("n1", {"zone": "a"}), node_obj("n2")]
    nodes[0]["status"]["unknownFutureField"] = {"nested": [1, 2.5, None, True]}
    raw = json.dumps(nodes_args(make_pod(), nodes), separators=(",", ":")).encode()
    request = decode_args(raw)
    assert request.nodes.full and request.nodes.names == ["n1", "n2"]
    assert request.nodes.labels[0]["zone"] == "a"
    answer = json.loads(encode_filter_result(request.nodes, [0], {}, {}))
    assert answer["NodeNames"] is None
    assert answer["Nodes"]["items"] == [nodes[0]]  # every field kept, including ones the extender ignores
    # The item is the request's own text, not a re-encoding.
    assert json.dumps(nodes[0], separators=(",", ":")).encode() in encode_filter_result(request.nodes, [0], {}, {})


def test_priority_list_shape():
    answer = json.loads(encode_priorities(["n1", "n2"], [10, 0]))
    assert answer == [{"Host": "n1", "Score": 10}, {"Host": "n2", "Score": 0}]


@pytest.mark.parametrize(
    ("raw", "status", "fragment"),
    [
        (b"", 400, "empty request body"),
        (b"{", 400, "malformed JSON"),
        (b"[]", 422, "not ExtenderArgs"),
        (b'{"NodeNames":["a"]}', 422, "Pod"),
        (b'{"Pod":null,"NodeNames":["a"]}', 422, "Pod is null"),
        (b'{"Pod":{},"Nodes":null,"NodeNames":null}', 422, "exactly one of Nodes"),
        (b'{"Pod":{},"Nodes":{"items":[]},"NodeNames":["a"]}', 422, "exactly one of Nodes"),
        (b'{"Pod":{},"NodeNames":"a"}', 422, "NodeNames must be a list"),
        (b'{"Pod":{"spec":{"containers":"x"}},"NodeNames":[]}', 422, "not ExtenderArgs"),
        (b'{"Pod":{},"Nodes":{"items":[{"metadata":{}}]}}', 422, "no metadata.name"),
        (b'{"Pod":{},"Nodes":{"items":[5]}}', 422, "items[0] is not a Node"),
    ],
)
def test_bad_requests_say_what_is_wrong(raw, status, fragment):
    with pytest.raises(WireError) as caught:
        request = decode_args(raw)
        request.nodes.names  # noqa: B018 - NodeNames are decoded on first use
    assert caught.value.status == status
    assert fragment in str(caught.value)


def test_wrong_name_type_is_reported_lazily_with_its_path():
    request = decode_args(b'{"Pod":{},"NodeNames":["a",1]}')
    with pytest.raises(WireError, match=r"NodeNames\[1\]"):
        request.nodes.names  # noqa: B018


def test_all_passed_answer_is_the_same_json_as_the_general_one():
    request = decode_args(b'{"Pod":{},"Nodes":null,"NodeNames":[ "n1", "caf\\u00e9", "x\\"y" ]}')
    fast = encode_filter_result(request.nodes, None, {}, {})
    general = encode_filter_result(request.nodes, [0, 1, 2], {}, {})
    assert json.loads(fast) == json.loads(general)
    assert json.loads(fast)["NodeNames"] == ["n1", "café", 'x"y']


@pytest.mark.parametrize(
    ("passed", "failed", "unresolvable"),
    [
        (["n0", "n2"], {"n1": 'n1: "quoted" \\ reason é'}, {"n3": "n3: not in pool a"}),
        ([], {"n1": "x"}, {}),
        (["n0"], {}, {"n1": "y", "n2": "z"}),
    ],
)
def test_an_answer_joined_from_pieces_is_the_encoders_answer_byte_for_byte(passed, failed, unresolvable):
    names = [*passed, *failed, *unresolvable]
    request = decode_args(json.dumps({"Pod": {}, "NodeNames": names}).encode())

    def joined(items):
        return b",".join(items)

    pieces = encode_filter_pieces(
        joined(encode(name) for name in passed),
        joined(encode(name) + b":" + encode(reason) for name, reason in failed.items()),
        joined(encode(name) + b":" + encode(reason) for name, reason in unresolvable.items()),
    )
    assert pieces == encode_filter_result(request.nodes, list(range(len(passed))), failed, unresolvable)
