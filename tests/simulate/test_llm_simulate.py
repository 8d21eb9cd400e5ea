"""The LLM plan kind in the simulator (shardplan.simulate._llm)."""

import pytest

from shardplan.cost import llm_costs
from shardplan.ir import ExecutionSettings, ParallelConfig, Plan
from shardplan.simulate import simulate
from shardplan.strategy.llm import layout_plan
from shardplan.topology import build
from tests.cost.llm_graph import gpt_graph


@pytest.fixture(scope="module")
def g():
    return gpt_graph(layers=8)


@pytest.fixture(scope="module")
def topo():
    return build("dgx1")


def run(g, topo, par, **kw):
    kw.setdefault("microbatches", 8)
    kw.setdefault("microbatch_size", 2 * par.data_parallel)
    st = ExecutionSettings(**kw)
    plan = layout_plan(g, topo, par, st)
    return simulate(plan, g, topo), llm_costs(g, topo, par, plan.settings)


def test_one_rank_runs_its_microbatches_back_to_back(g, topo):
    res, c = run(g, topo, ParallelConfig(tp=2))
    m = 8
    assert res.pipeline_seconds == pytest.approx(m * (c.forward[0] + c.backward[0]))
    assert res.iteration_seconds == pytest.approx(res.pipeline_seconds +
                                                  c.optimizer_seconds[0])
    assert res.bubble_fraction == pytest.approx(0.0, abs=1e-12)
    assert len(res.devices) == 2
    assert res.peak_memory_bytes[0] == pytest.approx(c.memory["total"][0])


def test_pipeline_bubble_and_interleaving(g, topo):
    one, c = run(g, topo, ParallelConfig(pp=4))
    assert one.iteration_seconds >= one.ideal_seconds
    # 1F1B on 4 ranks, 8 micro-batches: (M + p - 1) passes of a stage, each at most the
    # slowest stage's plus a message each way (1F1B's steady state waits for both)
    slowest = max(c.forward + c.backward)
    assert one.pipeline_seconds >= (8 + 3) * min(c.forward + c.backward)
    assert one.pipeline_seconds <= (8 + 3) * (slowest + 2 * c.send_seconds.max()) + 1e-12
    fast = topo.replace(bandwidth=topo.bandwidth * 1e9, latency=topo.latency * 0)
    free = run(g, fast, ParallelConfig(pp=4))[0]
    assert free.pipeline_seconds <= (8 + 3) * slowest + 1e-12
    # messages for free, interleaving shrinks the bubble (Narayanan et al. 2021, 2.2)
    inter, _ = run(g, fast, ParallelConfig(pp=4, vp=2))
    assert inter.bubble_fraction < free.bubble_fraction
    # the virtual stages share their rank's devices
    assert len(inter.devices) == 4


def test_overlapped_gradient_reduction_is_never_slower(g, topo):
    end, _ = run(g, topo, ParallelConfig(pp=2, dp=4), gradient_sync="end")
    bucketed, _ = run(g, topo, ParallelConfig(pp=2, dp=4), gradient_sync="bucketed")
    assert bucketed.iteration_seconds <= end.iteration_seconds
    assert end.pipeline_seconds == pytest.approx(bucketed.pipeline_seconds)
    assert max(end.allreduce_seconds) > 0


def test_plan_file_round_trip_simulates_the_same(g, topo):
    par = ParallelConfig(tp=2, pp=2, dp=2, vp=2)
    st = ExecutionSettings(microbatches=4, microbatch_size=4)
    plan = layout_plan(g, topo, par, st)
    assert plan.settings.schedule == "interleaved-1f1b"
    back = Plan.from_dict(plan.to_dict())
    assert simulate(back, g, topo).iteration_seconds == \
        pytest.approx(simulate(plan, g, topo).iteration_seconds)
