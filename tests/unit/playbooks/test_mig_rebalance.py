"""playbooks/mig-rebalance.yml on the simulated lab's finance-NLP pool (4 nodes of 8 simulated H100s, 7 x 1g.10gb
each) with a gRPC kubelet on a unix socket that has handed some instances to pods: check mode prints the plan and
writes nothing; apply serves the demand and keeps every allocated MIG device; a rerun changes nothing."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from ansible_collections.gpufleet.mig.plugins.module_utils import gpu_info
from ansible_collections.gpufleet.mig.plugins.module_utils.nvml_sim import SimulatedNvml, new_state
from ansible_collections.gpufleet.mig.plugins.module_utils.runner import apply
from gpufleet_testsupport.collection import REPO, inventory_args, run_playbook
from gpufleet_testsupport.kubelet import FakeKubelet, NodeDevices
from gpufleet_testsupport.ports import free_port
from gpufleet_testsupport.prometheus import busy_count, mig_series, prometheus
from gpufleet_testsupport.waits import wait_for

POOL = ["hk-gpu-17", "hk-gpu-18", "hk-gpu-19", "hk-gpu-20"]
FINNLP = [{"devices": "all", "mig_enabled": True, "mig_devices": {"1g.10gb": 7}}]


def uuids(sim) -> list[str]:
    return [
        ci["mig_device_uuid"]
        for g in gpu_info.collect(sim)
        for i in g["gpu_instances"]
        for ci in i["compute_instances"]
    ]


def finnlp_pool(tmp_path) -> SimpleNamespace:
    """The finance-NLP pool laid out as 7 x 1g.10gb per GPU; pods hold the first three 1g.10gb instances of every GPU
    of hk-gpu-17 (its other nodes: nothing held); the demand asks for 6 x 3g.40gb."""
    lab = tmp_path / "lab"
    (lab / "nvml").mkdir(parents=True)
    sims = {}
    for host in POOL:
        path = lab / "nvml" / f"{host}.json"
        path.write_text(json.dumps(new_state(gpus=8, product="NVIDIA H100 80GB HBM3")))
        sims[host] = SimulatedNvml(str(path))
        apply(sims[host], FINNLP)
    held = [
        u
        for g in gpu_info.collect(sims["hk-gpu-17"])
        for i in g["gpu_instances"][:3]
        for u in [i["compute_instances"][0]["mig_device_uuid"]]
    ]
    kubelet = NodeDevices(
        pods={("finnlp", f"bert-{n}"): {"main": {"nvidia.com/mig-1g.10gb": [u]}} for n, u in enumerate(held)},
        allocatable={"nvidia.com/mig-1g.10gb": sorted(uuids(sims["hk-gpu-17"]))},
    )
    extra = {
        "gpufleet_lab_dir": str(lab),
        "mig_rebalance_pool": "tenant_finnlp",
        "mig_rebalance_demand": {"3g.40gb": 6},
        "mig_rebalance_allowed_profiles": ["1g.10gb", "3g.40gb"],
        "mig_rebalance_read_pod_resources": True,
        "mig_rebalance_pod_resources_socket": str(tmp_path / "kubelet.sock"),
    }
    before = {h: set(uuids(sims[h])) for h in POOL}
    return SimpleNamespace(lab=lab, held=held, kubelet=kubelet, extra=extra, before=before)


def sims_of(pool) -> dict[str, SimulatedNvml]:
    return {h: SimulatedNvml(str(pool.lab / "nvml" / f"{h}.json")) for h in POOL}


def destroyed(pool) -> int:
    """How many of the pool's MIG devices from before are gone."""
    now = sims_of(pool)
    return sum(len(pool.before[h] - set(uuids(now[h]))) for h in POOL)


def test_rebalance_check_apply_rerun(tmp_path):
    pool = finnlp_pool(tmp_path)
    lab, held, kubelet, extra = pool.lab, pool.held, pool.kubelet, pool.extra
    states = {h: (lab / "nvml" / f"{h}.json").read_text() for h in POOL}
    with FakeKubelet(tmp_path / "kubelet.sock", kubelet):
        check = run_playbook("playbooks/mig-rebalance.yml", "inventories/hongkong+lab", extra, tmp_path, ("--check",))
        assert check.returncode == 0, check.stdout[-4000:]
        assert "pool: serves 18 of 18 demanded compute slices" in check.stdout
        assert {h: (lab / "nvml" / f"{h}.json").read_text() for h in POOL} == states  # check mode wrote nothing

        applied = run_playbook("playbooks/mig-rebalance.yml", "inventories/hongkong+lab", extra, tmp_path)
        assert applied.returncode == 0, applied.stdout[-4000:]
        after = {h: SimulatedNvml(str(lab / "nvml" / f"{h}.json")) for h in POOL}
        assert set(held) <= set(uuids(after["hk-gpu-17"]))  # every allocated MIG device survived
        instances = [i for h in POOL for g in gpu_info.collect(after[h]) for i in g["gpu_instances"]]
        assert sum(1 for i in instances if i["profile"] == "3g.40gb") >= 6
        boot = [
            json.loads((lab / "hosts" / h / "etc/gpufleet/mig-layout.json").read_text())
            for h in POOL
            if (lab / "hosts" / h / "etc/gpufleet/mig-layout.json").exists()
        ]
        assert boot and all(b["force"] is False for b in boot)

        rerun = run_playbook("playbooks/mig-rebalance.yml", "inventories/hongkong+lab", extra, tmp_path)
    assert rerun.returncode == 0, rerun.stdout[-4000:]
    assert "destroy 0, create 0" in rerun.stdout
    recap = re.findall(r"(hk-gpu-\d+)\s*:\s*ok=\d+\s+changed=(\d+)", rerun.stdout)
    assert recap and all(changed == "0" for _host, changed in recap), recap


def test_pool_must_be_named(tmp_path):
    result = run_playbook(
        "playbooks/mig-rebalance.yml", "inventories/hongkong+lab", {"mig_rebalance_pool": "tenant_nope"}, tmp_path
    )
    assert result.returncode != 0
    assert "Name the pool with -e mig_rebalance_pool=<inventory group> (got tenant_nope" in " ".join(
        result.stdout.split()
    )


def test_check_mode_adds_recent_usage_from_prometheus(tmp_path):
    # hk-gpu-17 ran four 1g.10gb pods until a moment ago; now one runs: the last window's usage asks for 3 more
    # 1g.10gb, on top of 1 x 3g.40gb asked inline. The pool's free 1g.10gb serve them, the 3g.40gb takes a re-layout.
    lab = tmp_path / "lab"
    (lab / "nvml").mkdir(parents=True)
    for host in POOL:
        path = lab / "nvml" / f"{host}.json"
        path.write_text(json.dumps(new_state(gpus=8, product="NVIDIA H100 80GB HBM3")))
        apply(SimulatedNvml(str(path)), FINNLP)
    extra = {
        "gpufleet_lab_dir": str(lab),
        "mig_rebalance_pool": "tenant_finnlp",
        "mig_rebalance_demand": {"3g.40gb": 1},
        "mig_rebalance_allowed_profiles": ["1g.10gb", "3g.40gb"],
        "mig_rebalance_read_pod_resources": False,
        "mig_rebalance_usage_window": "60s",
        "mig_rebalance_usage_step": "1s",  # the default 1m would sample this young Prometheus once or twice
    }
    with prometheus(tmp_path) as (url, exporter):
        exporter.text = "".join(mig_series("hk-gpu-17", gi, "1g.10gb", 0.9) for gi in range(4))
        wait_for(lambda: busy_count(url, "hk-gpu-17", "1g.10gb") == 4, what="four busy 1g.10gb scraped")
        exporter.text = mig_series("hk-gpu-17", 0, "1g.10gb", 0.9) + "".join(
            mig_series("hk-gpu-17", gi, "1g.10gb", 0.0) for gi in range(1, 4)
        )
        wait_for(lambda: busy_count(url, "hk-gpu-17", "1g.10gb") == 1, what="one busy 1g.10gb scraped")
        check = run_playbook(
            "playbooks/mig-rebalance.yml",
            "inventories/hongkong+lab",
            dict(extra, mig_rebalance_prometheus_url=url),
            tmp_path,
            ("--check",),
        )
    assert check.returncode == 0, check.stdout[-4000:]
    # 3 x 1g.10gb (3 slices) from the usage + 1 x 3g.40gb (3 slices) inline.
    assert "pool: serves 6 of 6 demanded compute slices" in check.stdout
    down = run_playbook(
        "playbooks/mig-rebalance.yml",
        "inventories/hongkong+lab",
        dict(extra, mig_rebalance_prometheus_url=f"http://127.0.0.1:{free_port()}"),
        tmp_path,
        ("--check",),
    )
    assert down.returncode != 0 and "prometheus: cannot query http://127.0.0.1:" in down.stdout


def interrupt_between_nodes(pool, tmp_path) -> None:
    """The controller (ansible-playbook) killed with SIGKILL as soon as a first node's new layout is recorded."""
    vars_file = tmp_path / "interrupted-vars.json"
    vars_file.write_text(json.dumps(pool.extra))
    ansible_playbook = Path(sys.executable).with_name("ansible-playbook")
    command = [str(ansible_playbook), *inventory_args("inventories/hongkong+lab"), "playbooks/mig-rebalance.yml"]
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    controller = subprocess.Popen(
        [*command, "-e", f"@{vars_file}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    recorded = [pool.lab / "hosts" / h / "etc/gpufleet/mig-layout.json" for h in POOL]
    deadline = time.monotonic() + 120
    while not any(path.exists() for path in recorded) and controller.poll() is None:
        assert time.monotonic() < deadline, "no node's layout recorded in 120 s"
        time.sleep(0.05)
    assert controller.poll() is None, "the run ended before it could be interrupted"
    os.killpg(controller.pid, signal.SIGKILL)  # the controller and every module process it started
    controller.wait()


def interrupt_inside_a_node(pool, tmp_path) -> None:
    """The first node to change dies in the middle of its change: its module process is killed (SIGKILL) before
    its second GPU-instance creation, after its destroys and a first creation."""
    for host in POOL:
        SimulatedNvml(str(pool.lab / "nvml" / f"{host}.json")).add_fault(
            "nvmlDeviceCreateGpuInstanceWithPlacement", "UNKNOWN", skip=1, kill=True
        )
    result = run_playbook("playbooks/mig-rebalance.yml", "inventories/hongkong+lab", pool.extra, tmp_path)
    assert result.returncode != 0, "the injected kill never fired"
    fired = [h for h in POOL if not SimulatedNvml(str(pool.lab / "nvml" / f"{h}.json")).state.get("faults")]
    assert len(fired) == 1, f"one node should have died mid-change, not {fired}"
    for sim in sims_of(pool).values():  # the other nodes' armed faults are not part of the rerun
        sim.state["faults"] = []
        sim._save()


@pytest.mark.parametrize("interrupt", [interrupt_between_nodes, interrupt_inside_a_node], ids=["between", "inside"])
def test_an_interrupted_rebalance_is_completed_by_the_rerun(tmp_path, interrupt):
    # What an uninterrupted run destroys: the minimum the interrupted run and its rerun must not exceed together.
    reference = finnlp_pool(tmp_path / "reference")
    with FakeKubelet(Path(reference.extra["mig_rebalance_pod_resources_socket"]), reference.kubelet):
        (tmp_path / "reference" / "run").mkdir()
        done = run_playbook(
            "playbooks/mig-rebalance.yml", "inventories/hongkong+lab", reference.extra, tmp_path / "reference" / "run"
        )
    assert done.returncode == 0, done.stdout[-3000:]
    pool = finnlp_pool(tmp_path / "interrupted")
    with FakeKubelet(Path(pool.extra["mig_rebalance_pod_resources_socket"]), pool.kubelet):
        interrupt(pool, tmp_path)
        partway = destroyed(pool)
        rerun = run_playbook("playbooks/mig-rebalance.yml", "inventories/hongkong+lab", pool.extra, tmp_path)
        assert rerun.returncode == 0, rerun.stdout[-4000:]
        again = run_playbook("playbooks/mig-rebalance.yml", "inventories/hongkong+lab", pool.extra, tmp_path)
    assert again.returncode == 0 and "destroy 0, create 0" in again.stdout  # the rollout is complete
    assert partway > 0, "the interruption came before any change"
    now = sims_of(pool)
    assert set(pool.held) <= set(uuids(now["hk-gpu-17"]))  # no running pod's MIG device was touched
    instances = [i for h in POOL for g in gpu_info.collect(now[h]) for i in g["gpu_instances"]]
    assert sum(1 for i in instances if i["profile"] == "3g.40gb") >= 6
    assert destroyed(pool) == destroyed(reference)  # no more instances destroyed than without the interruption
