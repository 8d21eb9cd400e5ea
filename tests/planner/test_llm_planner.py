"""The LLM plan kind's planner: a layout priced by the simulator, and the layout search."""

import dataclasses
import math

import pytest

from shardplan.cost import llm_costs
from shardplan.errors import ShardplanError
from shardplan.ir import ExecutionSettings, ParallelConfig
from shardplan.planner._llm import candidates, llm_plan, llm_search, node_size
from shardplan.simulate import simulate
from shardplan.simulate._llm import lower_bound_seconds
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


def test_branch_and_bound_finds_what_simulating_every_candidate_finds(g, topo):
    found = llm_search(g, topo, ExecutionSettings(), global_batch=16, time_limit=120)
    assert not found.timed_out and found.best is not None
    best = found.best
    # exhaustively: every candidate that fits, simulated; the bound never exceeds the time
    times = []
    for par, st in candidates(g, topo, ExecutionSettings(), global_batch=16):
        costs = llm_costs(g, topo, par, st)
        if costs.memory["total"].max() > topo.device_memory.min():
            continue
        plan = layout_plan(g, topo, par, st)
        t = simulate(plan, g, topo).iteration_seconds
        assert lower_bound_seconds(costs, par) <= t * (1 + 1e-12)
        times.append(t)
    assert best.iteration_seconds == pytest.approx(min(times))
    # the bound pruned: fewer simulations than candidates that fit
    assert sum(c.fits for c in found.ranked) < len(times)
    # the winner re-simulates to its recorded time
    plan = layout_plan(g, topo, best.parallel, best.settings)
    assert simulate(plan, g, topo).iteration_seconds == pytest.approx(best.iteration_seconds)
    assert best.parallel.world_size == 8
    assert node_size(topo) == 8


def test_search_honours_its_time_limit(g, topo):
    found = llm_search(g, topo, ExecutionSettings(), global_batch=16, time_limit=0.0)
    assert found.timed_out and found.considered == 0


def test_a_baseline_is_searched_and_compared(g, topo):
    from shardplan.planner._llm import baseline_comparison, moved_knobs

    own_par = ParallelConfig(tp=2, pp=2, dp=2)
    own = ExecutionSettings(microbatches=2, microbatch_size=16, recompute="full")
    baseline = layout_plan(g, topo, own_par, own)
    found = llm_search(g, topo, ExecutionSettings(), global_batch=32, time_limit=120,
                       include=[(own_par, baseline.settings)])
    cmp_ = baseline_comparison(baseline, g, topo, found)
    assert cmp_["baseline_seconds"] == pytest.approx(simulate(baseline, g, topo)
                                                     .iteration_seconds)
    # the winner is never slower than the user's own configuration, which was a candidate
    assert cmp_["winner_seconds"] <= cmp_["baseline_seconds"]
    assert cmp_["speedup"] >= 1.0
    assert moved_knobs((own_par, own), (own_par, own)) == []
    assert "TP 2 -> 4" in moved_knobs((own_par, own), (ParallelConfig(tp=4, pp=2), own))
    with pytest.raises(ShardplanError, match="LLM plan"):
        baseline_comparison(dataclasses.replace(baseline, parallel=None), g, topo, found)


def test_default_families_follow_the_graph_and_the_cluster(g, topo):
    from shardplan.ir import Graph
    from shardplan.planner import FAMILIES
    from shardplan.planner._search import LLM_ONLY_DEVICES, default_families

    # a transformer on 8 GPUs: every family, its own first (a time limit leaves the others)
    assert default_families(g, topo) == ("llm", *(f for f in FAMILIES if f != "llm"))
    big = build("dgx-a100", nodes=LLM_ONLY_DEVICES // 8 + 1)
    assert default_families(g, big) == ("llm",)
    at_limit = build("dgx-a100", nodes=LLM_ONLY_DEVICES // 8)  # 64 devices: still all
    assert at_limit.num_devices == LLM_ONLY_DEVICES
    assert default_families(g, at_limit) == default_families(g, topo)
    plain = Graph.from_arrays(name="mlp", fwd_flops=[1.0, 2.0], src=[0], dst=[1])
    assert "llm" not in default_families(plain, big)
    assert set(default_families(plain, topo)) == set(FAMILIES) - {"llm"}


def test_llm_search_beyond_the_operator_graph_limit():
    """8,192 GPUs (twice what the operator-graph families price): the LLM family alone
    searches them from the cluster's compact pair model and returns a plan that uses every
    GPU and fits; the other families are refused on that cluster."""
    from shardplan.planner import MAX_PLAN_DEVICES, search
    from shardplan.topology import build_spec

    graph = gpt_graph(hidden=256, layers=16, heads=8, seq=128, vocab=512, batch=1)
    topology = build_spec("dgx-a100,nodes=1024")
    assert topology.num_devices == 8192 > MAX_PLAN_DEVICES
    res = search(graph, topology, global_batch=8192, time_limit=4, workers=1)
    best = res.ranked[0]
    assert best.family == "llm" and best.fits
    assert ParallelConfig.from_dict(res.winner.parallel.to_dict()).world_size == 8192
    with pytest.raises(ShardplanError, match="at most 32768 by the LLM family alone"):
        search(graph, topology, families=["llm", "data-parallel"], global_batch=8192,
               time_limit=4, workers=1)


def test_the_search_orders_layouts_by_their_data_parallel_traffic_too():
    """FSDP gathers a stage's parameters twice per micro-batch and reduces them once;
    ZeRO-1 and DDP move them twice per iteration; experts count over EP x ETP; none
    without replicas. The order prices the light ones first (never a price)."""
    from shardplan.ir import ExecutionSettings, ParallelConfig
    from shardplan.planner._llm import _dp_traffic

    st = ExecutionSettings(precision="bf16", microbatches=8)
    fsdp = ParallelConfig(tp=2, dp_shard=8)
    zero = ParallelConfig(tp=2, dp=8)
    per = (100.0 - 60.0) / 2
    assert _dp_traffic(100.0, 60.0, fsdp, st) == pytest.approx((per + 60.0 / 2) * 2 * 17)
    z1 = ExecutionSettings(precision="bf16", microbatches=8, gradient_sync="zero1")
    moe = ParallelConfig(tp=2, dp=8, ep=4, etp=1)
    assert _dp_traffic(100.0, 60.0, moe, z1) == pytest.approx((per + 60.0 / 4) * 2 * 2)
    assert _dp_traffic(100.0, 60.0, zero, z1) > _dp_traffic(100.0, 60.0, moe, z1)
    assert _dp_traffic(100.0, 0.0, ParallelConfig(tp=8), st) == 0.0


def test_no_layout_of_the_devices_is_said_as_such():
    """7 devices, 4 blocks, a global batch of 2: no TP x PP x DP uses them all; the LLM
    family says that, not that nothing fits in memory."""
    from shardplan.ir import ExecutionSettings
    from shardplan.planner._llm import family_rows
    from shardplan.topology import build
    from tests.cost.llm_graph import gpt_graph

    with pytest.raises(ShardplanError, match="no layout uses exactly the 7 GPUs"):
        family_rows(gpt_graph(layers=4), build("flat", num_devices=7),
                    ExecutionSettings(), global_batch=2, time_limit=5.0)


def test_fixed_micro_batch_count_is_kept(g, topo):
    """``plan --microbatches M``: every LLM layout runs M micro-batches (each replica's
    micro-batch whatever that takes, even one the free search never tries); a count that
    divides no replica's share offers nothing, and the family says why."""
    from dataclasses import replace

    from shardplan.planner._llm import WIDE, family_rows

    st = ExecutionSettings(precision="bf16")
    space = replace(WIDE, microbatches=3)
    offered = list(candidates(g, topo, st, global_batch=72, space=space))
    assert offered and {s.microbatches for _, s in offered} == {3}
    # 72 sequences over 2 replicas in 3 micro-batches: 12 each, a size never tried freely
    assert 12 in {s.microbatch_size // p.data_parallel for p, s in offered}
    free = {s.microbatches for _, s in candidates(g, topo, st, global_batch=72, space=WIDE)}
    assert len(free) > 1
    with pytest.raises(ShardplanError, match="--microbatches 5 dividing"):
        family_rows(g, topo, st, global_batch=72, time_limit=5.0, microbatches=5)
