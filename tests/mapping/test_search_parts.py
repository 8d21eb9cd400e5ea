"""The pieces of the optimal mapping: batched evaluators, lower bounds, local search, inner
search outcomes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shardplan.mapping._bounds import allreduce_node_bounds, lower_bound, p2p_node_bounds
from shardplan.mapping._local import improve
from shardplan.mapping._search import AllreduceSearch, P2PSearch, consecutive_devices
from shardplan.mapping._stage_time import build_problem, choose_model, stage_times
from tests.mapping.test_optimal import brute_force, make_instance

MODELS = ["overlap", "p2p", "allreduce"]


@pytest.mark.parametrize("model", MODELS)
def test_batch_evaluation_equals_one_by_one(model):
    graph, topo, plan = make_instance(8, 3, 2, 7, symmetric=False)
    prob = build_problem(plan, graph, topo, model=model)
    rng = np.random.default_rng(0)
    batch = np.stack([rng.permutation(7)[:6].reshape(3, 2) for _ in range(20)])
    together = stage_times(prob, batch, model)
    for b in range(20):
        assert np.array_equal(together[b], stage_times(prob, batch[b], model))


@pytest.mark.parametrize("model", MODELS)
def test_local_search_never_worsens_and_keeps_a_bijection(model):
    for seed in range(5):
        graph, topo, plan = make_instance(seed, 4, 2, 8)
        prob = build_problem(plan, graph, topo, model=model)
        start = consecutive_devices(4, 2)
        dev, _ = improve(prob, model, start)
        assert len(set(dev.reshape(-1).tolist())) == 8
        assert stage_times(prob, dev, model).max() <= stage_times(prob, start, model).max()


@pytest.mark.parametrize("model", MODELS)
def test_inner_search_answers_around_the_optimum(model):
    graph, topo, plan = make_instance(21, 3, 2, 6)
    prob = build_problem(plan, graph, topo, model=model)
    opt = brute_force(graph, topo, plan, model)
    search = (AllreduceSearch if model == "allreduce" else P2PSearch)(prob)
    above = search.search(opt * (1 + 1e-6), None)
    assert above.status == "found" and above.value <= opt * (1 + 1e-6)
    assert search.search(opt * (1 - 1e-6), None).status == "infeasible"
    # The node bounds are lower bounds of the optimum (eq. 8 / 9).
    nb = allreduce_node_bounds(prob) if model == "allreduce" else p2p_node_bounds(prob)
    assert lower_bound(prob, model, nb) <= opt * (1 + 1e-12)


def test_p2p_bound_uses_the_exact_assignment_with_latency():
    # Stage 0 talks to two stages; eq. 8 places both neighbours on distinct devices.
    graph, topo, plan = make_instance(2, 3, 1, 4)
    prob = build_problem(plan, graph, topo, model="p2p")
    nb = p2p_node_bounds(prob)
    assert np.all(nb >= prob.compute - 1e-15)
    assert math.isfinite(lower_bound(prob, "p2p", nb)) or not np.isfinite(nb).any()


def test_auto_model_follows_the_settings():
    from shardplan.ir import ExecutionSettings

    graph, topo, plan = make_instance(0, 2, 2, 4)
    assert choose_model(build_problem(plan, graph, topo)) == "overlap"
    off = ExecutionSettings(overlap=False)
    assert choose_model(build_problem(plan, graph, topo, settings=off)) == "p2p"
    assert choose_model(build_problem(plan, graph, topo, model="allreduce")) == "allreduce"


def test_views_agree_with_the_stage_time_model():
    # The mapping's arrays and shardplan.cost.stage_times are two code paths for one model.
    from shardplan.cost import CostModel
    from shardplan.cost import stage_times as model_times

    for seed in range(4):
        graph, topo, plan = make_instance(seed, 3, 2, 7, symmetric=seed % 2 == 0)
        devices = np.random.default_rng(seed).permutation(7)[:6].reshape(3, 2)
        cm = CostModel.from_settings(graph, topo, plan.settings)
        st = model_times(cm, plan.assignment(graph.num_nodes), devices, order=range(3))
        for model in MODELS:
            prob = build_problem(plan, graph, topo, model=model)
            got = stage_times(prob, devices)
            want = st.replica_seconds(model)
            assert np.allclose(np.nan_to_num(got, posinf=-1), np.nan_to_num(want, posinf=-1),
                               rtol=1e-12, atol=0)
        # equation 3 is equation 6's slowest replica at the same placement
        assert np.allclose(st.stage_seconds("eq3"), st.replica_seconds("p2p").max(axis=1))


def test_ring_bottleneck_by_hand():
    from shardplan.mapping._bounds import ring_bottleneck

    ib = np.full((4, 4), 10.0)  # two fast pairs {0, 1} and {2, 3}, slow across
    ib[0, 1] = ib[1, 0] = ib[2, 3] = ib[3, 2] = 1.0
    np.fill_diagonal(ib, 0.0)
    assert ring_bottleneck(ib, 2) == 1.0
    assert ring_bottleneck(ib, 3) == 10.0
    assert ring_bottleneck(ib, 5) == math.inf
    assert ring_bottleneck(ib, 2, np.array([0, 2])) == 10.0


def _twin_classes_reference(problem) -> np.ndarray:
    """Twin classes by the definition, every pair checked: O(D^3)."""
    lat, ib, fl = problem.latency, problem.inv_bandwidth, problem.device_flops
    d_count = fl.size
    cls = np.arange(d_count)
    for d in range(d_count):
        if cls[d] != d:
            continue
        for e in range(d + 1, d_count):
            if cls[e] != e or fl[e] != fl[d]:
                continue
            others = np.ones(d_count, dtype=bool)
            others[[d, e]] = False
            if all(np.array_equal(m[d, others], m[e, others])
                   and np.array_equal(m[others, d], m[others, e]) and m[d, e] == m[e, d]
                   for m in (lat, ib)):
                cls[e] = d
    return cls


@pytest.mark.parametrize("seed", range(12))
def test_twin_classes_equal_the_definition(seed):
    from shardplan.ir import Device, Topology
    from shardplan.mapping._search import twin_classes
    from shardplan.topology import build

    rng = np.random.default_rng(seed)
    graph, _, plan = make_instance(seed, 2, 2, 4)
    kinds = [build("hierarchical", shape=(2, 3, 2)), build("mesh2d", shape=(3, 4)),
             build("torus2d", shape=(3, 4)), build("dgx1", boxes=2),
             build("random-blk-1", num_devices=12, seed=seed), build("flat", num_devices=12)]
    topo = kinds[seed % len(kinds)]
    # Blur some of it: values copied between devices make (or break) twins at random.
    d = topo.num_devices
    bw, lat = topo.bandwidth.copy(), topo.latency.copy()
    if seed >= len(kinds):
        a, b = rng.choice(d, 2, replace=False)
        for m in (bw, lat):
            m[b, :], m[:, b] = m[a, :], m[:, a]
            m[a, b] = m[b, a] = m[a, (a + 1) % d if (a + 1) % d != b else (a + 2) % d]
        bw[rng.integers(d), rng.integers(d)] *= 2.0
        np.fill_diagonal(bw, 0.0)
        np.fill_diagonal(lat, 0.0)
    flops = [dv.flops * (2.0 if seed >= len(kinds) and i == 0 else 1.0)
             for i, dv in enumerate(topo.devices)]
    topo = Topology(name="t", devices=tuple(Device(f"d{i}", 1e12, flops[i]) for i in range(d)),
                    bandwidth=bw, latency=lat)
    prob = build_problem(plan, graph, topo)
    assert np.array_equal(twin_classes(prob), _twin_classes_reference(prob))
