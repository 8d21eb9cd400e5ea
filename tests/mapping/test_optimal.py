"""``optimal`` and ``consecutive`` against an exhaustive search written here, independently
of shardplan's evaluators (Parmesan section 5, equations 6-7)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardplan import registry
from shardplan.errors import InfeasibleError, ShardplanError
from shardplan.ir import Device, Graph, Objective, Plan, Stage, Topology
from shardplan.mapping._bounds import lower_bound
from shardplan.mapping._search import twin_classes
from shardplan.mapping._stage_time import build_problem
from shardplan.objectives import evaluate


def make_instance(seed: int, num_stages: int, num_replicas: int, num_devices: int, *,
                  twins: bool = False, symmetric: bool = True, latency: bool = True,
                  ) -> tuple[Graph, Topology, Plan]:
    """A random graph split into stages (node i in stage i % S) and a random topology."""
    rng = np.random.default_rng(seed)
    n = 2 * num_stages
    iu = np.triu_indices(n, 1)
    keep = rng.random(iu[0].size) < 0.5
    src, dst = iu[0][keep], iu[1][keep]
    graph = Graph.from_arrays(
        name="g", fwd_flops=rng.uniform(1e9, 1e10, n), src=src, dst=dst,
        edge_bytes=rng.integers(0, 5_000_000, src.size),
        param_bytes=rng.integers(0, 20_000_000, n))
    d = num_devices
    bw = rng.uniform(1e9, 1e10, (d, d))
    lat = rng.uniform(0, 1e-4, (d, d)) if latency else np.zeros((d, d))
    if rng.random() < 0.2 and d > 2:
        bw[0, 1] = bw[1, 0] = 0.0  # no route between devices 0 and 1
    if symmetric:
        bw, lat = np.triu(bw, 1) + np.triu(bw, 1).T, np.triu(lat, 1) + np.triu(lat, 1).T
    flops = rng.choice([1e12, 2e12], d)
    if twins and d >= 3:  # make devices 1 and 2 interchangeable
        for m in (bw, lat):
            m[2, :], m[:, 2] = m[1, :], m[:, 1]
            m[1, 2] = m[2, 1] = m[1, 0]
        flops[2] = flops[1]
    np.fill_diagonal(bw, 0.0)
    np.fill_diagonal(lat, 0.0)
    topo = Topology(name="t", devices=tuple(Device(f"d{i}", 1e12, float(flops[i]))
                                            for i in range(d)),
                    bandwidth=bw, latency=lat)
    stages = tuple(Stage(tuple(range(s, n, num_stages)),
                         tuple(range(s * num_replicas, (s + 1) * num_replicas)))
                   for s in range(num_stages))
    plan = Plan(graph="g", topology="t", algorithm="test", stages=stages,
                objective=Objective("max_stage_seconds", 0.0))
    return graph, topo, plan


def brute_force(graph: Graph, topo: Topology, plan: Plan, model: str) -> float:
    """min over every injective mapping of the max stage time, written from the formulas."""
    S, R, D = plan.num_stages, plan.num_replicas, topo.num_devices
    stage = np.empty(graph.num_nodes, dtype=np.int64)
    for s, stg in enumerate(plan.stages):
        stage[list(stg.nodes)] = s
    work = np.zeros(S)
    np.add.at(work, stage, graph.fwd_flops + graph.bwd_flops)
    comp = work[:, None] / topo.device_flops[None, :]  # (S, D)
    with np.errstate(divide="ignore"):
        inv = np.where(topo.bandwidth > 0, 1.0 / topo.bandwidth, np.inf)
    perms = np.array(list(itertools.permutations(range(D), S * R)), dtype=np.int64)
    dev = perms.reshape(-1, S, R)
    t = comp[np.arange(S)[None, :, None], dev]  # (P, S, R)
    if model == "p2p":
        nbytes = np.zeros((S, S))
        adj = np.zeros((S, S), dtype=bool)
        for u, v, b in zip(graph.src, graph.dst, graph.edge_bytes, strict=True):
            a, c = stage[u], stage[v]
            if a != c:
                nbytes[a, c] += b
                nbytes[c, a] += b
                adj[a, c] = adj[c, a] = True
        for a in range(S):
            for c in range(S):
                if adj[a, c]:
                    x, y = dev[:, a, :], dev[:, c, :]
                    with np.errstate(invalid="ignore"):
                        t[:, a, :] += topo.latency[x, y] + nbytes[a, c] * inv[x, y]
    else:
        params = np.zeros(S)
        np.add.at(params, stage, graph.param_bytes)
        if R > 1:
            for a in range(S):
                ring = np.max(inv[dev[:, a, :], np.roll(dev[:, a, :], -1, axis=1)], axis=1)
                k = 2 * (R - 1) * params[a] / R
                t[:, a, :] += (k * ring if k > 0 else 0.0)[:, None]
    t = np.where(np.isnan(t), np.inf, t)
    return float(t.reshape(t.shape[0], -1).max(axis=1).min())


def _optimal(graph: Graph, topo: Topology, plan: Plan, *, seed: int = 0, **options):
    """The ``optimal`` mapper itself, without ``registry.run``'s refusal of plans that send
    data over a pair with no route (an infinite optimum is a valid answer of the search)."""
    res = registry.get("map", "optimal")(graph, topo, options={"plan": plan, **options},
                                         seed=seed, time_limit=None)
    res.plan.validate(graph, topo)
    return res


def check_plan(out: Plan, plan: Plan, topo: Topology) -> None:
    used = [d for st in out.stages for d in st.devices]
    assert len(used) == len(set(used)) == plan.num_stages * plan.num_replicas
    assert all(0 <= d < topo.num_devices for d in used)
    assert [st.nodes for st in out.stages] == [st.nodes for st in plan.stages]


sizes = st.sampled_from([(1, 2, 2), (2, 1, 3), (2, 2, 4), (3, 1, 4), (2, 2, 5), (4, 1, 6),
                         (3, 2, 6), (2, 3, 7), (4, 2, 8), (2, 4, 8), (3, 2, 7)])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), size=sizes, model=st.sampled_from(["p2p", "allreduce"]),
       twins=st.booleans(), symmetric=st.booleans())
def test_optimal_equals_exhaustive(seed, size, model, twins, symmetric):
    graph, topo, plan = make_instance(seed, *size, twins=twins, symmetric=symmetric)
    expect = brute_force(graph, topo, plan, model)
    res = _optimal(graph, topo, plan, model=model, seed=seed)
    out = res.plan
    check_plan(out, plan, topo)
    assert out.objective.name == f"max_stage_seconds_{model}"
    try:
        registry.check_reachable(out, graph, topo)
    except InfeasibleError:  # registry.run refuses a mapping that uses a pair with no route
        with pytest.raises(InfeasibleError, match="cannot reach"):
            registry.run("map", "optimal", graph, topo, plan=plan, model=model, seed=seed)
    if math.isinf(expect):
        assert math.isinf(out.objective.value)
        return
    assert out.status == "optimal"
    assert out.objective.value == pytest.approx(expect, rel=1e-7)
    assert out.objective.lower_bound == pytest.approx(out.objective.value)
    # The recorded value is what `shardplan cost` recomputes from the three files.
    name, value, _ = evaluate(out, graph, topo, "max-stage")
    assert name == out.objective.name and value == pytest.approx(out.objective.value,
                                                                 rel=1e-12)
    # Eq. 8 / 9 lower bounds never exceed the optimum.
    assert lower_bound(build_problem(plan, graph, topo), model) <= expect * (1 + 1e-9)


@pytest.mark.parametrize("model", ["p2p", "allreduce"])
def test_symmetry_rules_do_not_change_the_optimum(model):
    for seed in range(6):
        graph, topo, plan = make_instance(seed, 2, 3, 7, twins=True)
        a = _optimal(graph, topo, plan, model=model)
        b = _optimal(graph, topo, plan, model=model, symmetry=False)
        assert a.objective == pytest.approx(b.objective, rel=1e-9)


def test_consecutive_layout_and_value():
    graph, topo, plan = make_instance(3, 3, 2, 6)
    for order, expect in (("stage-major", [(0, 1), (2, 3), (4, 5)]),
                          ("replica-major", [(0, 3), (1, 4), (2, 5)])):
        res = registry.run("map", "consecutive", graph, topo, plan=plan, model="p2p",
                           order=order)
        assert [st.devices for st in res.plan.stages] == expect
        assert res.plan.status == "feasible"
        assert evaluate(res.plan, graph, topo, "max-stage")[1] == res.objective
        opt = registry.run("map", "optimal", graph, topo, plan=plan, model="p2p")
        assert opt.objective <= res.objective * (1 + 1e-12)


def test_recorded_options_leave_out_the_plan_and_name_the_model():
    graph, topo, plan = make_instance(1, 2, 2, 4)
    res = registry.run("map", "optimal", graph, topo, plan=plan, seed=4)
    assert "plan" not in res.plan.options
    assert res.plan.options["model"] in ("p2p", "allreduce")
    assert res.plan.seed == 4 and res.plan.algorithm == "optimal"
    assert res.plan.objective.name == f"max_stage_seconds_{res.plan.options['model']}"


def test_same_seed_same_plan():
    graph, topo, plan = make_instance(5, 4, 2, 8)
    a = registry.run("map", "optimal", graph, topo, plan=plan, seed=7, model="p2p")
    b = registry.run("map", "optimal", graph, topo, plan=plan, seed=7, model="p2p")
    assert [s.devices for s in a.plan.stages] == [s.devices for s in b.plan.stages]


def test_time_limit_returns_a_valid_mapping_timed_out():
    from shardplan.topology import build

    graph, _, plan = make_instance(2, 8, 8, 8)
    topo = build("uniform-dist", num_devices=64, seed=1)
    res = registry.run("map", "optimal", graph, topo, plan=plan, model="p2p", time_limit=0.5)
    check_plan(res.plan, plan, topo)
    assert res.plan.status in ("timed_out", "optimal")
    assert res.plan.objective.lower_bound <= res.objective
    cs = registry.run("map", "consecutive", graph, topo, plan=plan, model="p2p")
    assert res.objective <= cs.objective


def test_twin_classes():
    from shardplan.topology import build

    topo = build("hierarchical", shape=(2, 4))
    graph, _, plan = make_instance(0, 2, 2, 4)
    cls = twin_classes(build_problem(plan, graph, topo))
    assert np.unique(cls).size == 2 and (cls[:4] == cls[0]).all()
    mesh = build("mesh2d", shape=(3, 3))
    assert np.unique(twin_classes(build_problem(plan, graph, mesh))).size == 9


@pytest.mark.parametrize("bad, match", [
    ({"model": "ring"}, "model"),
    ({"workers": 0}, "workers"),
    ({"epsilon": 2.0}, "epsilon"),
    ({"bogus": 1}, "bogus"),
])
def test_bad_options(bad, match):
    graph, topo, plan = make_instance(0, 2, 1, 3)
    with pytest.raises(ShardplanError, match=match):
        registry.run("map", "optimal", graph, topo, plan=plan, **bad)


def test_needs_a_plan_and_enough_devices():
    graph, topo, plan = make_instance(0, 2, 2, 4)
    with pytest.raises(ShardplanError, match="plan"):
        registry.run("map", "optimal", graph, topo)
    small = Topology(name="s", devices=topo.devices[:3], bandwidth=topo.bandwidth[:3, :3],
                     latency=topo.latency[:3, :3])
    with pytest.raises(ShardplanError, match="need 4 devices"):
        registry.run("map", "consecutive", graph, small, plan=plan)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("model", ["p2p", "allreduce"])
def test_worker_processes_find_the_same_optimum(model):
    graph, topo, plan = make_instance(11, 4, 2, 8)
    expect = brute_force(graph, topo, plan, model)
    res = registry.run("map", "optimal", graph, topo, plan=plan, model=model, workers=2)
    assert res.plan.status == "optimal"
    assert res.objective == pytest.approx(expect, rel=1e-7)


def test_grid_automorphism_groups():
    from shardplan.mapping._symmetry import grid_automorphisms
    from shardplan.topology import build

    graph, _, plan = make_instance(0, 2, 1, 4)
    for kind, shape, size in (("torus2d", (3, 3), 72), ("mesh2d", (2, 4), 4),
                              ("mesh3d", (2, 2, 2), 48), ("torus2d", (3, 4), 48)):
        topo = build(kind, shape=shape)
        prob = build_problem(plan, graph, topo)
        group = grid_automorphisms(topo.meta, prob.latency, prob.inv_bandwidth,
                                   prob.device_flops)
        assert group is not None and group.shape == (size, topo.num_devices)
        assert np.array_equal(group[0], np.arange(topo.num_devices))
        for g in group:  # every element really is an automorphism
            assert np.array_equal(prob.latency[np.ix_(g, g)], prob.latency)
    assert grid_automorphisms({}, prob.latency, prob.inv_bandwidth, prob.device_flops) is None


@pytest.mark.parametrize("kind, shape", [("torus2d", (3, 3)), ("mesh2d", (2, 4)),
                                         ("mesh3d", (2, 2, 2))])
@pytest.mark.parametrize("model", ["p2p", "allreduce"])
def test_optimal_is_exact_on_symmetric_grids(kind, shape, model):
    from shardplan.topology import build

    topo = build(kind, shape=shape, link_bandwidth=1e9, hop_latency=2e-4)
    for seed, (s, r) in enumerate([(3, 2), (2, 3), (4, 2)]):
        graph, _, plan = make_instance(seed, s, r, topo.num_devices)
        expect = brute_force(graph, topo, plan, model)
        res = registry.run("map", "optimal", graph, topo, plan=plan, model=model)
        assert res.plan.status == "optimal"
        assert res.objective == pytest.approx(expect, rel=1e-7)
