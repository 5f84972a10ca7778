"""kube-scheduler's own configuration rules (ported in module_utils/kube_scheduler_config.py): each rule rejects a
config that breaks it, with kube-scheduler's message, and accepts its neighbour that does not; and the static pod
manifest patch. The configurations are tests/scheduler_config_corpus.py's, which the real kube-scheduler judges alike
(tests/integration/k8s/test_scheduler_config_corpus.py)."""

from __future__ import annotations

import copy

import pytest
import yaml
from ansible_collections.gpufleet.mig.plugins.module_utils.exceptions import MigError
from ansible_collections.gpufleet.mig.plugins.module_utils.kube_scheduler_config import (
    ManifestError,
    is_extended_resource_name,
    parse_go_duration,
    patch_static_pod_manifest,
    scheduler_config_errors,
    unpatch_static_pod_manifest,
)
from gpufleet_testsupport.collection import REPO
from scheduler_config_corpus import (
    BAD_DURATIONS,
    BAD_RESOURCE_NAMES,
    GOOD_DURATIONS,
    GOOD_RESOURCE_NAMES,
    GPUSCORE_PROFILE,
    RULES,
    UNKNOWN_FIELDS,
    WRONG_TYPES,
    config,
    gpu_extender,
    with_profile,
)

KUBEADM_MANIFEST = REPO / "extensions/molecule/kube_scheduler_static_pod/files/kube-scheduler.yaml"
CONFIG_DIR = "/etc/kubernetes/gpufleet"
CONFIG_FILE = CONFIG_DIR + "/scheduler-config.yaml"


def test_the_roles_configuration_is_valid():
    assert scheduler_config_errors(config()) == []


def test_a_minimal_configuration_is_valid_after_kube_scheduler_defaults():
    # No profiles, no leader election settings: kube-scheduler's v1 defaults fill them in.
    assert (
        scheduler_config_errors({"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration"})
        == []
    )


# --- validateExtenders -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("weight", [0, -1])
def test_prioritize_verb_needs_a_positive_weight(weight):
    assert scheduler_config_errors(config(extenders=[gpu_extender(weight=weight)])) == [
        f"extenders[0].weight: Invalid value: {weight}: must have a positive weight applied to it"
    ]


def test_a_missing_weight_is_zero_for_a_prioritize_extender():
    extender = gpu_extender()
    del extender["weight"]
    assert scheduler_config_errors(config(extenders=[extender])) == [
        "extenders[0].weight: Invalid value: 0: must have a positive weight applied to it"
    ]


def test_a_filter_only_extender_needs_no_weight():
    assert scheduler_config_errors(config(extenders=[gpu_extender(prioritizeVerb="", weight=0)])) == []


def test_at_most_one_extender_implements_bind():
    one_binder = [gpu_extender(bindVerb="bind"), {"urlPrefix": "http://10.96.0.51", "filterVerb": "filter"}]
    assert scheduler_config_errors(config(extenders=one_binder)) == []
    two_binders = [gpu_extender(bindVerb="bind"), {"urlPrefix": "http://10.96.0.51", "bindVerb": "bind"}]
    assert scheduler_config_errors(config(extenders=two_binders)) == [
        'extenders: Invalid value: "found 2 extenders implementing bind": only one extender can implement bind'
    ]


@pytest.mark.parametrize(("name", "message"), BAD_RESOURCE_NAMES)
def test_managed_resources_must_be_extended_resource_names(name, message):
    extender = gpu_extender(managedResources=[{"name": name}])
    errors = scheduler_config_errors(config(extenders=[extender]))
    assert errors, name
    assert all(
        error.startswith(f'extenders[0].managedResources[0].name: Invalid value: "{name}": ') for error in errors
    )
    assert any(message in error for error in errors), errors


@pytest.mark.parametrize("name", GOOD_RESOURCE_NAMES)
def test_real_gpu_resource_names_are_accepted(name):
    assert is_extended_resource_name(name)
    assert scheduler_config_errors(config(extenders=[gpu_extender(managedResources=[{"name": name}])])) == []


def test_a_resource_is_managed_once_within_an_extender():
    resources = [{"name": "nvidia.com/gpu"}, {"name": "nvidia.com/gpu"}]
    assert scheduler_config_errors(config(extenders=[gpu_extender(managedResources=resources)])) == [
        'extenders[0].managedResources[1].name: Invalid value: "nvidia.com/gpu": '
        "duplicate extender managed resource name"
    ]


def test_a_resource_is_managed_once_across_extenders():
    other = {"urlPrefix": "http://10.96.0.51", "filterVerb": "filter", "managedResources": [{"name": "nvidia.com/gpu"}]}
    assert scheduler_config_errors(config(extenders=[gpu_extender(), other])) == [
        'extenders[1].managedResources[0].name: Invalid value: "nvidia.com/gpu": '
        "duplicate extender managed resource name"
    ]


# --- strict decoding -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("timeout", GOOD_DURATIONS)
def test_http_timeout_accepts_go_durations(timeout):
    assert scheduler_config_errors(config(extenders=[gpu_extender(httpTimeout=timeout)])) == []


@pytest.mark.parametrize("timeout", BAD_DURATIONS)
def test_http_timeout_rejects_what_go_cannot_parse(timeout):
    errors = scheduler_config_errors(config(extenders=[gpu_extender(httpTimeout=timeout)]))
    assert errors == [f'extenders[0].httpTimeout: Invalid value: "{timeout}": time: invalid duration "{timeout}"']


def test_parse_go_duration():
    assert parse_go_duration("1m30s") == 90
    assert parse_go_duration("500ms") == pytest.approx(0.5)
    assert parse_go_duration("-2s") == -2
    with pytest.raises(ValueError):
        parse_go_duration("2 minutes")


@pytest.mark.parametrize(("where", "key"), UNKNOWN_FIELDS)
def test_unknown_fields_are_refused_like_kube_schedulers_strict_decoder(where, key):
    if where == "extender":
        errors = scheduler_config_errors(config(extenders=[gpu_extender(**{key: "x"})]))
        assert errors == [f'extenders[0].{key}: strict decoding error: unknown field "{key}"']
    else:
        errors = scheduler_config_errors(config(**{key: "x"}))
        assert errors == [f'{key}: strict decoding error: unknown field "{key}"']


@pytest.mark.parametrize(("field", "value"), WRONG_TYPES)
def test_wrong_types_are_refused(field, value):
    errors = scheduler_config_errors(config(extenders=[gpu_extender(**{field: value})]))
    assert len(errors) == 1
    assert errors[0].startswith(f"extenders[0].{field}: Invalid type")


# --- ValidateKubeSchedulerConfiguration ------------------------------------------------------------------------------


@pytest.mark.parametrize(("changes", "expected"), RULES)
def test_each_configuration_rule_rejects_a_bad_value(changes, expected):
    errors = scheduler_config_errors(config(**changes))
    assert len(errors) == 1, errors
    assert errors[0].startswith(expected), errors


def test_leader_election_settings_are_not_checked_when_it_is_off():
    off = {"leaderElect": False, "leaseDuration": "1s", "renewDeadline": "10s", "resourceLock": "endpoints"}
    assert scheduler_config_errors(config(leaderElection=off)) == []


def test_a_lone_unnamed_profile_is_the_default_scheduler():
    assert scheduler_config_errors(config(profiles=[{}])) == []


def test_every_violation_is_reported_not_only_the_first():
    bad = config(parallelism=0, extenders=[gpu_extender(weight=0, managedResources=[{"name": "gpu"}])])
    assert len(scheduler_config_errors(bad)) == 3


def test_not_a_mapping():
    assert scheduler_config_errors(["not", "a", "config"]) == [
        "the scheduler configuration must be a mapping, got list"
    ]


# --- the static pod manifest patch ----------------------------------------------------------------------------------


@pytest.fixture
def kubeadm_manifest() -> dict:
    return yaml.safe_load(KUBEADM_MANIFEST.read_text())


def scheduler_container(manifest: dict) -> dict:
    return next(c for c in manifest["spec"]["containers"] if c["name"] == "kube-scheduler")


def test_patch_adds_the_flag_the_mount_the_volume_and_the_hash(kubeadm_manifest):
    patched = patch_static_pod_manifest(kubeadm_manifest, CONFIG_FILE, CONFIG_DIR, "abc123")
    container = scheduler_container(patched)
    original = scheduler_container(kubeadm_manifest)
    assert container["command"] == [*original["command"], f"--config={CONFIG_FILE}"]
    assert container["volumeMounts"] == [
        *original["volumeMounts"],
        {"mountPath": CONFIG_DIR, "name": "gpufleet-scheduler-config", "readOnly": True},
    ]
    assert patched["spec"]["volumes"] == [
        *kubeadm_manifest["spec"]["volumes"],
        {"hostPath": {"path": CONFIG_DIR, "type": "DirectoryOrCreate"}, "name": "gpufleet-scheduler-config"},
    ]
    assert patched["metadata"]["annotations"] == {"gpufleet.io/scheduler-config-hash": "abc123"}
    # Everything else is kubeadm's.
    for key in ("image", "livenessProbe", "startupProbe", "readinessProbe", "resources", "ports"):
        assert container[key] == original[key]
    assert patched["spec"]["hostNetwork"] is True


def test_patch_does_not_modify_its_input(kubeadm_manifest):
    before = copy.deepcopy(kubeadm_manifest)
    patch_static_pod_manifest(kubeadm_manifest, CONFIG_FILE, CONFIG_DIR, "abc123")
    assert kubeadm_manifest == before


def test_patch_is_idempotent(kubeadm_manifest):
    once = patch_static_pod_manifest(kubeadm_manifest, CONFIG_FILE, CONFIG_DIR, "abc123")
    twice = patch_static_pod_manifest(once, CONFIG_FILE, CONFIG_DIR, "abc123")
    assert twice == once


def test_a_new_config_hash_changes_only_the_annotation(kubeadm_manifest):
    old = patch_static_pod_manifest(kubeadm_manifest, CONFIG_FILE, CONFIG_DIR, "abc123")
    new = patch_static_pod_manifest(old, CONFIG_FILE, CONFIG_DIR, "def456")
    assert new["metadata"]["annotations"]["gpufleet.io/scheduler-config-hash"] == "def456"
    new["metadata"]["annotations"]["gpufleet.io/scheduler-config-hash"] = "abc123"
    assert new == old


@pytest.mark.parametrize("old_flag", [["--config=/etc/kubernetes/old.yaml"], ["--config", "/etc/kubernetes/old.yaml"]])
def test_an_older_config_flag_is_replaced_not_duplicated(kubeadm_manifest, old_flag):
    scheduler_container(kubeadm_manifest)["command"] += old_flag
    patched = patch_static_pod_manifest(kubeadm_manifest, CONFIG_FILE, CONFIG_DIR, "abc123")
    command = scheduler_container(patched)["command"]
    assert [arg for arg in command if "config" in arg and "kubeconfig" not in arg] == [f"--config={CONFIG_FILE}"]
    assert "/etc/kubernetes/old.yaml" not in command


def test_existing_annotations_are_kept(kubeadm_manifest):
    kubeadm_manifest["metadata"]["annotations"] = {"kubeadm.kubernetes.io/etcd.advertise-client-urls": "x"}
    patched = patch_static_pod_manifest(kubeadm_manifest, CONFIG_FILE, CONFIG_DIR, "abc123")
    assert patched["metadata"]["annotations"]["kubeadm.kubernetes.io/etcd.advertise-client-urls"] == "x"


def test_flags_in_args_are_patched_there(kubeadm_manifest):
    container = scheduler_container(kubeadm_manifest)
    container["args"] = container["command"][1:]
    container["command"] = ["kube-scheduler"]
    patched = scheduler_container(patch_static_pod_manifest(kubeadm_manifest, CONFIG_FILE, CONFIG_DIR, "abc123"))
    assert patched["command"] == ["kube-scheduler"]
    assert patched["args"][-1] == f"--config={CONFIG_FILE}"


@pytest.mark.parametrize("annotations", [None, {"kubeadm.kubernetes.io/etcd.advertise-client-urls": "x"}])
@pytest.mark.parametrize("field", ["command", "args"])
def test_unpatch_gives_back_the_manifest_as_it_was(kubeadm_manifest, annotations, field):
    if annotations:
        kubeadm_manifest["metadata"]["annotations"] = annotations
    if field == "args":
        container = scheduler_container(kubeadm_manifest)
        container["args"] = container["command"][1:]
        container["command"] = ["kube-scheduler"]
    before = copy.deepcopy(kubeadm_manifest)
    patched = patch_static_pod_manifest(kubeadm_manifest, CONFIG_FILE, CONFIG_DIR, "abc123")
    patched = patch_static_pod_manifest(patched, CONFIG_FILE, CONFIG_DIR, "def456")  # a second rollout
    assert unpatch_static_pod_manifest(patched, CONFIG_FILE) == before
    assert unpatch_static_pod_manifest(before, CONFIG_FILE) == before  # never patched: unchanged
    assert kubeadm_manifest == before


def test_unpatch_keeps_a_config_flag_that_is_not_gpufleets(kubeadm_manifest):
    scheduler_container(kubeadm_manifest)["command"].append("--config=/etc/kubernetes/site.yaml")
    restored = unpatch_static_pod_manifest(kubeadm_manifest, CONFIG_FILE)
    assert "--config=/etc/kubernetes/site.yaml" in scheduler_container(restored)["command"]


def test_the_patched_manifest_is_a_valid_pod(kubeadm_manifest):
    import kubernetes_validate

    patched = patch_static_pod_manifest(kubeadm_manifest, CONFIG_FILE, CONFIG_DIR, "abc123")
    kubernetes_validate.validate(patched, "1.37.0", strict=True)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda m: m.update(kind="Deployment"), "must be a single Pod object"),
        (lambda m: m["spec"]["containers"][0].update(name="scheduler"), "no container named 'kube-scheduler'"),
        (
            lambda m: m["spec"]["containers"][0]["volumeMounts"].append({"name": "other", "mountPath": CONFIG_DIR}),
            "already mounted from volume 'other'",
        ),
    ],
)
def test_unexpected_manifests_are_refused_with_a_reason(kubeadm_manifest, mutate, message):
    mutate(kubeadm_manifest)
    with pytest.raises(ManifestError, match=message):
        patch_static_pod_manifest(kubeadm_manifest, CONFIG_FILE, CONFIG_DIR, "abc123")


def test_the_config_file_must_be_in_the_mounted_directory(kubeadm_manifest):
    # A MigError like every error of module_utils: the filter and the modules catch one root.
    with pytest.raises(MigError, match="must be inside the mounted directory") as refused:
        patch_static_pod_manifest(kubeadm_manifest, "/etc/kubernetes/scheduler-config.yaml", CONFIG_DIR, "abc123")
    assert isinstance(refused.value, ManifestError) and refused.value.message.startswith("the config file ")


# --- plugins the scheduler binary registers ---------------------------------------------------------------------------


def test_gpuscore_is_accepted_only_where_the_binary_registers_it():
    assert scheduler_config_errors(with_profile(GPUSCORE_PROFILE), ("GPUScore",)) == []
    errors = scheduler_config_errors(with_profile(GPUSCORE_PROFILE))
    assert len(errors) == 5  # one per extension point it is enabled at
    assert (
        'profiles[0].plugins.preFilter.enabled[0].name: Invalid value: "GPUScore": PreFilterPlugin "GPUScore"'
        in (errors[0])
    )


def test_in_tree_plugins_pass_and_unknown_ones_do_not():
    profile = {"schedulerName": "s", "plugins": {"score": {"enabled": [{"name": "NodeResourcesFit", "weight": 2}]}}}
    assert scheduler_config_errors(with_profile(profile)) == []
    profile["plugins"]["score"]["enabled"].append({"name": "NodeResourcesMostAllocated"})
    assert scheduler_config_errors(with_profile(profile)) == [
        'profiles[0].plugins.score.enabled[1].name: Invalid value: "NodeResourcesMostAllocated": '
        'ScorePlugin "NodeResourcesMostAllocated" does not exist'
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda p: p["plugins"].pop("reserve"),
            'profiles[0].plugins: Invalid value: "GPUScore": GPUScore must be enabled at preFilter, filter, preScore, '
            "score, reserve (or multiPoint); missing: reserve",
        ),
    ],
)
def test_gpuscore_enabled_in_part_is_refused(change, message):
    profile = copy.deepcopy(GPUSCORE_PROFILE)
    change(profile)
    assert scheduler_config_errors(with_profile(profile), ("GPUScore",)) == [message]


def test_gpuscore_through_multipoint_is_complete():
    profile = {"schedulerName": "s", "plugins": {"multiPoint": {"enabled": [{"name": "GPUScore", "weight": 3}]}}}
    assert scheduler_config_errors(with_profile(profile), ("GPUScore",)) == []
