"""Link contention in the mapping objective: a hand-worked line of four chips, the batched
and incremental evaluators against the stage-time model, symmetry under routes, and the
plan's record that ``shardplan cost`` reads back."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from shardplan import registry
from shardplan.cost import CostModel
from shardplan.cost import stage_times as model_times
from shardplan.errors import ShardplanError
from shardplan.ir import ExecutionSettings, Graph, Objective, Plan, Stage, save
from shardplan.mapping._search import P2PSearch
from shardplan.mapping._stage_time import build_problem, contention_extra, stage_times
from shardplan.objectives import evaluate
from shardplan.topology import build
from tests.helpers import run_cli
from tests.mapping.test_optimal import brute_force, make_instance


def line_instance() -> tuple[Graph, object, Plan]:
    """Chips 0 - 1 - 2 - 3 in a line (1 GB/s per direction, no latency); two stages of one
    node each, 4 MB from stage 0 to stage 1, no parameters; two replicas, placed
    consecutively: stage 0 on chips 0, 1, stage 1 on chips 2, 3."""
    topo = build("mesh2d", shape=(1, 4), link_bandwidth=1e9, hop_latency=0.0, flops=1e12)
    graph = Graph.from_arrays(name="g", fwd_flops=[1e9, 1e9], src=[0], dst=[1],
                              edge_bytes=[4_000_000], param_bytes=[0, 0])
    plan = Plan(graph="g", topology=topo.name, algorithm="test",
                stages=(Stage((0,), (0, 1)), Stage((1,), (2, 3))),
                objective=Objective("max_stage_seconds", 0.0))
    return graph, topo, plan


def test_line_by_hand():
    graph, topo, plan = line_instance()
    cm = CostModel.from_settings(graph, topo, ExecutionSettings())
    a = plan.assignment(2)
    alone = model_times(cm, a, [[0, 1], [2, 3]])
    shared = model_times(cm, a, [[0, 1], [2, 3]], contention=True)
    # Each replica sends 2 MB forward (0 -> 2 and 1 -> 3) and 2 MB of gradients back: 2 ms
    # alone; both forward transfers cross link 1 -> 2 from different chips, both gradients
    # cross 2 -> 1, so each takes (2 + 2) MB / 1 GB/s = 4 ms.
    assert np.allclose(alone.send, 2e-3) and np.allclose(alone.recv, 2e-3)
    assert np.allclose(shared.send, 4e-3) and np.allclose(shared.recv, 4e-3)
    # Interleaved (0, 2 | 1, 3): the two routes 0 -> 1 and 2 -> 3 share no link.
    apart = model_times(cm, a, [[0, 2], [1, 3]], contention=True)
    assert np.allclose(apart.send, 2e-3)
    # One sender's own transfers do not slow each other: one replica, chip 0 -> 2.
    plan1 = Plan(graph="g", topology=topo.name, algorithm="test",
                 stages=(Stage((0,), (0,)), Stage((1,), (2,))),
                 objective=Objective("max_stage_seconds", 0.0))
    one = model_times(cm, plan1.assignment(2), [[0], [2]], contention=True)
    assert np.allclose(one.send, 4e-3)  # 4 MB alone on the route


def test_line_mapping_and_cost(tmp_path, capsys):
    graph, topo, plan = line_instance()
    cs = registry.run("map", "consecutive", graph, topo, plan=plan)
    opt = registry.run("map", "optimal", graph, topo, plan=plan, judge=False)
    # overlap: compute (1e9 + 2e9 FLOPs) / 2 at 1e12 = 1.5 ms, below the sends
    assert cs.plan.objective.name == "max_stage_seconds_overlap_contention"
    assert cs.plan.options["contention"] is True
    assert cs.objective == pytest.approx(4e-3)
    assert opt.objective == pytest.approx(2e-3) and opt.plan.status == "optimal"
    assert sorted(opt.plan.stages[0].devices + opt.plan.stages[1].devices) == [0, 1, 2, 3]
    off = registry.run("map", "consecutive", graph, topo, plan=plan, contention=False)
    assert off.plan.objective.name == "max_stage_seconds_overlap"
    assert off.objective == pytest.approx(2e-3)
    # ``shardplan cost`` reads the model from the objective's name; an option overrides it.
    files = []
    for obj, name in ((cs.plan, "plan.json"), (graph, "g.json"), (topo, "t.json")):
        save(obj, tmp_path / name)
        files.append(str(tmp_path / name))
    assert run_cli(["cost", *files, "--objective", "max-stage", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["objective"] == data["recorded_name"]
    assert data["value"] == pytest.approx(cs.objective, rel=1e-12) and data["contention"]
    assert run_cli(["cost", *files, "--objective", "max-stage", "--json",
                    "--option", "contention=false"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["objective"] == "max_stage_seconds_overlap"
    assert data["value"] == pytest.approx(2e-3)


def test_contention_option():
    graph, topo, plan = line_instance()
    assert build_problem(plan, graph, topo).contention
    assert not build_problem(plan, graph, topo, contention=False).contention
    assert not build_problem(plan, graph, topo, model="allreduce").contention  # no transfers
    g2, flat, plan2 = make_instance(0, 2, 2, 4)  # a matrix topology: no links to share
    assert not build_problem(plan2, g2, flat, contention=True).contention
    with pytest.raises(ShardplanError, match="contention must be"):
        registry.run("map", "consecutive", graph, topo, plan=plan, contention="yes")
    with pytest.raises(ShardplanError, match="contention must be"):
        evaluate(replace(plan, objective=Objective("max_stage_seconds_p2p", 0.0)), graph, topo,
                 "max-stage", contention=1)


@pytest.mark.parametrize("model", ["overlap", "p2p"])
def test_batched_incremental_and_stage_time_model_agree(model):
    from shardplan.mapping._search import make_search

    for seed in range(6):
        graph, topo, plan = make_instance(seed, 3, 2, 7, links=True, symmetric=seed % 2 == 0)
        prob = build_problem(plan, graph, topo, model=model)
        assert prob.contention
        rng = np.random.default_rng(seed)
        batch = np.stack([rng.permutation(7)[:6].reshape(3, 2) for _ in range(9)])
        together = stage_times(prob, batch)
        cm = CostModel.from_settings(graph, topo, plan.settings)
        for b in range(batch.shape[0]):
            one = stage_times(prob, batch[b])
            assert np.array_equal(together[b], one)
            st = model_times(cm, plan.assignment(graph.num_nodes), batch[b], order=range(3),
                             contention=True)
            assert np.allclose(one, st.replica_seconds(model), rtol=1e-12, atol=0)
        # chunked evaluation of a batch equals one pass
        assert np.array_equal(contention_extra(prob, batch, max_entries=1),
                              contention_extra(prob, batch))
        # the search's incremental times at a leaf are the batched ones
        opt = brute_force(graph, topo, plan, model, contention=True)
        out = make_search(prob, model).search(opt * (1 + 1e-9), None)
        assert out.status == "found" and out.value == pytest.approx(opt, rel=1e-9)
        assert P2PSearch(prob).search(opt * (1 - 1e-7), None).status == "infeasible"


@pytest.mark.parametrize("kind, shape", [("torus2d", (3, 3)), ("mesh2d", (2, 4)),
                                         ("mesh3d", (2, 2, 2)), ("torus2d", (3, 4))])
def test_symmetries_kept_under_contention_preserve_contended_times(kind, shape):
    from shardplan.mapping._search import twin_classes

    topo = build(kind, shape=shape, link_bandwidth=1e9, hop_latency=1e-5, flops=1e12)
    graph, _, plan = make_instance(1, 3, 2, topo.num_devices)
    prob = build_problem(plan, graph, topo, automorphisms=True)
    plain = build_problem(plan, graph, topo, automorphisms=True, contention=False)
    assert prob.contention and plain.automorphisms is not None
    group = prob.automorphisms
    # Single-path routing breaks the ties of equal paths one way: fewer symmetries survive.
    assert group is None or group.shape[0] <= plain.automorphisms.shape[0]
    rng = np.random.default_rng(0)
    for g in ([] if group is None else group):
        for _ in range(3):
            dev = rng.permutation(topo.num_devices)[:6].reshape(3, 2)
            assert np.allclose(stage_times(prob, g[dev]), stage_times(prob, dev), rtol=1e-12)
    assert np.array_equal(twin_classes(prob), np.arange(topo.num_devices))


@pytest.mark.parametrize("model", ["overlap", "p2p"])
def test_symmetry_rules_do_not_change_the_contended_optimum(model):
    for seed in range(4):
        graph, topo, plan = make_instance(seed, 2, 3, 7, links=True)
        a = registry.run("map", "optimal", graph, topo, plan=plan, model=model, judge=False)
        b = registry.run("map", "optimal", graph, topo, plan=plan, model=model, judge=False,
                         symmetry=False)
        expect = brute_force(graph, topo, plan, model, contention=True)
        assert a.objective == pytest.approx(expect, rel=1e-7)
        assert b.objective == pytest.approx(expect, rel=1e-7)


@pytest.mark.parametrize("kind, shape", [("torus2d", (3, 3)), ("mesh2d", (2, 4)),
                                         ("mesh3d", (2, 2, 2))])
@pytest.mark.parametrize("model", ["overlap", "p2p"])
def test_optimal_is_exact_on_grids_with_contention(kind, shape, model):
    topo = build(kind, shape=shape, link_bandwidth=1e9, hop_latency=2e-4, flops=1e12)
    for seed, (s, r) in enumerate([(3, 2), (2, 3)]):
        graph, _, plan = make_instance(seed, s, r, topo.num_devices)
        expect = brute_force(graph, topo, plan, model, contention=True)
        res = registry.run("map", "optimal", graph, topo, plan=plan, model=model, judge=False)
        assert res.plan.status == "optimal"
        assert res.plan.objective.name.endswith("_contention")
        assert res.objective == pytest.approx(expect, rel=1e-7)
