"""The LLM plan kind's layout: rank order, stage layers, JSON and the plan's checks."""

import pytest

from shardplan.errors import InvalidFileError, ShardplanError
from shardplan.ir import Objective, ParallelConfig, Plan, Stage


def test_rank_order_is_megatrons_tp_fastest_pp_slowest():
    p = ParallelConfig(tp=2, cp=1, dp_shard=2, dp=3, pp=2)
    assert p.world_size == 24
    assert p.rank(tp=1) == 1
    assert p.rank(shard=1) == 2
    assert p.rank(dp=1) == 4
    assert p.rank(pp=1) == 12
    for r in range(p.world_size):
        assert p.rank(**p.coordinates(r)) == r
    with pytest.raises(ShardplanError):
        p.coordinates(24)


def test_layers_per_stage_even_uneven_and_checked():
    assert ParallelConfig(pp=4).layers_per_stage(10) == (3, 3, 2, 2)
    assert ParallelConfig(pp=2, vp=2).layers_per_stage(8) == (2, 2, 2, 2)
    p = ParallelConfig(pp=2, stage_layers=(3, 5))
    assert p.layers_per_stage(8) == (3, 5)
    with pytest.raises(ShardplanError, match="add up"):
        p.layers_per_stage(9)
    with pytest.raises(ShardplanError, match="cannot fill"):
        ParallelConfig(pp=4).layers_per_stage(3)
    with pytest.raises(ShardplanError, match="entries"):
        ParallelConfig(pp=2, stage_layers=(1, 2, 3))
    with pytest.raises(ShardplanError, match=">= 1"):
        ParallelConfig(tp=0)


def test_json_round_trip_and_unknown_keys():
    p = ParallelConfig(tp=8, pp=12, dp=8, vp=2, stage_layers=tuple([4] * 24))
    assert ParallelConfig.from_dict(p.to_dict()) == p
    assert "stage_layers" not in ParallelConfig(tp=2).to_dict()
    with pytest.raises(InvalidFileError, match="unknown keys: xp"):
        ParallelConfig.from_dict({"tp": 2, "xp": 2})
    with pytest.raises(InvalidFileError, match="etp x ep = 2 x 2 to divide"):
        ParallelConfig.from_dict({"tp": 2, "ep": 2})
    # a dense plan's file has no expert keys; an expert plan's round-trips
    assert "ep" not in p.to_dict() and "etp" not in p.to_dict()
    e = ParallelConfig(tp=2, pp=8, vp=4, dp=64, ep=64, etp=1)
    assert e.to_dict()["ep"] == 64 and ParallelConfig.from_dict(e.to_dict()) == e


def test_expert_grid_folds_into_each_pipeline_rank():
    """Megatron-Core's parallel folding: etp fastest, then ep, then the expert replica, all
    inside one pipeline rank's block; every expert coordinate taken exactly once per rank."""
    p = ParallelConfig(tp=2, pp=2, dp=8, ep=4, etp=1)
    assert (p.expert_tp, p.expert_dp) == (1, 4)
    assert ParallelConfig(tp=2, dp=8, ep=4).expert_dp == 2  # etp defaults to tp
    seen = {(c["etp"], c["ep"], c["edp"], c["pp"])
            for c in map(p.expert_coordinates, range(p.world_size))}
    assert len(seen) == p.world_size
    assert p.expert_coordinates(17) == {"etp": 0, "ep": 1, "edp": 0, "pp": 1}
    assert p.expert_coordinates(5) == {"etp": 0, "ep": 1, "edp": 1, "pp": 0}
    assert p.label() == "TP 2 x PP 2 x DP 8 x EP 4 x ETP 1"
    with pytest.raises(ShardplanError, match="integer >= 1"):
        ParallelConfig(ep=0)
    with pytest.raises(InvalidFileError):
        ParallelConfig.from_dict({"tp": -1})


def test_label():
    assert ParallelConfig(tp=8, pp=12, dp=8).label() == "TP 8 x PP 12 x DP 8"
    assert ParallelConfig(dp_shard=8, vp=2).label() == "FSDP 8 x VP 2"
    assert ParallelConfig().label() == "one device"


def _plan(parallel, stages):
    return Plan(graph="g", topology="t", algorithm="llm", stages=stages,
                objective=Objective("iteration_seconds", 1.0), parallel=parallel)


def test_plan_virtual_stages_share_their_ranks_devices_and_round_trip():
    par = ParallelConfig(tp=2, pp=2, vp=2)
    stages = (Stage((0,), (0, 1)), Stage((1,), (2, 3)), Stage((2,), (0, 1)),
              Stage((3,), (2, 3)))
    plan = _plan(par, stages)
    back = Plan.from_dict(plan.to_dict())
    assert back.parallel == par
    assert "TP 2 x PP 2 x VP 2" in repr(plan)
    with pytest.raises(InvalidFileError, match="devices of stage 0"):
        _plan(par, stages[:2] + (Stage((2,), (2, 3)), stages[3]))
    # without the layout, two stages on one device stay an error
    with pytest.raises(InvalidFileError, match="used by stages"):
        _plan(None, stages)
