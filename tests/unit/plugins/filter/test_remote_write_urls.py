"""gpufleet.mig.remote_write_urls: one receiver URL per replica (the roles' push configuration reads it)."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.mig.plugins.filter.remote_write_urls import remote_write_urls


def test_each_replica_is_named_through_the_headless_service():
    assert remote_write_urls("gpufleet-extender", "2", "receivers", "gpufleet-system", 9402) == [
        "https://gpufleet-extender-0.receivers.gpufleet-system.svc:9402/api/v1/write",
        "https://gpufleet-extender-1.receivers.gpufleet-system.svc:9402/api/v1/write",
    ]
    assert remote_write_urls("s", 1, "r", "n", "9402", "http") == ["http://s-0.r.n.svc:9402/api/v1/write"]
    assert remote_write_urls("s", 0, "r", "n", 9402) == []


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("s", 1, "r", "n", 9402, "grpc"), "scheme must be https or http, not 'grpc'"),
        (("s", "two", "r", "n", 9402), "replicas and port must be whole numbers (got 'two', 9402)"),
        (("s", 1, "r", "n", None), "replicas and port must be whole numbers (got 1, None)"),
    ],
)
def test_bad_arguments_are_refused_saying_which(args, says):
    with pytest.raises(AnsibleFilterError, match=says.replace("(", r"\(").replace(")", r"\)")):
        remote_write_urls(*args)
