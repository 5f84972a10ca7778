"""Variables a release removed (roles/gpufleet/vars/main.yml): one still set in the inventory fails any role of the
collection before it changes anything, with one line per variable saying what replaced it."""

from __future__ import annotations

from gpufleet_testsupport.collection import render_roles, try_render

RECORDED = (
    "removed with the recorded form (Prometheus recording rules): the extender and GPUScore query the raw dcgm "
    "series, or receive them pushed (gpufleet_metrics_source, push from gpufleet_metrics_push_from_nodes GPU nodes); "
    "delete it from the inventory"
)


def test_a_removed_variable_fails_the_role_with_what_replaced_it_and_nothing_is_rendered(tmp_path):
    result, manifests = try_render(
        ["gpufleet.mig.dcgm_exporter"], tmp_path, extra_vars={"gpufleet_metrics_recording_rules": True}
    )
    output = " ".join(result.stdout.split())
    assert result.returncode != 0
    assert f"gpufleet_metrics_recording_rules: {RECORDED}" in output, result.stdout[-3000:]
    assert "Traceback" not in result.stdout + result.stderr
    assert not manifests.exists()


def test_every_removed_variable_set_is_named_once_whichever_role_runs(tmp_path):
    extra = {"gpu_extender_prometheus_query": "raw", "dcgm_exporter_prometheus_rule": "never"}
    result, manifests = try_render(["gpufleet.mig.gpu_extender"], tmp_path, extra_vars=extra)
    output = " ".join(result.stdout.split())
    assert result.returncode != 0
    assert f"dcgm_exporter_prometheus_rule: {RECORDED}; gpu_extender_prometheus_query: {RECORDED}" in output, (
        result.stdout[-3000:]
    )
    assert not manifests.exists()


def test_an_inventory_without_them_renders(tmp_path):
    # The check reads the names alone: the roles' own variables of similar names do not trip it.
    manifests = render_roles(
        ["gpufleet.mig.dcgm_exporter"], tmp_path, extra_vars={"dcgm_exporter_scrape_interval": "30s"}
    )
    assert (manifests / "dcgm_exporter").is_dir()
