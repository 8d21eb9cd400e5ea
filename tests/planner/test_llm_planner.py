"""The LLM plan kind's planner: a layout priced by the simulator, and the layout search."""

import math

import pytest

from shardplan.errors import ShardplanError
from shardplan.ir import ExecutionSettings, ParallelConfig
from shardplan.planner._llm import llm_plan, llm_search, node_size
from shardplan.simulate import simulate
from shardplan.strategy.llm import layout_plan
from shardplan.topology import build
from tests.cost.llm_graph import gpt_graph


@pytest.fixture(scope="module")
def g():
    return gpt_graph(layers=4, hidden=32, seq=16, vocab=64)


@pytest.fixture(scope="module")
def topo():
    return build("dgx1")


def test_llm_plan_objective_is_the_simulated_iteration(g, topo):
    st = ExecutionSettings(microbatches=4, microbatch_size=8)
    plan, res = llm_plan(g, topo, ParallelConfig(tp=2, pp=2, dp=2), st)
    assert plan.objective.value == res.iteration_seconds
    assert plan.objective.value == simulate(plan, g, topo).iteration_seconds
    assert math.isinf(layout_plan(g, topo, ParallelConfig(), st).objective.value)


def test_layout_refusals(g, topo):
    st = ExecutionSettings(microbatches=4, microbatch_size=8)
    with pytest.raises(ShardplanError, match="needs 16 devices"):
        layout_plan(g, topo, ParallelConfig(tp=2, dp=8), st)
    with pytest.raises(ShardplanError, match="multiple of"):
        layout_plan(g, topo, ParallelConfig(pp=2, vp=2), ExecutionSettings(microbatches=5))
    heads = g.replace(meta={"transformer": {"heads": 3}})
    with pytest.raises(ShardplanError, match="does not divide the model's 3 heads"):
        layout_plan(heads, topo, ParallelConfig(tp=2), st)


def test_search_finds_the_best_of_every_candidate(g, topo):
    found = llm_search(g, topo, ExecutionSettings(), global_batch=16, time_limit=120)
    assert not found.timed_out and found.best is not None
    best = found.best
    # no candidate that fits simulates faster than the winner
    assert all(c.iteration_seconds >= best.iteration_seconds for c in found.ranked if c.fits)
    # the winner re-simulates to its recorded time
    plan = layout_plan(g, topo, best.parallel, best.settings)
    assert simulate(plan, g, topo).iteration_seconds == pytest.approx(best.iteration_seconds)
    assert best.parallel.world_size == 8
    assert node_size(topo) == 8


def test_search_honours_its_time_limit(g, topo):
    found = llm_search(g, topo, ExecutionSettings(), global_batch=16, time_limit=0.0)
    assert found.timed_out and found.considered == 0
