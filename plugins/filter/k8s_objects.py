"""gpufleet.mig.k8s_owned and gpufleet.mig.k8s_uninstall_plan: how the collection marks every Kubernetes object it
delivers, and the order in which playbooks/uninstall.yml takes them away again.

The k8s_manifests role is the one place objects reach the cluster (or a manifest file); it passes every set through
k8s_owned, so that each object carries the label C(app.kubernetes.io/part-of=gpufleet) (what uninstall selects by)
and the annotation C(gpufleet.io/manifest=<set>) (which role delivered it, so that uninstall can go in the reverse
order of site.yml). Nodes are the cluster's, not the collection's: they are never marked, and uninstall only takes
the tenants role's labels and taint off them.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

PART_OF_LABEL = "app.kubernetes.io/part-of"
PART_OF = "gpufleet"
MANIFEST_ANNOTATION = "gpufleet.io/manifest"
# Objects of these kinds belong to the cluster; the collection only sets fields on them.
UNOWNED_KINDS = frozenset({"Node"})
# playbooks/site.yml's order of the roles that deliver Kubernetes objects; uninstall goes the other way. The
# fleet's namespaces (namespaces/<name>) go last, after everything that lives in them.
SITE_ORDER = (
    "tenants",
    "gpu_device_plugin",
    "gpu_dra_driver",
    "dcgm_exporter",
    "gpu_extender",
    "kube_scheduler",
    "descheduler",
    "monitoring",
)


def k8s_owned(documents, set_name: str) -> list[dict]:
    if not isinstance(documents, list) or not all(isinstance(d, dict) for d in documents):
        raise AnsibleFilterError(f"k8s_owned: expected a list of Kubernetes objects for {set_name}")
    marked = []
    for document in documents:
        if document.get("kind") in UNOWNED_KINDS:
            marked.append(document)
            continue
        # New mappings rather than a deep copy: the input's values may be Ansible's lazily templated containers.
        metadata = dict(document.get("metadata") or {})
        metadata["labels"] = {**(metadata.get("labels") or {}), PART_OF_LABEL: PART_OF}
        metadata["annotations"] = {**(metadata.get("annotations") or {}), MANIFEST_ANNOTATION: set_name}
        marked.append({**document, "metadata": metadata})
    return marked


def _manifest(item: dict) -> str:
    return str(((item.get("metadata") or {}).get("annotations") or {}).get(MANIFEST_ANNOTATION, ""))


def k8s_uninstall_plan(objects, keep_tenant_namespaces: bool = True) -> dict:
    """What uninstall does with the cluster's gpufleet objects (k8s_info resources): C(delete) them in the reverse
    of site.yml's order by the role that delivered them, objects of an unknown set next, the fleet's namespaces
    (namespaces/<name>) last; C(keep) names the tenants' namespaces (delivered by the tenants role), which hold the
    tenants' workloads, unless `keep_tenant_namespaces` is false."""
    if not isinstance(objects, list):
        raise AnsibleFilterError("k8s_uninstall_plan: expected the list of objects k8s_info found")

    def rank(item: dict) -> int:
        role = _manifest(item).split("/", 1)[0]
        if role == "namespaces":
            return len(SITE_ORDER) + 1
        if role in SITE_ORDER:
            return len(SITE_ORDER) - 1 - SITE_ORDER.index(role)
        return len(SITE_ORDER)

    keep = [
        item["metadata"]["name"]
        for item in objects
        if keep_tenant_namespaces and item.get("kind") == "Namespace" and not _manifest(item).startswith("namespaces/")
    ]
    delete = [item for item in objects if not (item.get("kind") == "Namespace" and item["metadata"]["name"] in keep)]
    return {"delete": sorted(delete, key=rank), "keep": sorted(keep)}


def k8s_node_release_patch(node: dict, labels: list[str], taint_key: str) -> list[dict]:
    """The JSON patch that takes `labels` and the taints keyed `taint_key` off a Node (a k8s_info resource) and
    nothing else; [] when the node has none of them."""
    metadata = node.get("metadata") or {}
    present = metadata.get("labels") or {}
    ops: list[dict] = [
        {"op": "remove", "path": "/metadata/labels/" + label.replace("~", "~0").replace("/", "~1")}
        for label in labels
        if label in present
    ]
    taints = (node.get("spec") or {}).get("taints") or []
    kept = [taint for taint in taints if taint.get("key") != taint_key]
    if len(kept) < len(taints):
        ops.append({"op": "replace", "path": "/spec/taints", "value": kept})
    return ops


class FilterModule:
    def filters(self):
        return {
            "k8s_owned": k8s_owned,
            "k8s_uninstall_plan": k8s_uninstall_plan,
            "k8s_node_release_patch": k8s_node_release_patch,
        }
