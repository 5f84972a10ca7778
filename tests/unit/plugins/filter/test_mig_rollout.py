"""gpufleet.mig.mig_rollout: the rollout of playbooks/mig.yml goes pool by pool, `serial` applying to each pool."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.gpufleet.mig.plugins.filter.mig_rollout import batch_size, mig_rollout

TENANTS = {
    "llm": {"group": "tenant_llm"},
    "imagegen": {"group": "tenant_imagegen"},
    "finnlp": {"group": "tenant_finnlp"},
}


def hong_kong():
    groups = {
        "tenant_llm": [f"llm-{i:02d}" for i in range(1, 11)],
        "tenant_imagegen": [f"img-{i}" for i in range(1, 7)],
        "tenant_finnlp": [f"nlp-{i}" for i in range(1, 5)],
    }
    hosts = ["spare", *groups["tenant_finnlp"], *groups["tenant_imagegen"], *groups["tenant_llm"]]
    return hosts, groups


def test_25_percent_of_each_pool_at_a_time_pool_by_pool_in_the_tenants_order():
    hosts, groups = hong_kong()
    rollout = mig_rollout(hosts, groups, TENANTS, "25%")
    assert rollout["hosts"] == [*groups["tenant_llm"], *groups["tenant_imagegen"], *groups["tenant_finnlp"], "spare"]
    # llm: 2 of 10 at a time; imagegen: 1 of 6; finnlp: 1 of 4; the spare on its own
    assert rollout["batches"] == [2] * 5 + [1] * 6 + [1] * 4 + [1]
    assert list(rollout["pools"]) == ["llm", "imagegen", "finnlp", "(no pool)"]


def test_no_batch_spans_two_pools():
    hosts, groups = hong_kong()
    rollout = mig_rollout(hosts, groups, TENANTS, 3)
    assert rollout["batches"] == [3, 3, 3, 1, 3, 3, 3, 1, 1]
    start = 0
    for size in rollout["batches"]:
        batch = rollout["hosts"][start : start + size]
        assert len({h.split("-")[0] for h in batch}) == 1, batch
        start += size
    assert start == len(hosts)


def test_a_new_pool_is_an_inventory_change_and_limit_is_honoured():
    _hosts, groups = hong_kong()
    groups["tenant_video"] = ["spare"]
    tenants = {**TENANTS, "video": {"group": "tenant_video"}}
    rollout = mig_rollout(["llm-01", "llm-02", "spare"], groups, tenants, "100%")
    assert rollout == {
        "hosts": ["llm-01", "llm-02", "spare"],
        "batches": [2, 1],
        "pools": {"llm": ["llm-01", "llm-02"], "video": ["spare"]},
    }


@pytest.mark.parametrize(
    ("serial", "pool", "size"), [("25%", 10, 2), ("25%", 3, 1), ("100%", 6, 6), (1, 4, 1), ("10", 4, 4)]
)
def test_batch_sizes_follow_ansibles_serial_rule(serial, pool, size):
    assert batch_size(serial, pool) == size


@pytest.mark.parametrize("serial", ["quarter", 0, "-1"])
def test_bad_serial_is_refused(serial):
    with pytest.raises(AnsibleFilterError, match="mig_rollout: serial must be"):
        batch_size(serial, 4)
