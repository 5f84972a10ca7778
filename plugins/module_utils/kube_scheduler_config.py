# Copyright: gpufleet maintainers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""kube-scheduler configuration: kube-scheduler's own validation rules, ported, and the static-pod manifest patch.

Two concerns live here because both are about what kube-scheduler will accept when it (re)starts:

* `scheduler_config_errors(config, out_of_tree_plugins)` checks a `KubeSchedulerConfiguration`
  (kubescheduler.config.k8s.io/v1) the way kube-scheduler does before it starts: strict decoding (unknown fields,
  wrong types, Go durations) and the rules of k8s.io/kubernetes pkg/scheduler/apis/config/validation/validation.go
  (ValidateKubeSchedulerConfiguration and validateExtenders) plus component-base's leader-election/client-connection
  checks, applied after kube-scheduler's v1 defaults, and the framework's refusal of plugins the binary does not
  register. Messages follow Go's field.Error format so they can be matched against kube-scheduler's own output.
* `patch_static_pod_manifest(...)` adds `--config`, the config volume and mount and a config-hash annotation to
  kubeadm's kube-scheduler static pod manifest, idempotently.

Pure Python with no third-party imports: it runs inside Ansible filters on the controller.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Collection
from typing import Any

from .exceptions import MigError

API_VERSION = "kubescheduler.config.k8s.io/v1"
KIND = "KubeSchedulerConfiguration"

# kube-scheduler's v1 defaults (pkg/scheduler/apis/config/v1/defaults.go); validation runs after defaulting,
# so an absent field is never an error, while an explicit bad value is.
DEFAULT_PARALLELISM = 16
DEFAULT_POD_INITIAL_BACKOFF_SECONDS = 1
DEFAULT_POD_MAX_BACKOFF_SECONDS = 10
DEFAULT_LEADER_ELECTION = {
    "leaderElect": True,
    "leaseDuration": "15s",
    "renewDeadline": "10s",
    "retryPeriod": "2s",
    "resourceLock": "leases",
    "resourceName": "kube-scheduler",
    "resourceNamespace": "kube-system",
}

# Field name -> expected Python type(s) of each struct kube-scheduler decodes strictly (an unknown field is a
# "strict decoding error" at start-up). Nested structs are described by the dicts below.
_STR, _BOOL, _INT, _NUM = (str,), (bool,), (int,), (int, float)
_TLS_FIELDS = {
    "insecure": _BOOL,
    "serverName": _STR,
    "certFile": _STR,
    "keyFile": _STR,
    "caFile": _STR,
    "certData": _STR,
    "keyData": _STR,
    "caData": _STR,
}
_MANAGED_RESOURCE_FIELDS = {"name": _STR, "ignoredByScheduler": _BOOL}
_EXTENDER_FIELDS = {
    "urlPrefix": _STR,
    "filterVerb": _STR,
    "preemptVerb": _STR,
    "prioritizeVerb": _STR,
    "weight": _INT,
    "bindVerb": _STR,
    "enableHTTPS": _BOOL,
    "tlsConfig": _TLS_FIELDS,
    "httpTimeout": _STR,
    "nodeCacheCapable": _BOOL,
    "managedResources": [_MANAGED_RESOURCE_FIELDS],
    "ignorable": _BOOL,
}
_LEADER_ELECTION_FIELDS = {
    "leaderElect": _BOOL,
    "leaseDuration": _STR,
    "renewDeadline": _STR,
    "retryPeriod": _STR,
    "resourceLock": _STR,
    "resourceName": _STR,
    "resourceNamespace": _STR,
}
_CLIENT_CONNECTION_FIELDS = {
    "kubeconfig": _STR,
    "acceptContentTypes": _STR,
    "contentType": _STR,
    "qps": _NUM,
    "burst": _INT,
}
_PLUGIN_FIELDS = {"name": _STR, "weight": _INT}
_PLUGIN_SET_FIELDS = {"enabled": [_PLUGIN_FIELDS], "disabled": [_PLUGIN_FIELDS]}
_EXTENSION_POINTS = [
    "preEnqueue",
    "queueSort",
    "preFilter",
    "filter",
    "postFilter",
    "preScore",
    "score",
    "reserve",
    "permit",
    "preBind",
    "bind",
    "postBind",
    "multiPoint",
    "placementGenerate",
    "placementScore",
    "placementFeasible",
    "podGroupPostFilter",
]
_PROFILE_FIELDS = {
    "schedulerName": _STR,
    "percentageOfNodesToScore": _INT,
    "percentageOfPlacementsToScore": _INT,
    "plugins": dict.fromkeys(_EXTENSION_POINTS, _PLUGIN_SET_FIELDS),
    # Plugin args are free-form (runtime.RawExtension): only the entry's own keys are checked.
    "pluginConfig": [{"name": _STR, "args": (dict,)}],
}
_CONFIG_FIELDS = {
    "apiVersion": _STR,
    "kind": _STR,
    "parallelism": _INT,
    "leaderElection": _LEADER_ELECTION_FIELDS,
    "clientConnection": _CLIENT_CONNECTION_FIELDS,
    "enableProfiling": _BOOL,
    "enableContentionProfiling": _BOOL,
    "percentageOfNodesToScore": _INT,
    "percentageOfPlacementsToScore": _INT,
    "podInitialBackoffSeconds": _INT,
    "podMaxBackoffSeconds": _INT,
    "profiles": [_PROFILE_FIELDS],
    "extenders": [_EXTENDER_FIELDS],
    "delayCacheUntilActive": _BOOL,
}

# kube-scheduler v1.36's in-tree plugins (pkg/scheduler/framework/plugins/names). Enabling any other name stops
# kube-scheduler at start-up (`FilterPlugin "X" does not exist`) unless its binary registers that plugin, as
# gpufleet-scheduler registers GPUScore.
IN_TREE_PLUGINS = frozenset(
    {
        "PrioritySort",
        "DefaultBinder",
        "DefaultPreemption",
        "DynamicResources",
        "GangScheduling",
        "ImageLocality",
        "InterPodAffinity",
        "NodeAffinity",
        "NodeDeclaredFeatures",
        "NodeName",
        "NodePorts",
        "NodeResourcesBalancedAllocation",
        "NodeResourcesFit",
        "NodeUnschedulable",
        "NodeVolumeLimits",
        "PodTopologySpread",
        "SchedulingGates",
        "TaintToleration",
        "VolumeBinding",
        "VolumeRestrictions",
        "VolumeZone",
        "TopologyPlacementGenerator",
        "PodGroupPodsCount",
    }
)
# The framework's interface name per extension point, as its "does not exist" message prints it.
_PLUGIN_TYPES = {point: point[0].upper() + point[1:] + "Plugin" for point in _EXTENSION_POINTS}

# GPUScore (k8s/gpuscore): the extension points it must be enabled at to decide as the extender (PreFilter takes
# the cycle's view, Reserve counts in-flight pods). Its args are the extender's to check (gpufleet-extender
# check-config --plugin-args, which the kube_scheduler role runs), names included.
GPUSCORE = "GPUScore"
GPUSCORE_EXTENSION_POINTS = ("preFilter", "filter", "preScore", "score", "reserve")
# Go's time.ParseDuration syntax: one or more <number><unit>, or a bare "0".
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_DURATION_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}

# k8s.io/apimachinery/pkg/util/validation: IsQualifiedName and IsDNS1123Subdomain.
_QUALIFIED_NAME_MAX_LENGTH = 63
_QUALIFIED_NAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_QUALIFIED_NAME = re.compile("^" + _QUALIFIED_NAME_FMT + "$")
_DNS1123_SUBDOMAIN_MAX_LENGTH = 253
_DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile("^" + _DNS1123_LABEL_FMT + r"(\." + _DNS1123_LABEL_FMT + ")*$")
# ResourceDefaultNamespacePrefix and DefaultResourceRequestsPrefix in k8s.io/api/core/v1.
_NATIVE_RESOURCE_PREFIX = "kubernetes.io/"
_REQUESTS_PREFIX = "requests."


def _go_value(value: object) -> str:
    """A value the way Go's field errors print it (strings quoted, bools lower case)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace('"', '\\"') + '"'
    return str(value)


def _invalid(path: str, value: object, detail: str) -> str:
    return f"{path}: Invalid value: {_go_value(value)}: {detail}"


def _required(path: str) -> str:
    return f"{path}: Required value"


def _duplicate(path: str, value: object) -> str:
    return f"{path}: Duplicate value: {_go_value(value)}"


def parse_go_duration(text: object) -> float:
    """Seconds in a Go duration string ("500ms", "1m30s", "0"); ValueError when Go would not parse it."""
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not a duration string")
    body = text[1:] if text[:1] in "+-" else text
    if body == "0":
        return 0.0
    if not body or _DURATION_PART.sub("", body) != "":
        raise ValueError(f"time: invalid duration {_go_value(text)}")
    seconds = sum(float(number) * _DURATION_UNIT_SECONDS[unit] for number, unit in _DURATION_PART.findall(body))
    return -seconds if text.startswith("-") else seconds


def qualified_name_errors(name: str) -> list[str]:
    """k8s IsQualifiedName: an optional DNS-subdomain prefix and '/', then a name of at most 63 characters."""
    errors: list[str] = []
    parts = name.split("/")
    if len(parts) == 1:
        short_name = parts[0]
    elif len(parts) == 2:
        prefix, short_name = parts
        if not prefix:
            errors.append("prefix part must be non-empty")
        else:
            if len(prefix) > _DNS1123_SUBDOMAIN_MAX_LENGTH:
                errors.append(f"prefix part must be no more than {_DNS1123_SUBDOMAIN_MAX_LENGTH} characters")
            if not _DNS1123_SUBDOMAIN.match(prefix):
                errors.append(
                    "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
                    "'-' or '.', and must start and end with an alphanumeric character"
                )
    else:
        return [
            "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with "
            "an alphanumeric character with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not short_name:
        errors.append("name part must be non-empty")
    elif len(short_name) > _QUALIFIED_NAME_MAX_LENGTH:
        errors.append(f"name part must be no more than {_QUALIFIED_NAME_MAX_LENGTH} characters")
    if short_name and not _QUALIFIED_NAME.match(short_name):
        errors.append(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
            f"alphanumeric character (regex used for validation is '{_QUALIFIED_NAME_FMT}')"
        )
    return errors


def is_extended_resource_name(name: str) -> bool:
    """k8s v1helper.IsExtendedResourceName: domain-prefixed, not kubernetes.io/, not requests.*, quota-safe."""
    is_native = "/" not in name or _NATIVE_RESOURCE_PREFIX in name
    if is_native or name.startswith(_REQUESTS_PREFIX):
        return False
    # The name must still be a qualified name once quota turns it into "requests.<name>".
    return not qualified_name_errors(_REQUESTS_PREFIX + name)


def _decoding_errors(value: Any, schema: Any, path: str) -> list[str]:
    """Strict-decoding errors: unknown fields and wrong types, as kube-scheduler's config loader reports them."""
    if isinstance(schema, tuple):
        # bool is an int in Python; Go would refuse true for an integer field.
        if not isinstance(value, schema) or (isinstance(value, bool) and bool not in schema):
            return [f"{path}: Invalid type: expected {schema[0].__name__}, got {type(value).__name__}"]
        return []
    if isinstance(schema, list):
        if not isinstance(value, list):
            return [f"{path}: Invalid type: expected list, got {type(value).__name__}"]
        errors: list[str] = []
        for index, item in enumerate(value):
            errors.extend(_decoding_errors(item, schema[0], f"{path}[{index}]"))
        return errors
    if not isinstance(value, dict):
        return [f"{path}: Invalid type: expected object, got {type(value).__name__}"]
    errors = []
    for key, item in value.items():
        child = f"{path}.{key}" if path else str(key)
        if key not in schema:
            errors.append(f'{child}: strict decoding error: unknown field "{key}"')
        elif item is not None:
            errors.extend(_decoding_errors(item, schema[key], child))
    return errors


def _duration_errors(value: object, path: str) -> tuple[list[str], float | None]:
    try:
        return [], parse_go_duration(value)
    except ValueError as err:
        return [_invalid(path, value, str(err))], None


def _unset(value: object) -> bool:
    """Go's zero value of a string or a metav1.Duration, which kube-scheduler's v1 defaulting replaces."""
    if value is None or value == "":
        return True
    try:
        return isinstance(value, str) and parse_go_duration(value) == 0
    except ValueError:
        return False


def _leader_election_errors(leader_election: dict[str, Any] | None) -> list[str]:
    """component-base ValidateLeaderElectionConfiguration plus kube-scheduler's leases-only lock rule, after v1's
    defaulting: a zero duration or an empty string is a field left unset, which the defaults fill in."""
    settings = dict(DEFAULT_LEADER_ELECTION)
    for name, value in (leader_election or {}).items():
        settings[name] = value
        if name in DEFAULT_LEADER_ELECTION and name != "leaderElect" and _unset(value):
            settings[name] = DEFAULT_LEADER_ELECTION[name]
    if not settings["leaderElect"]:
        return []
    errors = []
    durations: dict[str, float | None] = {}
    for name in ("leaseDuration", "renewDeadline", "retryPeriod"):
        path = f"leaderElection.{name}"
        parse_errors, duration = _duration_errors(settings[name], path)
        durations[name] = duration
        errors.extend(parse_errors)
        if duration is not None and duration <= 0:
            errors.append(_invalid(path, settings[name], "must be greater than zero"))
    lease, renew = durations["leaseDuration"], durations["renewDeadline"]
    if None not in durations.values() and lease is not None and renew is not None and lease <= renew:
        errors.append(
            _invalid(
                "leaderElection.leaseDuration",
                settings["renewDeadline"],
                "LeaseDuration must be greater than RenewDeadline",
            )
        )
    for name in ("resourceLock", "resourceNamespace", "resourceName"):
        if not settings[name]:
            errors.append(_invalid(f"leaderElection.{name}", settings[name], f"{name} is required"))
    if settings["resourceLock"] != "leases":
        errors.append(
            _invalid("leaderElection.resourceLock", settings["resourceLock"], 'resourceLock value must be "leases"')
        )
    return errors


def _percentage_errors(value: Any, path: str) -> list[str]:
    if value is not None and not 0 <= value <= 100:
        return [_invalid(path, value, "not in valid range [0-100]")]
    return []


def _defaulted_profiles(profiles: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """kube-scheduler's v1 profile defaults: no profile means one; a lone unnamed profile is default-scheduler."""
    profiles = [dict(profile) for profile in profiles or [{}]]
    if len(profiles) == 1 and profiles[0].get("schedulerName") is None:
        profiles[0]["schedulerName"] = "default-scheduler"
    return profiles


def _profile_errors(profiles: list[dict[str, Any]]) -> list[str]:
    if not profiles:
        return [_required("profiles")]
    errors = []
    first_index_by_name: dict[Any, int] = {}  # schedulerName as given, None included
    for index, profile in enumerate(profiles):
        path = f"profiles[{index}]"
        name = profile.get("schedulerName")
        if not name:
            errors.append(_required(f"{path}.schedulerName"))
        errors.extend(_percentage_errors(profile.get("percentageOfNodesToScore"), f"{path}.percentageOfNodesToScore"))
        seen_plugin_config: set[Any] = set()
        for config_index, plugin_config in enumerate(profile.get("pluginConfig") or []):
            if plugin_config.get("name") in seen_plugin_config:
                errors.append(_duplicate(f"{path}.pluginConfig[{config_index}]", plugin_config.get("name")))
            seen_plugin_config.add(plugin_config.get("name"))
        if name in first_index_by_name:
            errors.append(f"{path}.schedulerName: Duplicate value: profiles[{first_index_by_name[name]}].schedulerName")
        first_index_by_name.setdefault(name, index)
    # validateCommonQueueSort: every profile must use the same queue sort plugin set.
    queue_sorts = [((p.get("plugins") or {}).get("queueSort") or {}) for p in profiles]
    if len(queue_sorts[0].get("enabled") or []) > 1:
        errors.append(
            _invalid(
                "profiles[0].plugins.queueSort.Enabled",
                len(queue_sorts[0]["enabled"]),
                "only one queue sort plugin can be enabled",
            )
        )
    for index, queue_sort in enumerate(queue_sorts[1:], start=1):
        if queue_sort != queue_sorts[0]:
            errors.append(
                _invalid(f"profiles[{index}].plugins.queueSort", queue_sort, "must be the same for all profiles")
            )
    return errors


def plugin_errors(profiles: list[dict[str, Any]], out_of_tree_plugins: Collection[str] = ()) -> list[str]:
    """Enabled plugins the scheduler binary does not register: kube-scheduler's framework refuses to start."""
    known = IN_TREE_PLUGINS | set(out_of_tree_plugins)
    errors = []
    for index, profile in enumerate(profiles):
        for point, plugin_set in (profile.get("plugins") or {}).items():
            for plugin_index, plugin in enumerate((plugin_set or {}).get("enabled") or []):
                name = plugin.get("name", "")
                if name not in known:
                    path = f"profiles[{index}].plugins.{point}.enabled[{plugin_index}].name"
                    errors.append(_invalid(path, name, f'{_PLUGIN_TYPES[point]} "{name}" does not exist'))
    return errors


def gpuscore_errors(profiles: list[dict[str, Any]]) -> list[str]:
    """GPUScore enabled only in part, or given args it does not know (a typo would silently keep a default)."""
    errors = []
    for index, profile in enumerate(profiles):
        plugins = profile.get("plugins") or {}

        def enabled(point: str, plugins: dict[str, Any] = plugins) -> bool:
            return any(p.get("name") == GPUSCORE for p in (plugins.get(point) or {}).get("enabled") or [])

        if not any(enabled(point) for point in (*GPUSCORE_EXTENSION_POINTS, "multiPoint")):
            continue
        missing = [point for point in GPUSCORE_EXTENSION_POINTS if not (enabled(point) or enabled("multiPoint"))]
        if missing:
            errors.append(
                _invalid(
                    f"profiles[{index}].plugins",
                    GPUSCORE,
                    f"GPUScore must be enabled at {', '.join(GPUSCORE_EXTENSION_POINTS)} (or multiPoint); "
                    f"missing: {', '.join(missing)}",
                )
            )
    return errors


def extender_errors(extenders: list[dict[str, Any]] | None) -> list[str]:
    """validateExtenders, rule for rule (field paths as kube-scheduler prints them)."""
    errors = []
    binders = 0
    managed_resource_names: set[str] = set()
    for index, extender in enumerate(extenders or []):
        path = f"extenders[{index}]"
        weight = extender.get("weight", 0)
        if extender.get("prioritizeVerb") and weight <= 0:
            errors.append(_invalid(f"{path}.weight", weight, "must have a positive weight applied to it"))
        if extender.get("bindVerb"):
            binders += 1
        if extender.get("httpTimeout") is not None:
            errors.extend(_duration_errors(extender["httpTimeout"], f"{path}.httpTimeout")[0])
        for resource_index, resource in enumerate(extender.get("managedResources") or []):
            resource_path = f"{path}.managedResources[{resource_index}].name"
            name = resource.get("name", "")
            name_errors = [_invalid(resource_path, name, message) for message in qualified_name_errors(name)]
            if not name_errors and not is_extended_resource_name(name):
                name_errors.append(_invalid(resource_path, name, "is an invalid extended resource name"))
            errors.extend(name_errors)
            # Names must be unique across all extenders, not only within one.
            if name in managed_resource_names:
                errors.append(_invalid(resource_path, name, "duplicate extender managed resource name"))
            managed_resource_names.add(name)
    if binders > 1:
        errors.append(
            _invalid(
                "extenders", f"found {binders} extenders implementing bind", "only one extender can implement bind"
            )
        )
    return errors


def scheduler_config_errors(config: object, out_of_tree_plugins: Collection[str] = ()) -> list[str]:
    """Every reason kube-scheduler would refuse to start with `config` (a dict); an empty list when it is valid.

    `out_of_tree_plugins` names the plugins the scheduler binary registers besides the in-tree ones (GPUScore for
    gpufleet-scheduler); the stock kube-scheduler registers none.
    """
    if not isinstance(config, dict):
        return [f"the scheduler configuration must be a mapping, got {type(config).__name__}"]
    errors = []
    if config.get("apiVersion") != API_VERSION:
        errors.append(_invalid("apiVersion", config.get("apiVersion"), f"must be {API_VERSION}"))
    if config.get("kind") != KIND:
        errors.append(_invalid("kind", config.get("kind"), f"must be {KIND}"))
    decoding = _decoding_errors(config, _CONFIG_FIELDS, "")
    if decoding:
        # kube-scheduler stops at decoding; the semantic rules below assume well-typed fields.
        return errors + decoding

    client_connection = config.get("clientConnection") or {}
    if client_connection.get("burst", 0) < 0:
        errors.append(_invalid("clientConnection.burst", client_connection["burst"], "must be non-negative"))
    errors.extend(_leader_election_errors(config.get("leaderElection")))
    parallelism = config.get("parallelism", DEFAULT_PARALLELISM)
    if parallelism <= 0:
        errors.append(_invalid("parallelism", parallelism, "should be an integer value greater than zero"))
    profiles = _defaulted_profiles(config.get("profiles"))
    errors.extend(_profile_errors(profiles))
    errors.extend(_percentage_errors(config.get("percentageOfNodesToScore"), "percentageOfNodesToScore"))
    initial_backoff = config.get("podInitialBackoffSeconds", DEFAULT_POD_INITIAL_BACKOFF_SECONDS)
    max_backoff = config.get("podMaxBackoffSeconds", DEFAULT_POD_MAX_BACKOFF_SECONDS)
    if initial_backoff <= 0:
        errors.append(_invalid("podInitialBackoffSeconds", initial_backoff, "must be greater than 0"))
    if max_backoff < initial_backoff:
        errors.append(
            _invalid("podMaxBackoffSeconds", max_backoff, "must be greater than or equal to PodInitialBackoffSeconds")
        )
    errors.extend(extender_errors(config.get("extenders")))
    if errors:
        return errors
    # Only a configuration that passed validation gets as far as building the profiles' frameworks.
    errors = plugin_errors(profiles, out_of_tree_plugins)
    if GPUSCORE in out_of_tree_plugins:
        errors.extend(gpuscore_errors(profiles))
    return errors


# --- the kubeadm static pod manifest -------------------------------------------------------------------------------


class ManifestError(MigError):
    """The static pod manifest is not the kube-scheduler Pod this patch expects."""


def _scheduler_container(manifest: object, container_name: str) -> dict[str, Any]:
    if not isinstance(manifest, dict) or manifest.get("kind") != "Pod":
        raise ManifestError("the kube-scheduler static pod manifest must be a single Pod object")
    containers: list[dict[str, Any]] = (manifest.get("spec") or {}).get("containers") or []
    for container in containers:
        if container.get("name") == container_name:
            return container
    names = ", ".join(str(c.get("name")) for c in containers) or "none"
    raise ManifestError(f"no container named {container_name!r} in the static pod manifest (containers: {names})")


def _ensure_named(items: list[dict[str, Any]], entry: dict[str, Any]) -> list[dict[str, Any]]:
    """`items` with `entry` in place of the item of the same name (appended when there is none), one per name."""
    result: list[dict[str, Any]] = []
    placed = False
    for item in items:
        if item.get("name") != entry["name"]:
            result.append(item)
        elif not placed:
            result.append(entry)
            placed = True
    return result if placed else [*result, entry]


def _without_config_flag(arguments: list[Any]) -> list[Any]:
    """The arguments minus any `--config=X` or `--config X` flag."""
    kept: list[Any] = []
    skip_value = False
    for argument in arguments:
        if skip_value:
            skip_value = False
        elif argument == "--config":
            skip_value = True
        elif not str(argument).startswith("--config="):
            kept.append(argument)
    return kept


def _flags_field(container: dict[str, Any]) -> str:
    """kubeadm passes kube-scheduler's flags in `command`; other installers put them in `args`."""
    if any(str(a).startswith("--") for a in container.get("command") or []):
        return "command"
    return "args" if container.get("args") else "command"


def patch_static_pod_manifest(
    manifest: dict[str, Any],
    config_file: str,
    config_dir: str,
    config_hash: str,
    volume_name: str = "gpufleet-scheduler-config",
    hash_annotation: str = "gpufleet.io/scheduler-config-hash",
    container_name: str = "kube-scheduler",
) -> dict[str, Any]:
    """A copy of kubeadm's kube-scheduler Pod manifest that runs with `--config=<config_file>`.

    Idempotent: patching a patched manifest with the same arguments returns an equal object. Adds (or replaces)
    exactly one `--config` argument, one hostPath volume for `config_dir` and one read-only mount of it, and sets
    the `hash_annotation` on the Pod so that a change of the config file alone changes the manifest: kube-scheduler
    does not reload its configuration, and kubelet only recreates a static pod when its manifest changes.

    The directory is mounted rather than the file: a bind-mounted file keeps pointing to the old inode when the
    file is replaced, a mounted directory shows the new file.
    """
    if not str(config_file).startswith(str(config_dir).rstrip("/") + "/"):
        raise ManifestError(f"the config file {config_file} must be inside the mounted directory {config_dir}")
    patched = copy.deepcopy(manifest)
    container = _scheduler_container(patched, container_name)

    field = _flags_field(container)
    container[field] = [*_without_config_flag(container.get(field) or []), f"--config={config_file}"]

    mount = {"mountPath": config_dir, "name": volume_name, "readOnly": True}
    for existing in container.get("volumeMounts") or []:
        if existing.get("mountPath") == config_dir and existing.get("name") != volume_name:
            raise ManifestError(f"{config_dir} is already mounted from volume {existing.get('name')!r}")
    container["volumeMounts"] = _ensure_named(container.get("volumeMounts") or [], mount)
    volume = {"hostPath": {"path": config_dir, "type": "DirectoryOrCreate"}, "name": volume_name}
    patched["spec"]["volumes"] = _ensure_named(patched["spec"].get("volumes") or [], volume)

    metadata = patched.setdefault("metadata", {})
    metadata["annotations"] = dict(metadata.get("annotations") or {}, **{hash_annotation: config_hash})
    return patched


def unpatch_static_pod_manifest(
    manifest: dict[str, Any],
    config_file: str,
    volume_name: str = "gpufleet-scheduler-config",
    hash_annotation: str = "gpufleet.io/scheduler-config-hash",
    container_name: str = "kube-scheduler",
) -> dict[str, Any]:
    """`manifest` without what `patch_static_pod_manifest` added: the `--config=<config_file>` argument, the config
    directory's volume and mount, the hash annotation (and the annotations map when nothing else is left in it).

    A manifest that was never patched comes back equal. A `--config` naming another file is not gpufleet's and stays.
    """
    restored = copy.deepcopy(manifest)
    container = _scheduler_container(restored, container_name)
    field = _flags_field(container)
    container[field] = [a for a in container.get(field) or [] if a != f"--config={config_file}"]
    mounts = [m for m in container.get("volumeMounts") or [] if m.get("name") != volume_name]
    if mounts:
        container["volumeMounts"] = mounts
    else:
        container.pop("volumeMounts", None)
    volumes = [v for v in restored["spec"].get("volumes") or [] if v.get("name") != volume_name]
    if volumes:
        restored["spec"]["volumes"] = volumes
    else:
        restored["spec"].pop("volumes", None)
    metadata = restored.get("metadata") or {}
    annotations = {k: v for k, v in (metadata.get("annotations") or {}).items() if k != hash_annotation}
    if annotations:
        metadata["annotations"] = annotations
    else:
        metadata.pop("annotations", None)
    return restored
