"""A corpus of KubeSchedulerConfigurations, valid and invalid, for the Python port of kube-scheduler's validation
(plugins/module_utils/kube_scheduler_config.py): its unit tests (tests/roles/test_kube_scheduler_config.py)
check the port's messages, and tests/integration/k8s/test_scheduler_config_corpus.py proves that the real
kube-scheduler (and gpufleet-scheduler, for GPUScore) accepts and refuses every configuration of it alike."""

from __future__ import annotations

import copy
from typing import Any, NamedTuple


def gpu_extender(**changes: Any) -> dict:
    extender = {
        "urlPrefix": "http://10.96.0.50:8000",
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "weight": 3,
        "httpTimeout": "500ms",
        "nodeCacheCapable": True,
        "ignorable": True,
        "managedResources": [
            {"name": "nvidia.com/gpu", "ignoredByScheduler": False},
            {"name": "nvidia.com/mig-1g.10gb", "ignoredByScheduler": False},
        ],
    }
    extender.update(changes)
    return extender


def config(**changes: Any) -> dict:
    """A valid configuration like the role renders in static_pod mode, with top-level fields replaced."""
    base = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": "/etc/kubernetes/scheduler.conf"},
        "leaderElection": {"leaderElect": True, "resourceName": "kube-scheduler", "resourceNamespace": "kube-system"},
        "profiles": [{"schedulerName": "default-scheduler"}],
        "extenders": [gpu_extender()],
    }
    base.update(changes)
    return base


GPUSCORE_PROFILE = {
    "schedulerName": "gpufleet-scheduler",
    "plugins": {
        "preFilter": {"enabled": [{"name": "GPUScore"}]},
        "filter": {"enabled": [{"name": "GPUScore"}]},
        "preScore": {"enabled": [{"name": "GPUScore"}]},
        "score": {"enabled": [{"name": "GPUScore", "weight": 3}], "disabled": [{"name": "ImageLocality"}]},
        "reserve": {"enabled": [{"name": "GPUScore"}]},
    },
    "pluginConfig": [{"name": "GPUScore", "args": {"prometheusURL": "http://p:9090", "weightGPUUtil": 0.7}}],
}


def with_profile(profile: dict) -> dict:
    return config(profiles=[profile], extenders=[])


def without_weight() -> dict:
    extender = gpu_extender()
    del extender["weight"]
    return config(extenders=[extender])


# Each rule's bad value and the start of the port's one message for it.
RULES = [
    (
        {"apiVersion": "kubescheduler.config.k8s.io/v1beta3"},
        'apiVersion: Invalid value: "kubescheduler.config.k8s.io/v1beta3"',
    ),
    ({"parallelism": 0}, "parallelism: Invalid value: 0: should be an integer value greater than zero"),
    ({"percentageOfNodesToScore": 101}, "percentageOfNodesToScore: Invalid value: 101: not in valid range [0-100]"),
    ({"podInitialBackoffSeconds": 0}, "podInitialBackoffSeconds: Invalid value: 0: must be greater than 0"),
    (
        {"podInitialBackoffSeconds": 5, "podMaxBackoffSeconds": 4},
        "podMaxBackoffSeconds: Invalid value: 4: must be greater than or equal to PodInitialBackoffSeconds",
    ),
    ({"clientConnection": {"burst": -1}}, "clientConnection.burst: Invalid value: -1: must be non-negative"),
    (
        {"leaderElection": {"leaderElect": True, "leaseDuration": "10s", "renewDeadline": "10s"}},
        'leaderElection.leaseDuration: Invalid value: "10s": LeaseDuration must be greater than RenewDeadline',
    ),
    (
        {"leaderElection": {"leaderElect": True, "retryPeriod": "-1s"}},
        'leaderElection.retryPeriod: Invalid value: "-1s": must be greater than zero',
    ),
    (
        {"leaderElection": {"leaderElect": True, "resourceLock": "endpoints"}},
        'leaderElection.resourceLock: Invalid value: "endpoints": resourceLock value must be "leases"',
    ),
    (
        {"profiles": [{"schedulerName": "gpufleet"}, {"schedulerName": "gpufleet"}]},
        "profiles[1].schedulerName: Duplicate value: profiles[0].schedulerName",
    ),
    ({"profiles": [{"schedulerName": "a"}, {}]}, "profiles[1].schedulerName: Required value"),
    (
        {"profiles": [{"schedulerName": "a", "percentageOfNodesToScore": -1}]},
        "profiles[0].percentageOfNodesToScore: Invalid value: -1: not in valid range [0-100]",
    ),
    (
        {"profiles": [{"schedulerName": "a", "pluginConfig": [{"name": "NodeAffinity"}, {"name": "NodeAffinity"}]}]},
        'profiles[0].pluginConfig[1]: Duplicate value: "NodeAffinity"',
    ),
    (
        {
            "profiles": [
                {"schedulerName": "a"},
                {"schedulerName": "b", "plugins": {"queueSort": {"enabled": [{"name": "Custom"}]}}},
            ]
        },
        "profiles[1].plugins.queueSort: Invalid value",
    ),
]

BAD_RESOURCE_NAMES = [
    ("gpu", "is an invalid extended resource name"),  # no domain: a native resource name
    ("cpu", "is an invalid extended resource name"),
    ("kubernetes.io/gpu", "is an invalid extended resource name"),  # reserved for native resources
    ("requests.nvidia.com/gpu", "is an invalid extended resource name"),  # quota prefix
    ("nvidia.com/mig 1g.10gb", "name part must consist of alphanumeric characters"),
    ("nvidia.com/mig-1g.10gb-", "name part must consist of alphanumeric characters"),
    ("NVIDIA.com/gpu", "prefix part a lowercase RFC 1123 subdomain"),
    ("nvidia.com/", "name part must be non-empty"),
    ("/gpu", "prefix part must be non-empty"),
    ("nvidia.com/" + "x" * 64, "name part must be no more than 63 characters"),
    ("a/b/c", "a qualified name must consist of"),
]
GOOD_RESOURCE_NAMES = ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb", "example.com/Foo_bar"]
GOOD_DURATIONS = ["500ms", "1s", "1m30s", "0", "1.5s", "300us"]
BAD_DURATIONS = ["500", "1 s", "5sec", "", "ms"]
UNKNOWN_FIELDS = [
    ("extender", "urlprefix"),
    ("extender", "managedResource"),
    ("top", "extender"),
    ("top", "healthzBindAddress"),
]
WRONG_TYPES = [("weight", "3"), ("weight", True), ("ignorable", "true"), ("managedResources", {})]


class Case(NamedTuple):
    name: str
    config: Any
    valid: bool
    plugins: tuple[str, ...] = ()  # out-of-tree plugins the scheduler binary registers (GPUScore: gpufleet-scheduler)


def corpus() -> list[Case]:
    """Every configuration above, with whether kube-scheduler accepts it. The port's own additions (GPUScore enabled
    at only some of its extension points) are not kube-scheduler's rules and are left out."""
    cases = [
        Case("the role's configuration", config(), True),
        Case("minimal", {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration"}, True),
        Case(
            "filter-only extender without weight", config(extenders=[gpu_extender(prioritizeVerb="", weight=0)]), True
        ),
        Case(
            "one binder",
            config(
                extenders=[gpu_extender(bindVerb="bind"), {"urlPrefix": "http://10.96.0.51", "filterVerb": "filter"}]
            ),
            True,
        ),
        Case(
            "two binders",
            config(extenders=[gpu_extender(bindVerb="bind"), {"urlPrefix": "http://10.96.0.51", "bindVerb": "bind"}]),
            False,
        ),
        Case("prioritize without weight", without_weight(), False),
        Case(
            "leader election off, odd settings",
            config(
                leaderElection={
                    "leaderElect": False,
                    "leaseDuration": "1s",
                    "renewDeadline": "10s",
                    "resourceLock": "endpoints",
                }
            ),
            True,
        ),
        Case("a lone unnamed profile", config(profiles=[{}]), True),
        Case(
            "leader election fields left zero or empty, defaulted",
            config(leaderElection={"leaderElect": True, "retryPeriod": "0s", "leaseDuration": "0", "resourceName": ""}),
            True,
        ),
        Case(
            "three violations",
            config(parallelism=0, extenders=[gpu_extender(weight=0, managedResources=[{"name": "gpu"}])]),
            False,
        ),
        Case(
            "a resource managed twice in one extender",
            config(extenders=[gpu_extender(managedResources=[{"name": "nvidia.com/gpu"}, {"name": "nvidia.com/gpu"}])]),
            False,
        ),
        Case(
            "a resource managed by two extenders",
            config(
                extenders=[
                    gpu_extender(),
                    {
                        "urlPrefix": "http://10.96.0.51",
                        "filterVerb": "filter",
                        "managedResources": [{"name": "nvidia.com/gpu"}],
                    },
                ]
            ),
            False,
        ),
        Case("GPUScore where the binary registers it", with_profile(GPUSCORE_PROFILE), True, ("GPUScore",)),
        Case("GPUScore in the stock kube-scheduler", with_profile(GPUSCORE_PROFILE), False),
        Case(
            "GPUScore through multiPoint",
            with_profile(
                {"schedulerName": "s", "plugins": {"multiPoint": {"enabled": [{"name": "GPUScore", "weight": 3}]}}}
            ),
            True,
            ("GPUScore",),
        ),
        Case(
            "an in-tree score plugin",
            with_profile(
                {"schedulerName": "s", "plugins": {"score": {"enabled": [{"name": "NodeResourcesFit", "weight": 2}]}}}
            ),
            True,
        ),
        Case(
            "a score plugin that does not exist",
            with_profile(
                {"schedulerName": "s", "plugins": {"score": {"enabled": [{"name": "NodeResourcesMostAllocated"}]}}}
            ),
            False,
        ),
    ]
    cases += [Case(f"weight {w}", config(extenders=[gpu_extender(weight=w)]), False) for w in (0, -1)]
    cases += [
        Case(f"rule {expected.split(':')[0]}", config(**copy.deepcopy(changes)), False) for changes, expected in RULES
    ]
    cases += [
        Case(f"resource {n!r}", config(extenders=[gpu_extender(managedResources=[{"name": n}])]), False)
        for n, _ in BAD_RESOURCE_NAMES
    ]
    cases += [
        Case(f"resource {n!r}", config(extenders=[gpu_extender(managedResources=[{"name": n}])]), True)
        for n in GOOD_RESOURCE_NAMES
    ]
    cases += [Case(f"httpTimeout {t!r}", config(extenders=[gpu_extender(httpTimeout=t)]), True) for t in GOOD_DURATIONS]
    cases += [Case(f"httpTimeout {t!r}", config(extenders=[gpu_extender(httpTimeout=t)]), False) for t in BAD_DURATIONS]
    for where, key in UNKNOWN_FIELDS:
        bad = config(extenders=[gpu_extender(**{key: "x"})]) if where == "extender" else config(**{key: "x"})
        cases.append(Case(f"unknown field {key}", bad, False))
    cases += [Case(f"{f} as {v!r}", config(extenders=[gpu_extender(**{f: v})]), False) for f, v in WRONG_TYPES]
    return cases
