"""kube-scheduler's wire format: requests as Go marshals ExtenderArgs, answers as Go unmarshals them."""

from __future__ import annotations

import json

import pytest
from gpufleet_testsupport.scheduler_requests import make_pod, names_args, node_obj, nodes_args

from gpufleet_extender.wire import (
    WireError,
    decode_args,
    encode,
    encode_filter_pieces,
    encode_filter_result,
)

from extender_helpers import body

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
    assert request.pod.metadata.name == "job-1"
    assert request.nodes.full and request.nodes.names == ["n1", "n2"]
    assert request.nodes.labels[0]["zone"] == "a"
    answer = json.loads(encode_filter_result(request.nodes, [0], {}, {}))
    assert answer["NodeNames"] is None
    assert answer["Nodes"]["items"] == [nodes[0]]  # every field kept, including ones the extender ignores
    # The item is the request's own text, not a re-encoding.
    assert json.dumps(nodes[0], separators=(",", ":")).encode() in encode_filter_result(request.nodes, [0], {}, {})


DEEP = b"[" * 100_000 + b"]" * 100_000  # deeper than msgspec's parser goes


# The whole message, not a fragment: it is what the operator reads in kube-scheduler's log for a 400/422 answer.
@pytest.mark.parametrize(
    ("raw", "status", "message"),
    [
        (b"", 400, "empty request body: expected kube-scheduler ExtenderArgs JSON"),
        (b"{", 400, "malformed JSON: Input data was truncated"),
        (b"[]", 422, "request is not ExtenderArgs: Expected `object`, got `array`"),
        (b'{"NodeNames":["a"]}', 422, "request is not ExtenderArgs: Object missing required field `Pod`"),
        (b'{"Pod":null,"NodeNames":["a"]}', 422, "ExtenderArgs.Pod is null: the pod being scheduled is required"),
        (
            b'{"Pod":{},"Nodes":null,"NodeNames":null}',
            422,
            "ExtenderArgs must set exactly one of Nodes (nodeCacheCapable: false) and NodeNames "
            "(nodeCacheCapable: true), the other null",
        ),
        (
            b'{"Pod":{},"Nodes":{"items":[]},"NodeNames":["a"]}',
            422,
            "ExtenderArgs must set exactly one of Nodes (nodeCacheCapable: false) and NodeNames "
            "(nodeCacheCapable: true), the other null",
        ),
        (b'{"Pod":{},"NodeNames":"a"}', 422, "ExtenderArgs.NodeNames must be a list of node names"),
        (
            b'{"Pod":{"spec":{"containers":"x"}},"NodeNames":[]}',
            422,
            "request is not ExtenderArgs: Expected `array | null`, got `str` - at `$.Pod.spec.containers`",
        ),
        (b'{"Pod":{},"Nodes":5}', 422, "ExtenderArgs.Nodes: Expected `object | null`, got `int`"),
        (b'{"Pod":{},"Nodes":{"items":[{"metadata":{}}]}}', 422, "Nodes.items[0] has no metadata.name"),
        (b'{"Pod":{},"Nodes":{"items":[5]}}', 422, "Nodes.items[0] is not a Node: Expected `object`, got `int`"),
        (b'{"Pod":{},"NodeNames":' + DEEP + b"}", 400, "malformed JSON: nested too deeply"),
        # Invalid UTF-8 is malformed JSON (400) wherever it is, also in the parts decoded late or not at all.
        (
            b'{"Pod":{},"NodeNames":["a\xff"]}',
            400,
            "ExtenderArgs.NodeNames: malformed JSON: Invalid UTF-8 encoded string",
        ),
        (
            b'{"Pod":{},"Nodes":{"items":[{"metadata":{"name":"n"},"status":{"x":"\xff"}}]}}',
            400,
            "ExtenderArgs.Nodes: malformed JSON: invalid UTF-8 at byte 50",
        ),
    ],
)
def test_bad_requests_are_answered_with_their_status_and_exact_message(raw, status, message):
    with pytest.raises(WireError) as caught:
        request = decode_args(raw)
        request.nodes.names  # noqa: B018 - NodeNames are decoded on first use
    assert (caught.value.status, str(caught.value)) == (status, message)


def test_wrong_name_type_is_reported_lazily_with_its_path():
    request = decode_args(b'{"Pod":{},"NodeNames":["a",1]}')
    with pytest.raises(WireError) as caught:
        request.nodes.names  # noqa: B018
    assert caught.value.status == 422
    assert str(caught.value) == "ExtenderArgs.NodeNames: Expected `str`, got `int` - at `$.NodeNames[1]`"


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


def test_full_nodes_answer_carries_every_passing_node_and_the_reasons_of_the_others():
    nodes = [node_obj("n1"), node_obj("n2"), node_obj("n3")]
    request = decode_args(body(nodes_args(make_pod(), nodes)))
    answer = json.loads(encode_filter_result(request.nodes, [1], {"n1": "n1: busy"}, {"n3": "n3: not in pool a"}))
    assert [item["metadata"]["name"] for item in answer["Nodes"]["items"]] == ["n2"]
    assert answer["FailedNodes"] == {"n1": "n1: busy"}
    assert answer["FailedAndUnresolvableNodes"] == {"n3": "n3: not in pool a"}
    everyone = json.loads(encode_filter_result(request.nodes, None, {}, {}))
    assert everyone["Nodes"]["items"] == nodes
    assert (everyone["FailedNodes"], everyone["FailedAndUnresolvableNodes"]) == ({}, {})


def test_a_passing_subset_without_reasons_is_answered_as_that_subset():
    request = decode_args(body(names_args(make_pod(), ["n1", "n2", "n3"])))
    answer = json.loads(encode_filter_result(request.nodes, [0, 2], {}, {}))
    assert answer["NodeNames"] == ["n1", "n3"]


def test_every_node_passing_with_reasons_for_others_keeps_the_reasons():
    # passed=None (all candidates pass) while nodes outside the candidates are reported as unresolvable.
    request = decode_args(body(names_args(make_pod(), ["n1", "n2"])))
    answer = json.loads(encode_filter_result(request.nodes, None, {"gone": "x"}, {"n9": "n9: not in pool a"}))
    assert answer["NodeNames"] == ["n1", "n2"]
    assert answer["FailedNodes"] == {"gone": "x"}
    assert answer["FailedAndUnresolvableNodes"] == {"n9": "n9: not in pool a"}


def test_everything_passed_answers_with_the_received_names_text_verbatim():
    received = b'[ "n1", "caf\\u00e9" ]'
    request = decode_args(b'{"Pod":{},"Nodes":null,"NodeNames":' + received + b"}")
    answer = encode_filter_result(request.nodes, None, {}, {})
    assert received in answer
    assert json.loads(answer)["NodeNames"] == ["n1", "café"]
