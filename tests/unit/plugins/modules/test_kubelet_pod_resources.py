"""The kubelet_pod_resources module against a real gRPC server on a unix socket: results, check mode, one-line
failures, its documentation against its argument_spec, and one run through the `ansible` CLI (which must ship the
generated messages with the module)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.testing import patch_module_args
from ansible_collections.gpufleet.mig.plugins.modules import kubelet_pod_resources
from gpufleet_testsupport.collection import REPO, collections_path
from gpufleet_testsupport.kubelet import FakeKubelet, NodeDevices

NODE = NodeDevices(
    pods={("imagegen", "sdxl-1"): {"worker": {"nvidia.com/mig-3g.40gb": ["MIG-a"]}}},
    allocatable={"nvidia.com/mig-3g.40gb": ["MIG-a", "MIG-b"], "nvidia.com/mig-1g.10gb": []},
)


@pytest.fixture
def run(capsys):
    def run_module(args: dict, check_mode: bool = False) -> dict:
        with patch_module_args(dict(args, _ansible_check_mode=check_mode)), pytest.raises(SystemExit):
            kubelet_pod_resources.main()
        return json.loads(capsys.readouterr().out)

    return run_module


@pytest.mark.parametrize("check_mode", [False, True], ids=["apply", "check"])
def test_reports_allocated_and_free(tmp_path, run, check_mode):
    sock = tmp_path / "kubelet.sock"
    with FakeKubelet(sock, NODE):
        result = run({"socket": str(sock)}, check_mode=check_mode)
    assert result["changed"] is False and "failed" not in result
    assert result["allocated"] == [
        {
            "resource_name": "nvidia.com/mig-3g.40gb",
            "device_id": "MIG-a",
            "namespace": "imagegen",
            "pod": "sdxl-1",
            "container": "worker",
        }
    ]
    assert result["free"] == {"nvidia.com/mig-1g.10gb": [], "nvidia.com/mig-3g.40gb": ["MIG-b"]}
    assert result["devices"]["MIG-b"]["mig_profile"] == "3g.40gb" and not result["devices"]["MIG-b"]["allocated"]
    assert result["pods"][0]["containers"][0]["devices"] == [
        {"resource_name": "nvidia.com/mig-3g.40gb", "device_ids": ["MIG-a"]}
    ]


def test_failure_is_one_line(tmp_path, run):
    result = run({"socket": str(tmp_path / "absent.sock")})
    assert result["failed"] is True and "\n" not in result["msg"]
    assert result["msg"].startswith("the kubelet pod-resources socket") and "does not exist" in result["msg"]


def test_documentation_matches_argument_spec():
    doc = yaml.safe_load(kubelet_pod_resources.DOCUMENTATION)
    spec = kubelet_pod_resources.argument_spec()
    assert set(doc["options"]) == set(spec)
    for name, option in doc["options"].items():
        assert option["type"] == spec[name]["type"] and option.get("default") == spec[name].get("default"), name
    assert doc["attributes"]["check_mode"]["support"] == "full"
    assert yaml.safe_load(kubelet_pod_resources.EXAMPLES)
    returned = yaml.safe_load(kubelet_pod_resources.RETURN)
    assert {"socket", "allocated", "allocatable", "free", "devices", "pods"} <= set(returned)
    assert all("description" in v and "type" in v for v in returned.values())


def test_ansible_cli_ships_the_generated_messages(tmp_path):
    sock = tmp_path / "kubelet.sock"
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=collections_path(),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_STDOUT_CALLBACK="json",
        ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
    )
    ansible = Path(sys.executable).with_name("ansible")
    cmd = [str(ansible), "localhost", "-i", "localhost,", "-c", "local", "-m", "gpufleet.mig.kubelet_pod_resources"]
    cmd += ["-a", json.dumps({"socket": str(sock)}), "-e", f"ansible_python_interpreter={sys.executable}"]
    with FakeKubelet(sock, NODE):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    host = json.loads(done.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    assert host["free"] == {"nvidia.com/mig-1g.10gb": [], "nvidia.com/mig-3g.40gb": ["MIG-b"]}
