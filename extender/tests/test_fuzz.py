"""Fuzzing the verbs with hypothesis: whatever a client sends, the answer is 200 or a 4xx, never a 5xx."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet_extender.app import create_app

from extender_helpers import file_settings, gpus, mig, write_metrics

FLEET = {"hk-gpu-01": gpus(0.1, 0.95), "hk-gpu-02": gpus(0.9), "hk-gpu-03": mig(0, "2g.20gb", 0.5, total=20480)}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
quantities = st.one_of(st.integers(-3, 9), st.text(max_size=4), st.floats(allow_nan=True), st.none(), st.booleans())
resource_names = st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-", "cpu", ""])
pods = st.fixed_dictionaries(
    {},
    optional={
        "metadata": st.fixed_dictionaries({}, optional={"name": st.text(max_size=5), "namespace": json_values}),
        "spec": st.fixed_dictionaries(
            {},
            optional={
                "containers": st.lists(
                    st.fixed_dictionaries(
                        {
                            "resources": st.fixed_dictionaries(
                                {},
                                optional={
                                    "limits": st.dictionaries(resource_names, quantities, max_size=2),
                                    "requests": json_values,
                                },
                            )
                        }
                    ),
                    max_size=3,
                )
                | json_values,
                "initContainers": json_values,
            },
        ),
    },
)
names = st.lists(st.sampled_from(["hk-gpu-01", "hk-gpu-02", "hk-gpu-03", "x", ""]) | st.text(max_size=6), max_size=6)
extender_args = st.fixed_dictionaries(
    {},
    optional={
        "Pod": pods | json_values,
        "Nodes": st.none()
        | st.fixed_dictionaries(
            {
                "items": st.lists(
                    st.fixed_dictionaries(
                        {
                            "metadata": st.fixed_dictionaries(
                                {}, optional={"name": st.text(max_size=5), "labels": json_values}
                            )
                        }
                    ),
                    max_size=3,
                )
                | json_values
            }
        )
        | json_values,
        "NodeNames": st.none() | names | json_values,
    },
)


@pytest.fixture(scope="module")
def fuzz_client(tmp_path_factory):
    path = write_metrics(tmp_path_factory.mktemp("fuzz") / "dcgm.prom", FLEET)
    with TestClient(create_app(file_settings(path)), raise_server_exceptions=False) as test_client:
        yield test_client


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=extender_args, verb=st.sampled_from(["/filter", "/prioritize"]))
def test_fuzz_structured_requests_never_5xx(fuzz_client, payload, verb):
    answer = fuzz_client.post(verb, content=json.dumps(payload).encode())
    assert answer.status_code in (200, 400, 422), (payload, answer.text)
    if answer.status_code != 200:
        assert answer.json()["detail"]
        return
    nodes = payload.get("Nodes")
    sent = payload["NodeNames"] if nodes is None else [item["metadata"]["name"] for item in nodes.get("items") or []]
    result = answer.json()
    if verb == "/prioritize":
        assert [entry["Host"] for entry in result] == sent  # one per input node, in order
        return
    kept = result["NodeNames"] if nodes is None else [item["metadata"]["name"] for item in result["Nodes"]["items"]]
    rejected = [*result["FailedNodes"], *result["FailedAndUnresolvableNodes"]]
    assert set(kept) | set(rejected) == set(sent) and not set(kept) & set(rejected)  # never a node not sent


@settings(max_examples=100, deadline=None)
@given(raw=st.binary(max_size=64), verb=st.sampled_from(["/filter", "/prioritize"]))
def test_fuzz_raw_bytes_never_5xx(fuzz_client, raw, verb):
    assert fuzz_client.post(verb, content=raw).status_code in (200, 400, 422)
