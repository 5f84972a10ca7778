"""A small evaluator of NetworkPolicy objects (networking.k8s.io/v1): may this pod reach that pod on that port?

The test control plane runs no CNI, so nothing enforces NetworkPolicies there; this reads the rendered objects and
answers with the API's semantics (https://kubernetes.io/docs/concepts/services-networking/network-policies/):

- a pod is isolated for a direction when a policy of its namespace selects it and lists that direction in
  policyTypes (default: Ingress, plus Egress when the policy has an egress section); a pod no policy isolates
  allows everything in that direction;
- a connection needs the source's egress *and* the destination's ingress to allow it; policies add up (a rule of
  any selecting policy that matches allows);
- a peer with podSelector alone means pods of the policy's namespace, namespaceSelector alone all pods of the
  matching namespaces, both together the pods matching both; ipBlock matches the address (minus `except`);
- a rule's ports: none = every port; a named port is the destination container's port of that name; endPort.

Pods are `Endpoint`s: a namespace, labels, named container ports and an address (the evaluator assumes pod
addresses lie in the cluster's ranges, which is what makes ipBlock rules with `except` meaningful); an Endpoint
with pod=False is an address that is no pod (a node, the API server), which only ipBlock peers match.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Endpoint:
    namespace: str
    labels: dict[str, str] = field(default_factory=dict, hash=False)
    ports: dict[str, int] = field(default_factory=dict, hash=False)  # container port name -> number
    ip: str = "10.244.0.10"
    name: str = ""
    pod: bool = True  # False: a node or host-network address (the API server), which only ipBlock peers match


def selector_matches(selector: dict | None, labels: dict[str, str]) -> bool:
    """A LabelSelector: matchLabels and matchExpressions (In, NotIn, Exists, DoesNotExist); {} matches all."""
    selector = selector or {}
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise ValueError(f"unknown selector operator {operator!r}")
    return True


class Cluster:
    """Namespaces (name -> labels; kubernetes.io/metadata.name is added as the apiserver does) and policies."""

    def __init__(self, namespaces: dict[str, dict[str, str]], policies: list[dict]):
        self.namespaces = {
            name: {**(labels or {}), "kubernetes.io/metadata.name": name} for name, labels in namespaces.items()
        }
        self.policies = [p for p in policies if p.get("kind") == "NetworkPolicy"]

    @classmethod
    def from_documents(cls, documents: list[dict], extra_namespaces=()) -> Cluster:
        """Namespaces and policies out of rendered manifests; namespaces named only by objects are created bare."""
        namespaces: dict[str, dict[str, str]] = {name: {} for name in extra_namespaces}
        for doc in documents:
            if doc.get("kind") == "Namespace":
                namespaces[doc["metadata"]["name"]] = dict(doc["metadata"].get("labels") or {})
            elif doc.get("metadata", {}).get("namespace"):
                namespaces.setdefault(doc["metadata"]["namespace"], {})
        return cls(namespaces, documents)

    def _isolating(self, pod: Endpoint, direction: str) -> list[dict]:
        chosen = []
        for policy in self.policies:
            if policy["metadata"].get("namespace") != pod.namespace:
                continue
            spec = policy["spec"]
            types = spec.get("policyTypes") or (["Ingress"] + (["Egress"] if "egress" in spec else []))
            if direction in types and selector_matches(spec.get("podSelector"), pod.labels):
                chosen.append(policy)
        return chosen

    def _peer_matches(self, peer: dict, policy_namespace: str, other: Endpoint) -> bool:
        if "ipBlock" in peer:
            address = ipaddress.ip_address(other.ip)
            block = peer["ipBlock"]
            if address not in ipaddress.ip_network(block["cidr"], strict=False):
                return False
            return not any(address in ipaddress.ip_network(e, strict=False) for e in block.get("except") or [])
        if not other.pod:
            return False
        if other.namespace not in self.namespaces:
            raise ValueError(f"namespace {other.namespace} is unknown to the evaluator")
        if "namespaceSelector" in peer:
            if not selector_matches(peer["namespaceSelector"], self.namespaces[other.namespace]):
                return False
        elif other.namespace != policy_namespace:
            return False
        return selector_matches(peer.get("podSelector"), other.labels)

    @staticmethod
    def _port_matches(rule: dict, destination: Endpoint, port: int, protocol: str) -> bool:
        ports = rule.get("ports") or []
        if not ports:
            return True
        for entry in ports:
            if entry.get("protocol", "TCP") != protocol:
                continue
            wanted = entry.get("port")
            if wanted is None:
                return True
            if isinstance(wanted, str):
                wanted = destination.ports.get(wanted)
                if wanted is None:
                    continue
            if wanted <= port <= entry.get("endPort", wanted):
                return True
        return False

    def _allows(self, pod: Endpoint, other: Endpoint, destination: Endpoint, direction: str, port, protocol) -> bool:
        policies = self._isolating(pod, direction)
        if not policies:
            return True
        section, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
        for policy in policies:
            for rule in policy["spec"].get(section) or []:
                peers = rule.get(peers_key)
                peer_ok = not peers or any(self._peer_matches(p, pod.namespace, other) for p in peers)
                if peer_ok and self._port_matches(rule, destination, port, protocol):
                    return True
        return False

    def egress_allows(self, source: Endpoint, destination: Endpoint, port: int, protocol: str = "TCP") -> bool:
        return self._allows(source, destination, destination, "Egress", port, protocol)

    def ingress_allows(self, source: Endpoint, destination: Endpoint, port: int, protocol: str = "TCP") -> bool:
        return self._allows(destination, source, destination, "Ingress", port, protocol)

    def may_connect(self, source: Endpoint, destination: Endpoint, port: int, protocol: str = "TCP") -> bool:
        return self.egress_allows(source, destination, port, protocol) and self.ingress_allows(
            source, destination, port, protocol
        )


def workload_endpoints(documents: list[dict], ip: str = "10.244.1.10") -> list[Endpoint]:
    """One Endpoint per pod template of the rendered workloads (Deployment, DaemonSet, StatefulSet, Job)."""
    endpoints = []
    for doc in documents:
        if doc.get("kind") not in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
            continue
        template = doc["spec"]["template"]
        ports = {
            p["name"]: p["containerPort"]
            for c in template["spec"].get("containers", [])
            for p in c.get("ports") or []
            if "name" in p
        }
        endpoints.append(
            Endpoint(
                namespace=doc["metadata"]["namespace"],
                labels=dict(template["metadata"].get("labels") or {}),
                ports=ports,
                ip=ip,
                name=f"{doc['kind']}/{doc['metadata']['name']}",
            )
        )
    return endpoints
