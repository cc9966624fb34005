"""hsextract collect of a host whose shard several client processes extracted (``--process j/P``):
the host output holds one client's files per sub-shard, which together are the host's shard. A
final collect takes it as that shard, and refuses it while a process's sub-shard is missing."""

from __future__ import annotations

import pytest
from hsextract.output.manifest import iter_entries
from hsextract.shard import Shard
from support.fleet import HostPlan, make_fleet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
LINES = 20


def test_a_host_of_two_processes_covers_its_shard_in_a_final_collect(collect, tmp_path):
    # host a: shard 0/2 by two processes, sub-shards 0/4 and 2/4; host b: shard 1/2 by one
    plans = [
        HostPlan("a", Shard(0, 2), rejected={4}, failed={6}, processes=2),
        HostPlan("b", Shard(1, 2), quarantined={3}),
    ]
    fleet = make_fleet(tmp_path / "fleet", "speculators", plans, LINES)
    into = tmp_path / "collected"
    code, err = collect("--into", str(into), "--final", *fleet.args())
    assert code == 0, err
    assert sorted(e.dataset_index for e in iter_entries(into)) == sorted(fleet.samples)
    assert "host a: 10 dataset lines = 9 accepted + 1 rejected" in err
    assert "fleet: 19 accepted = 17 in the set + 1 failed + 1 quarantined" in err


def test_a_host_missing_one_processs_sub_shard_is_refused_by_a_final_collect(collect, tmp_path):
    plans = [HostPlan("a", Shard(0, 2), processes=2, ran=(0,)), HostPlan("b", Shard(1, 2))]  # process 1 (2/4) never ran
    fleet = make_fleet(tmp_path / "fleet", "speculators", plans, LINES)
    code, err = collect("--into", str(tmp_path / "collected"), "--final", *fleet.args())
    assert code == 3, err
    assert "FAIL dataset indices 2 (and each 4 later) are in no host's shard" in err
