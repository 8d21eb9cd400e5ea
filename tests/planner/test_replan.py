"""Re-planning an LLM plan for a changed cluster (issue 48, items 1 and 2): the best plan is
never slower than the cheapest change, gained devices keep the old prices, the minimal
changes and device counts as worked out by hand, the cluster changes and their errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shardplan.errors import InvalidFileError, ShardplanError
from shardplan.ir import ExecutionSettings, Objective, ParallelConfig
from shardplan.planner._cluster_change import change_by_flags, change_to, sub_topology
from shardplan.planner._llm import LLMCandidate, SearchSpace, llm_search, wide_space
from shardplan.planner._replan import (
    ReplanContext,
    minimal_changes,
    replan,
    reshard_back,
    usable_counts,
)
from shardplan.strategy.llm import layout_plan
from shardplan.topology import build_spec
from tests.cost.llm_graph import gpt_graph

G = gpt_graph(layers=4, hidden=32, seq=16, vocab=64)
ST = ExecutionSettings(precision="bf16")
TOPO = build_spec("dgx-h100,nodes=2")


@pytest.fixture(scope="module")
def first() -> tuple:
    """The first search on two nodes, its winner as a plan and its context."""
    found = llm_search(G, TOPO, ST, global_batch=8, time_limit=30, space=wide_space(ST))
    best = found.best
    assert best is not None
    plan = layout_plan(G, TOPO, best.parallel, best.settings,
                       objective=Objective("iteration_seconds", best.iteration_seconds))
    ctx = ReplanContext(global_batch=8, settings=ST,
                        candidates=tuple(c for c in found.ranked if c.fits)[:20],
                        topology=TOPO.name)
    return plan, ctx


def test_losing_a_node(first: tuple) -> None:
    plan, ctx = first
    res = replan(G, plan, change_by_flags(TOPO, remove=["node1"]), ctx, time_limit=20)
    assert res.best.parallel.world_size <= 8
    assert set(res.best.devices.tolist()) <= set(range(8))
    assert res.best.topology.num_devices == res.best.parallel.world_size
    assert res.changes, "a minimal change exists"
    # never slower than any minimal change (they are always simulated)
    for c in res.changes:
        assert res.best.iteration_seconds <= c.iteration_seconds * (1 + 1e-12)
    assert res.cheapest is not None
    assert res.cheapest.reshard.seconds == min(c.reshard.seconds for c in res.changes)
    d = res.to_dict()
    assert d["cluster"]["removed"] == [f"node1/gpu{i}" for i in range(8)]
    assert d["best"]["reshard"]["state_bytes"] > 0
    back = reshard_back(G, res, res.best)
    assert back.state_bytes > 0


def test_gaining_a_node_keeps_the_old_prices(first: tuple) -> None:
    plan, ctx = first
    res = replan(G, plan, change_by_flags(TOPO, add_nodes=1), ctx, time_limit=20)
    assert res.search.reused == len(ctx.candidates)
    assert res.reused["times_kept"] == len(ctx.candidates)
    same = [c for c in res.changes if c.kind == "same layout"]
    assert same and same[0].reshard.moved_bytes == 0
    assert res.best.iteration_seconds <= plan.objective.value * (1 + 1e-12)
    assert res.change.added[0] == "node2/gpu0"


def test_fresh_search_without_the_old_prices(first: tuple) -> None:
    plan, ctx = first
    res = replan(G, plan, change_by_flags(TOPO, remove_nodes=1), ctx, time_limit=20,
                 warm=False)
    assert res.search.reused == 0 and not res.reused["ordered_by_old_prices"]


def test_a_plan_that_is_not_an_llm_plan(first: tuple) -> None:
    from dataclasses import replace

    plan, ctx = first
    with pytest.raises(ShardplanError, match="LLM plan"):
        replan(G, replace(plan, parallel=None), change_by_flags(TOPO, remove_nodes=1), ctx)


def test_minimal_changes_by_hand() -> None:
    par = ParallelConfig(pp=2, dp=8)
    st = ExecutionSettings(microbatch_size=8, microbatches=2)
    out = minimal_changes(G, par, st, global_batch=16, devices=12, node=4)
    kinds = {k: (p, s) for k, p, s in out}
    # DP 8 -> 4 (6 would fit 12 devices but does not divide the batch of 16)
    p, s = kinds["fewer replicas"]
    assert (p.dp, p.pp, s.microbatch_size, s.microbatches) == (4, 2, 4, 4)
    # PP 2 -> 1: 8 devices
    p, _ = kinds["re-cut pipeline"]
    assert (p.pp, p.dp) == (1, 8)
    same = minimal_changes(G, par, st, global_batch=16, devices=16, node=4)
    assert same == [("same layout", par, st)]


def test_recut_keeps_interleaving_when_it_can() -> None:
    g = gpt_graph(layers=12, hidden=32, seq=16, vocab=64)
    par = ParallelConfig(pp=4, vp=3, dp=2)
    st = ExecutionSettings(microbatch_size=2, microbatches=12, schedule="interleaved-1f1b",
                           virtual_stages=3)
    out = {k: p for k, p, _ in minimal_changes(g, par, st, global_batch=24, devices=7, node=8)}
    recut = out["re-cut pipeline"]  # 12 micro-batches fill 3 ranks: VP 3 kept, uneven
    assert (recut.pp, recut.vp, recut.stage_layers) == (3, 3, (1, 2, 1, 1, 2, 1, 1, 2, 1))
    st8 = ExecutionSettings(microbatch_size=2, microbatches=8, schedule="interleaved-1f1b",
                            virtual_stages=3)
    out = {k: (p, s) for k, p, s in minimal_changes(g, par, st8, global_batch=16, devices=7,
                                                   node=8)}
    recut, s = out["re-cut pipeline"]  # 8 micro-batches do not fill 3 ranks: no interleaving
    assert (recut.pp, recut.vp, s.schedule) == (3, 1, "1f1b")


def test_usable_counts_by_hand() -> None:
    # 4 blocks, batch 16, nodes of 8: tp in {1, 2, 4, 8}, pp in {1, 2, 4}, dp | 16: powers
    # of two only; uneven pipelines add pp 3 (1, 2, 1 blocks with the embedding and loss)
    even = usable_counts(G, ST, global_batch=16, devices=40, node=8, space=SearchSpace(),
                         min_use=0.5)
    assert even == [32]
    uneven = SearchSpace(uneven=True)
    assert usable_counts(G, ST, global_batch=16, devices=40, node=8, space=uneven,
                         min_use=0.5) == [32, 24]
    # inside one node any count goes; 6 = TP 2 x PP 3
    assert usable_counts(G, ST, global_batch=16, devices=6, node=8, space=uneven,
                         min_use=0.5) == [6, 4, 3]


def test_context_round_trip() -> None:
    c = LLMCandidate(ParallelConfig(tp=2, dp=4), ST, 1.5, 2.0e9, True)
    ctx = ReplanContext(global_batch=16, settings=ST, candidates=(c, c), model="llama3:8B",
                        batch_size=8, seq_len=8192, cluster="dgx-h100,nodes=1", topology="x")
    back = ReplanContext.from_dict(ctx.to_dict())
    assert back == ctx
    with pytest.raises(InvalidFileError):
        ReplanContext.from_dict({"format": "shardplan.replan/1"})
    inf = LLMCandidate(ParallelConfig(), ST, math.inf, 1.0, True)
    data = ReplanContext(1, ST, (inf,)).to_dict()
    data["candidates"][0]["iteration_seconds"] = None  # as the writer writes inf
    assert math.isinf(ReplanContext.from_dict(data).candidates[0].iteration_seconds)


def test_cluster_changes_and_their_errors() -> None:
    ch = change_by_flags(TOPO, remove=["node0/gpu3"], remove_gpus=1)
    assert ch.removed == ("node0/gpu3", "node1/gpu7") and ch.num_alive == 14
    assert ch.usable_nodes().shape == (1, 7)  # both nodes broken: the fullest one
    with pytest.raises(ShardplanError, match="no device or node"):
        change_by_flags(TOPO, remove=["node9"])
    with pytest.raises(ShardplanError, match="2 nodes left"):
        change_by_flags(TOPO, remove_nodes=3)
    with pytest.raises(ShardplanError, match="leaves none"):
        change_by_flags(TOPO, remove_gpus=16)
    with pytest.raises(ShardplanError, match="whole nodes"):
        change_by_flags(TOPO, add_gpus=4)
    grown = change_by_flags(TOPO, add_gpus=16)
    assert grown.base.num_devices == 32 and grown.base.devices[-1].name == "node3/gpu7"
    now = change_to(TOPO, build_spec("dgx-h100,nodes=3"))
    assert now.added[0] == "node2/gpu0" and now.removed == ()


def test_usable_nodes_of_a_single_broken_node() -> None:
    ch = change_by_flags(build_spec("dgx-h100"), remove=["node0/gpu2"])
    rows = ch.usable_nodes()
    assert rows.shape == (1, 7) and 2 not in rows[0]
    part = ch.topology_of(rows[0])
    assert part.num_devices == 7 and part.pair_model.shape == (1, 7)


def test_sub_topology_refusals() -> None:
    with pytest.raises(ShardplanError, match="distinct"):
        sub_topology(TOPO, [0, 0])
    part = sub_topology(TOPO, np.r_[8:16, 0:8])
    assert part.devices[0].name == "node1/gpu0" and part.levels[0].groups[0][0] == 0
