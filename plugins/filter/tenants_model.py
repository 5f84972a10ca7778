"""gpufleet.mig.tenants_model: the tenants role's model of the inventory - pools, capacity, quotas and problems.

Computed once from the inventory and used by every template of the tenants role, which only renders it.
Quota rule (docs/tenants.md): per tenant and resource, explicit values from tenants_quota_overrides are taken as
they are; what is left of the pool's capacity goes to the tenant's other namespaces, split evenly (the remainder
one by one to the first namespaces in listed order) or, with tenants_quota_split=full, all of it to each of them.
A pool's capacity counts what the device plugin advertises: a time-sliced resource (the pool's `sharing`) is
devices x replicas.

Also gpufleet.mig.tenants_sharing: the pools' time-slicing alone (named device plugin configs, the node label
value per tenant, the extender's SHARED_RESOURCES), for the gpu_device_plugin and gpu_extender roles.
"""

from __future__ import annotations

import hashlib
import re

from ansible_collections.gpufleet.mig.plugins.module_utils.exceptions import MigError
from ansible_collections.gpufleet.mig.plugins.module_utils.host_gpus import host_gpus, node_name
from ansible_collections.gpufleet.mig.plugins.module_utils.names import (
    RESOURCE_FORMS,
    WHOLE_GPU_RESOURCE,
    parse_sharing,
    resource_name,
)

DOCUMENTATION = r"""
name: tenants_model
short_description: The tenant pools of the inventory, their capacity, quotas and every inconsistency
description:
  - Works out each tenant's pool (its group's hosts), the GPU resources each node exposes (device plugin mixed
    strategy), the pool capacity and each tenant namespace's quota, and lists every inventory problem as a sentence.
options:
  _input:
    description: C(hostvars).
    type: dict
    required: true
  groups:
    description: The C(groups) magic variable.
    type: dict
    required: true
  tenants:
    description: C(gpufleet_tenants) (tenant -> {group, namespaces, priority_class, pod_security, description}).
    type: dict
    required: true
  reserved_namespaces:
    description: >-
      Namespaces no tenant may own besides Kubernetes' own (kube-system, kube-public, kube-node-lease, default): the
      fleet's own (C(gpufleet_namespace), C(gpufleet_node_agents_namespace)).
    type: list
    elements: str
    default: []
  priority_classes:
    description: Names of the PriorityClasses the role defines (C(tenants_priority_classes) names).
    type: list
    elements: str
    default: []
  pod_security_level:
    description: Default Pod Security level of tenant namespaces (C(tenants_pod_security_level)).
    type: str
    default: restricted
  allow_privileged:
    description: C(tenants_pod_security_allow_privileged).
    type: bool
    default: false
  quota_split:
    description: C(tenants_quota_split), C(even) or C(full).
    type: str
    default: even
  quota_overrides:
    description: C(tenants_quota_overrides) (tenant -> namespace -> resource -> count).
    type: dict
    default: {}
  allow_overcommit:
    description: C(tenants_quota_allow_overcommit).
    type: bool
    default: false
  namespace_quota:
    description: C(tenants_namespace_quota), the object-count and CPU/memory quota of every tenant namespace (a
      ResourceQuota C(hard) mapping); a tenant's C(namespace_quota) is merged over it.
    type: dict
    default: {}
  access_group_prefix:
    description: A tenant without C(access) is bound to the group C(<prefix><tenant>) (C(tenants_access_group_prefix)).
    type: str
    default: "gpufleet:"
"""

EXAMPLES = r"""
- name: Work out the tenant pools
  ansible.builtin.set_fact:
    tenants_model: "{{ hostvars | gpufleet.mig.tenants_model(groups, gpufleet_tenants, quota_split='even') }}"
"""

RETURN = r"""
_value:
  description:
    - C(errors) inventory problems, one sentence each; C(resources) every GPU resource of the fleet
      (nvidia.com/gpu first, then the nvidia.com/mig-* sorted); C(tenants) tenant -> {group, hosts, node_names,
      namespaces, priority_class, pod_security, description, sharing, device_plugin_config, capacity, quotas, access,
      service_types, namespace_quota, dra_classes, dra_quotas}, C(sharing)
      resource -> replicas (>= 2 only), C(device_plugin_config) the name of the device plugin's config for the
      pool's nodes or null, C(capacity) what the pool's nodes advertise (devices x replicas); C(access)
      {groups, users} bound to the tenant's Role; C(service_types) the Service types its namespaces may create;
      C(namespace_quota) its object-count and CPU/memory quota; C(dra_classes) resource -> the DeviceClass of the
      pool's devices of that kind (resources the pool has); C(dra_quotas) namespace -> DeviceClass -> devices, every
      tenant's classes (another pool's are 0); C(dra_classes_fleet) every tenant's DeviceClasses;
      C(nodes) Kubernetes node name of each GPU node (C(gpufleet.mig.node_name)) -> tenant or null.
  type: dict
"""

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
POD_SECURITY_LEVELS = ("restricted", "baseline", "privileged")
# A node label value (the device plugin's config name is one: nvidia.com/device-plugin.config=<name>).
LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
SHARED_CONFIG_PREFIX = "time-sliced-"
# Kubernetes' own namespaces: a tenant's Role there (secrets access in kube-system) would reach the cluster's own.
KUBERNETES_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease", "default")
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName")
# A ResourceQuota key (pods, count/secrets, requests.cpu, ...) and a quantity (a count, 500m, 64Gi, 1e3).
QUOTA_KEY = re.compile(r"[a-z0-9]([-a-z0-9./]*[a-z0-9])?")
QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?([eE][0-9]+|[numkMGTPE]|[KMGTPE]i)?")


def _as_int(value) -> int:
    """Jinja's `int` filter: 0 for what is not a number."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _whole_number(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _config_name(sharing: dict[str, int]) -> str:
    """The device plugin config of one sharing setting, named after it (time-sliced-mig-1g.10gb-x4), so that pools
    with the same setting share one config; a digest when that is no label value (too long, a `+me` profile)."""
    parts = "_".join(f"{resource.removeprefix('nvidia.com/')}-x{n}" for resource, n in sorted(sharing.items()))
    name = SHARED_CONFIG_PREFIX + parts
    if LABEL_VALUE.fullmatch(name):
        return name
    return SHARED_CONFIG_PREFIX + hashlib.sha256(parts.encode()).hexdigest()[:16]


def _pool_sharing(tenant: str, value, errors: list[str]) -> dict[str, int]:
    """One pool's `sharing` as resource -> replicas, the entries of 2 replicas or more (1 is exclusive: the device
    plugin wants at least 2 in a time-slicing config)."""
    sharing, problems = parse_sharing(value, f"tenant {tenant}")
    errors.extend(problems)
    return {resource: replicas for resource, replicas in sharing.items() if replicas > 1}


def tenants_sharing(tenants) -> dict:
    """The pools' time-slicing: C(errors); C(tenants) tenant -> {resource: replicas} (shared pools only);
    C(configs) device plugin config name -> {resource: replicas}, one per distinct setting; C(labels) tenant ->
    config name (shared pools only); C(resources) resource -> replicas over the fleet (the extender's
    SHARED_RESOURCES; a resource shared with different counts in different pools keeps the largest, as the
    placement simulator does)."""
    errors: list[str] = []
    result: dict = {"errors": errors, "tenants": {}, "configs": {}, "labels": {}, "resources": {}}
    if not isinstance(tenants, dict):
        return result  # tenants_model reports the malformed gpufleet_tenants
    for tenant, spec in tenants.items():
        if not isinstance(spec, dict):
            continue
        sharing = _pool_sharing(str(tenant), spec.get("sharing"), errors)
        if not sharing:
            continue
        name = _config_name(sharing)
        result["tenants"][str(tenant)] = sharing
        result["configs"][name] = dict(sorted(sharing.items()))
        result["labels"][str(tenant)] = name
        for resource, replicas in sharing.items():
            result["resources"][resource] = max(replicas, result["resources"].get(resource, 1))
    result["configs"] = dict(sorted(result["configs"].items()))
    result["resources"] = dict(sorted(result["resources"].items()))
    return result


class _Model:
    def __init__(
        self,
        hostvars,
        groups,
        priority_classes,
        pod_security_level,
        allow_privileged,
        access_group_prefix,
        reserved_namespaces=(),
    ):
        self.hostvars, self.groups = hostvars, groups
        self.reserved_namespaces = [*KUBERNETES_NAMESPACES, *(str(n) for n in reserved_namespaces or () if n)]
        self.access_group_prefix = access_group_prefix
        self.priority_classes = list(priority_classes)
        self.pod_security_level, self.allow_privileged = pod_security_level, allow_privileged
        self.errors: list[str] = []
        self.tenant_of_host: dict[str, str] = {}
        self.tenant_of_ns: dict[str, str] = {}
        self.tenants: dict[str, dict] = {}
        self.gpu_nodes = list(groups.get("gpu_nodes", []))
        self.sharing: dict = tenants_sharing({})

    def pools(self, tenants) -> None:
        """1. Each tenant's pool: its group's hosts, checked against the other pools and the hosts' gpufleet_tenant."""
        if not isinstance(tenants, dict) or not tenants:
            self.errors.append(
                "gpufleet_tenants must be a non-empty mapping of tenant name -> {group, namespaces, priority_class}"
            )
            return
        self.sharing = tenants_sharing(tenants)
        self.errors.extend(self.sharing["errors"])
        for tenant, spec in tenants.items():
            if not isinstance(spec, dict) or "group" not in spec or "namespaces" not in spec:
                self.errors.append(f"tenant {tenant}: needs at least `group` and `namespaces`")
                continue
            self._pool(str(tenant), spec)

    def _pool(self, tenant: str, spec: dict) -> None:
        if not DNS_LABEL.fullmatch(tenant):
            self.errors.append(
                f"tenant {tenant}: the name is a label value and part of object names, so it must be a DNS label "
                "(lower-case letters, digits, -)"
            )
        group = spec["group"]
        hosts = list(self.groups.get(group, []))
        if group not in self.groups:
            self.errors.append(f"tenant {tenant}: group {group} does not exist in the inventory")
        elif not hosts:
            self.errors.append(
                f"tenant {tenant}: group {group} has no hosts (a tenant pool needs at least one GPU node)"
            )
        for host in hosts:
            self._pool_host(tenant, group, host)
        namespaces = spec["namespaces"]
        namespaces = list(namespaces) if isinstance(namespaces, (list, tuple)) else []
        if not namespaces:
            self.errors.append(f"tenant {tenant}: namespaces must be a non-empty list")
        for ns in namespaces:
            if not isinstance(ns, str) or not DNS_LABEL.fullmatch(ns):
                self.errors.append(f"tenant {tenant}: namespace {ns} is not a valid namespace name (DNS label)")
            elif ns in self.reserved_namespaces:
                self.errors.append(
                    f"tenant {tenant}: namespace {ns} is reserved (Kubernetes' own or the fleet's: "
                    f"{', '.join(self.reserved_namespaces)}); a tenant's Role and labels must not reach it"
                )
            elif ns in self.tenant_of_ns:
                self.errors.append(f"namespace {ns} is listed by two tenants: {self.tenant_of_ns[ns]} and {tenant}")
            else:
                self.tenant_of_ns[ns] = tenant
        priority_class = spec.get("priority_class")
        if "priority_class" in spec and priority_class not in self.priority_classes:
            self.errors.append(
                f"tenant {tenant}: priority_class {priority_class} is not one of tenants_priority_classes "
                f"({', '.join(self.priority_classes)})"
            )
        pod_security = spec.get("pod_security", self.pod_security_level)
        if pod_security not in POD_SECURITY_LEVELS:
            self.errors.append(
                f"tenant {tenant}: pod_security must be restricted, baseline or privileged, not {pod_security}"
            )
        elif pod_security == "privileged" and not self.allow_privileged:
            self.errors.append(
                f"tenant {tenant}: pod_security privileged lets its pods run privileged, with host paths and the host "
                "network, i.e. as root on the GPU nodes; set tenants_pod_security_allow_privileged to accept that"
            )
        self.tenants[tenant] = {
            "access": self._access(tenant, spec.get("access")),
            "service_types": self._service_types(tenant, spec.get("service_types", ["ClusterIP"])),
            "namespace_quota_override": spec.get("namespace_quota", {}),
            "group": group,
            "hosts": hosts,
            "node_names": [self._node_name(host) for host in hosts],
            "namespaces": namespaces,
            "priority_class": priority_class,
            "pod_security": pod_security,
            "description": spec.get("description", ""),
            "sharing": self.sharing["tenants"].get(tenant, {}),
            "device_plugin_config": self.sharing["labels"].get(tenant),
        }

    def _node_name(self, host: str) -> str:
        try:
            return node_name(host, self.hostvars[host])
        except MigError as exc:
            if exc.message not in self.errors:
                self.errors.append(exc.message)
            return host

    def _access(self, tenant: str, value) -> dict[str, list[str]]:
        """Who holds the tenant's Role: {groups, users}; the group <prefix><tenant> when the inventory names nobody."""
        if value is None:
            return {"groups": [f"{self.access_group_prefix}{tenant}"], "users": []}
        if not isinstance(value, dict) or set(value) - {"groups", "users"}:
            self.errors.append(f"tenant {tenant}: access must be a mapping with groups and/or users, not {value!r}")
            return {"groups": [], "users": []}
        access: dict[str, list[str]] = {}
        errors_before = len(self.errors)
        for kind in ("groups", "users"):
            names = value.get(kind, [])
            if not isinstance(names, list) or not all(isinstance(n, str) and n.strip() for n in names):
                self.errors.append(f"tenant {tenant}: access.{kind} must be a list of names, not {names!r}")
                names = []
            for name in names:
                if name.startswith("system:"):
                    self.errors.append(
                        f"tenant {tenant}: access.{kind} names {name}, one of the cluster's own system: identities "
                        "(system:authenticated would give the tenant's Role to everyone)"
                    )
            access[kind] = [n for n in names if not n.startswith("system:")]
        if not access["groups"] and not access["users"] and len(self.errors) == errors_before:
            self.errors.append(f"tenant {tenant}: access names no group and no user")
        return access

    def _service_types(self, tenant: str, value) -> list[str]:
        if not isinstance(value, list) or not value or not all(t in SERVICE_TYPES for t in value):
            self.errors.append(
                f"tenant {tenant}: service_types must be a non-empty list of {', '.join(SERVICE_TYPES)}, not {value!r}"
            )
            return ["ClusterIP"]
        return list(value)

    def namespace_quotas(self, defaults) -> None:
        """Object counts and CPU/memory per tenant namespace: tenants_namespace_quota, the tenant's own merged over."""
        for tenant, pool in self.tenants.items():
            override = pool.pop("namespace_quota_override")
            where = f"tenant {tenant}: namespace_quota"
            if not isinstance(override, dict):
                self.errors.append(f"{where} must be a mapping of quota key -> quantity, not {override!r}")
                override = {}
            merged = {**(defaults if isinstance(defaults, dict) else {}), **override}
            for key, value in merged.items():
                if not isinstance(key, str) or not QUOTA_KEY.fullmatch(key) or "nvidia.com/" in key:
                    self.errors.append(
                        f"{where}: {key!r} is no ResourceQuota key of objects, CPU or memory (GPU quotas are sized "
                        "from the pool)"
                    )
                elif isinstance(value, bool) or not QUANTITY.fullmatch(str(value)):
                    self.errors.append(f"{where}.{key} must be a quantity such as 100, 500m or 64Gi, not {value!r}")
            pool["namespace_quota"] = {str(k): str(v) for k, v in sorted(merged.items())}

    def dra(self) -> list[str]:
        """DRA: each pool's DeviceClass per kind of device it has (dra_device_class, the one naming rule) and a
        device-count quota per class and namespace: the namespace's GPU quota in devices (time-slicing replicas
        divided out, rounded down); every other tenant's class 0."""
        fleet: list[str] = []
        for tenant, pool in self.tenants.items():
            pool["dra_classes"] = {
                r: dra_device_class(tenant, r) for r, count in pool.get("capacity", {}).items() if count > 0
            }
            fleet.extend(pool["dra_classes"].values())
        for pool in self.tenants.values():
            replicas = pool["sharing"]
            pool["dra_quotas"] = {
                ns: {
                    **dict.fromkeys(fleet, 0),
                    **{cls: pool["quotas"][ns][r] // replicas.get(r, 1) for r, cls in pool["dra_classes"].items()},
                }
                for ns in pool["namespaces"]
                if ns in pool.get("quotas", {})
            }
        return sorted(fleet)

    def _pool_host(self, tenant: str, group: str, host: str) -> None:
        if host in self.tenant_of_host:
            other = self.tenant_of_host[host]
            self.errors.append(
                f"host {host} is in two tenant groups: {self.tenants[other]['group']} (tenant {other}) and {group} "
                f"(tenant {tenant}); a node belongs to one pool"
            )
        else:
            self.tenant_of_host[host] = tenant
        if host not in self.gpu_nodes:
            self.errors.append(f"host {host} (group {group} of tenant {tenant}) is not in the gpu_nodes group")
        claimed = self.hostvars[host].get("gpufleet_tenant")
        if claimed is None:
            self.errors.append(f"host {host} is in group {group} of tenant {tenant} but has no gpufleet_tenant")
        elif claimed != tenant:
            self.errors.append(f"host {host} has gpufleet_tenant={claimed} but is in group {group} of tenant {tenant}")

    def unpooled_claims(self) -> None:
        """A GPU node that names a tenant in gpufleet_tenant must be in that tenant's group."""
        for host in self.gpu_nodes:
            claimed = self.hostvars[host].get("gpufleet_tenant")
            if claimed is None or host in self.tenant_of_host:
                continue
            if claimed in self.tenants:
                why = f" (tenant {claimed} uses group {self.tenants[claimed]['group']})"
            else:
                why = f" (and gpufleet_tenants has no tenant {claimed})"
            self.errors.append(f"host {host} has gpufleet_tenant={claimed} but is in no tenant group{why}")

    def node_capacity(self) -> tuple[dict[str, dict[str, int]], list[str]]:
        """2. What each GPU node exposes (the device plugin's mixed strategy) and the fleet's GPU resources."""
        capacity: dict[str, dict[str, int]] = {}
        resources = {WHOLE_GPU_RESOURCE}
        for host in self.gpu_nodes:
            try:
                exposed = host_gpus(host, self.hostvars[host]).resources()
            except MigError as exc:
                self.errors.append(exc.message)
                continue
            capacity[host] = exposed
            resources.update(exposed)
        return capacity, [WHOLE_GPU_RESOURCE, *sorted(resources - {WHOLE_GPU_RESOURCE})]

    def check_overrides(self, quota_split, overrides, resources: list[str]) -> None:
        """3. Explicit quota values must name a tenant, one of its namespaces and a resource of the fleet."""
        if quota_split not in ("even", "full"):
            self.errors.append(f"tenants_quota_split must be even or full, not {quota_split}")
        for tenant, by_ns in overrides.items():
            if tenant not in self.tenants:
                self.errors.append(f"tenants_quota_overrides: {tenant} is not a tenant of gpufleet_tenants")
                continue
            namespaces = self.tenants[tenant]["namespaces"]
            for ns, values in by_ns.items():
                if ns not in namespaces:
                    self.errors.append(
                        f"tenants_quota_overrides.{tenant}: {ns} is not one of the tenant namespaces "
                        f"({', '.join(namespaces)})"
                    )
                    continue
                for resource, count in values.items():
                    where = f"tenants_quota_overrides.{tenant}.{ns}"
                    if resource not in resources:
                        self.errors.append(
                            f"{where}: {resource} is not exposed by any GPU node of the inventory "
                            f"({', '.join(resources)})"
                        )
                    elif not _whole_number(count):
                        self.errors.append(f"{where}.{resource} must be a whole number >= 0, not {count}")

    def quotas(self, capacity, resources, quota_split, overrides, allow_overcommit) -> None:
        """4. Pool capacity (sum over the pool's nodes, time-sliced resources x replicas) and each namespace's quota."""
        for tenant, pool in self.tenants.items():
            devices = {r: sum(capacity.get(h, {}).get(r, 0) for h in pool["hosts"]) for r in resources}
            for resource in pool["sharing"]:
                if not devices.get(resource):
                    self.errors.append(
                        f"tenant {tenant}: sharing names {resource}, which no node of its pool has "
                        f"({', '.join(r for r in resources if devices[r]) or 'no GPU resource'})"
                    )
            pool_capacity = {r: devices[r] * pool["sharing"].get(r, 1) for r in resources}
            by_ns = overrides.get(tenant, {})
            quotas: dict[str, dict[str, int]] = {ns: {} for ns in pool["namespaces"]}
            for resource in resources:
                explicit = {
                    ns: _as_int(by_ns[ns][resource]) for ns in pool["namespaces"] if resource in by_ns.get(ns, {})
                }
                left = pool_capacity[resource] - sum(explicit.values())
                if left < 0 and not allow_overcommit:
                    self.errors.append(
                        f"tenant {tenant}: the explicit {resource} quotas add up to {sum(explicit.values())}, more "
                        f"than the pool capacity of {pool_capacity[resource]}; lower them or set "
                        "tenants_quota_allow_overcommit"
                    )
                left = max(left, 0)
                others = [ns for ns in pool["namespaces"] if ns not in explicit]
                for ns in pool["namespaces"]:
                    if ns in explicit:
                        share = explicit[ns]
                    elif quota_split == "full":
                        share = left
                    else:  # even: the remainder one by one to the first namespaces
                        share = left // len(others) + (1 if others.index(ns) < left % len(others) else 0)
                    quotas[ns][resource] = share
            pool.update({"capacity": pool_capacity, "quotas": quotas})


def tenants_model(
    hostvars,
    groups,
    tenants,
    priority_classes=(),
    pod_security_level="restricted",
    allow_privileged=False,
    quota_split="even",
    quota_overrides=None,
    allow_overcommit=False,
    namespace_quota=None,
    access_group_prefix="gpufleet:",
    reserved_namespaces=(),
) -> dict:
    model = _Model(
        hostvars,
        groups,
        priority_classes,
        pod_security_level,
        allow_privileged,
        access_group_prefix,
        reserved_namespaces,
    )
    model.pools(tenants)
    model.unpooled_claims()
    capacity, resources = model.node_capacity()
    overrides = quota_overrides or {}
    model.check_overrides(quota_split, overrides, resources)
    model.quotas(capacity, resources, quota_split, overrides, allow_overcommit)
    model.namespace_quotas(namespace_quota or {})
    dra_classes = model.dra()
    return {
        "errors": model.errors,
        "resources": resources,
        "dra_classes_fleet": dra_classes,
        "tenants": model.tenants,
        # Kubernetes node name -> tenant (null: a GPU node in no pool).
        "nodes": {model._node_name(host): model.tenant_of_host.get(host) for host in model.gpu_nodes},
    }


def dra_device_class(tenant: str, resource: str) -> str:
    """The DeviceClass through which a pool's tenant claims one kind of GPU device in DRA mode: one class per pool
    and device kind, so that admission and quotas (<class>.deviceclass.resource.k8s.io/devices) can tell pools
    apart. nvidia.com/gpu -> gpufleet-<tenant>-gpu; nvidia.com/mig-1g.10gb -> gpufleet-<tenant>-mig-1g.10gb
    ('+' is no DNS character: 1g.10gb+me -> mig-1g.10gb-me)."""
    name = resource_name(resource)
    if name is None:
        raise ValueError(f"{resource!r} is not {RESOURCE_FORMS}")
    return f"gpufleet-{tenant}-{name.removeprefix('nvidia.com/').replace('+', '-')}"


class FilterModule:
    def filters(self):
        return {
            "tenants_model": tenants_model,
            "tenants_sharing": tenants_sharing,
            "dra_device_class": dra_device_class,
        }
