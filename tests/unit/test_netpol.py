"""The NetworkPolicy evaluator (tests/netpol.py) against the API's semantics, on hand-made policies: the rendered
policies' tests (tests/roles/test_network_policies.py) are only as good as this."""

from __future__ import annotations

import pytest
from netpol import Cluster, Endpoint, selector_matches

WEB = Endpoint("shop", {"app": "web"}, {"http": 8080}, ip="10.244.0.5")
DB = Endpoint("shop", {"app": "db"}, {"sql": 5432}, ip="10.244.0.6")
SPY = Endpoint("other", {"app": "spy"}, ip="10.244.9.9")
MONITOR = Endpoint("monitoring", {"app": "prometheus"}, ip="10.244.7.7")
NAMESPACES = {"shop": {"team": "shop"}, "other": {}, "monitoring": {"team": "ops"}}


def policy(namespace: str, spec: dict, name: str = "p") -> dict:
    return {"kind": "NetworkPolicy", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ({}, {"a": "1"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"}, True),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}, {}, False),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "1"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""}, False),
    ],
)
def test_label_selectors(selector, labels, expected):
    assert selector_matches(selector, labels) is expected


def test_no_policy_allows_everything_and_a_selecting_policy_isolates():
    assert Cluster(NAMESPACES, []).may_connect(SPY, DB, 5432)
    deny_db = policy("shop", {"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Ingress"]})
    cluster = Cluster(NAMESPACES, [deny_db])
    assert not cluster.may_connect(SPY, DB, 5432) and not cluster.may_connect(WEB, DB, 5432)
    assert cluster.may_connect(SPY, WEB, 8080)  # web is not selected: not isolated
    assert cluster.may_connect(DB, SPY, 1)  # an ingress policy does not isolate egress


def test_peers_pod_selector_alone_is_the_policys_namespace_and_both_selectors_are_anded():
    same_ns = policy(
        "shop", {"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}]}
    )
    cluster = Cluster(NAMESPACES, [same_ns])
    assert cluster.may_connect(WEB, DB, 5432)
    assert not cluster.may_connect(Endpoint("other", {"app": "web"}), DB, 5432)
    anded = policy(
        "shop",
        {
            "podSelector": {},
            "ingress": [
                {
                    "from": [
                        {
                            "namespaceSelector": {"matchLabels": {"team": "ops"}},
                            "podSelector": {"matchLabels": {"app": "prometheus"}},
                        }
                    ]
                }
            ],
        },
    )
    cluster = Cluster(NAMESPACES, [anded])
    assert cluster.may_connect(MONITOR, DB, 5432)
    assert not cluster.may_connect(Endpoint("monitoring", {"app": "grafana"}), DB, 5432)
    assert not cluster.may_connect(Endpoint("other", {"app": "prometheus"}), DB, 5432)
    # As two peers they are ORed: any pod of monitoring, or prometheus pods of the policy's own namespace.
    ored = policy(
        "shop",
        {
            "podSelector": {},
            "ingress": [
                {
                    "from": [
                        {"namespaceSelector": {"matchLabels": {"team": "ops"}}},
                        {"podSelector": {"matchLabels": {"app": "prometheus"}}},
                    ]
                }
            ],
        },
    )
    assert Cluster(NAMESPACES, [ored]).may_connect(Endpoint("monitoring", {"app": "grafana"}), DB, 5432)


def test_policies_add_up_and_both_ends_must_allow():
    deny_all = policy("shop", {"podSelector": {}, "policyTypes": ["Ingress"]}, "deny")
    allow_monitor = policy(
        "shop",
        {
            "podSelector": {"matchLabels": {"app": "db"}},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "ops"}}}]}],
        },
        "allow",
    )
    cluster = Cluster(NAMESPACES, [deny_all, allow_monitor])
    assert cluster.may_connect(MONITOR, DB, 5432) and not cluster.may_connect(MONITOR, WEB, 8080)
    egress_closed = policy("monitoring", {"podSelector": {}, "policyTypes": ["Egress"]})
    cluster = Cluster(NAMESPACES, [deny_all, allow_monitor, egress_closed])
    assert cluster.ingress_allows(MONITOR, DB, 5432) and not cluster.egress_allows(MONITOR, DB, 5432)
    assert not cluster.may_connect(MONITOR, DB, 5432)


def test_ports_named_numbered_ranges_and_protocols():
    rule = {
        "ports": [{"port": "sql", "protocol": "TCP"}, {"port": 9000, "endPort": 9010}, {"port": 53, "protocol": "UDP"}]
    }
    cluster = Cluster(NAMESPACES, [policy("shop", {"podSelector": {}, "ingress": [rule]})])
    assert cluster.may_connect(SPY, DB, 5432)
    assert not cluster.may_connect(SPY, WEB, 5432)  # web has no port named sql
    assert cluster.may_connect(SPY, WEB, 9005) and not cluster.may_connect(SPY, WEB, 9011)
    assert cluster.may_connect(SPY, WEB, 53, "UDP") and not cluster.may_connect(SPY, WEB, 53)


def test_ip_blocks_with_exceptions():
    egress = policy(
        "shop", {"podSelector": {}, "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}}]}]}
    )
    cluster = Cluster(NAMESPACES, [egress])
    assert cluster.egress_allows(WEB, Endpoint("other", ip="203.0.113.7"), 443)
    assert not cluster.egress_allows(WEB, SPY, 443)  # a pod address inside the excepted range
    # An address that is no pod is matched by ipBlock peers only.
    node = Endpoint("shop", ip="10.20.0.5", pod=False)
    pods_of_shop = policy("shop", {"podSelector": {}, "egress": [{"to": [{"podSelector": {}}]}]})
    assert not Cluster(NAMESPACES, [pods_of_shop]).egress_allows(WEB, node, 6443)
    assert Cluster(NAMESPACES, [pods_of_shop]).egress_allows(WEB, DB, 5432)


def test_an_unknown_namespace_or_operator_is_an_error_not_an_answer():
    cluster = Cluster(NAMESPACES, [policy("shop", {"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]})])
    with pytest.raises(ValueError, match="namespace nowhere is unknown"):
        cluster.may_connect(Endpoint("nowhere"), DB, 5432)
    with pytest.raises(ValueError, match="unknown selector operator"):
        selector_matches({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}, {"a": "2"})
