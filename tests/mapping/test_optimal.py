"""``optimal`` and ``consecutive`` against an exhaustive search written here, independently
of shardplan's evaluators (Parmesan section 5: equations 6-7, and the overlap view)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardplan import registry
from shardplan.errors import InfeasibleError, ShardplanError
from shardplan.ir import Device, Graph, Link, Objective, Plan, Stage, Topology
from shardplan.mapping._bounds import lower_bound
from shardplan.mapping._search import twin_classes
from shardplan.mapping._stage_time import build_problem
from shardplan.objectives import evaluate
from shardplan.topology import routes_of
from shardplan.topology._routing import route


def random_links(rng: np.random.Generator, num_devices: int, *, symmetric: bool = True,
                 latency: bool = True) -> tuple[Link, ...]:
    """A random connected network of physical links: a random spanning tree and some more
    links, both directions of each, random bandwidth (per direction unless ``symmetric``)
    and latency."""
    d = num_devices
    pairs = {(int(rng.integers(i)), i) for i in range(1, d)}  # a random tree
    pairs |= {(a, b) for a in range(d) for b in range(a + 1, d) if rng.random() < 0.25}
    links = []
    for a, b in sorted(pairs):
        bw = rng.choice([1e9, 2e9, 5e9])  # few values: ties between routes and loads
        lat = float(rng.uniform(0, 2e-5)) if latency else 0.0
        links.append(Link(a, b, float(bw), lat))
        links.append(Link(b, a, float(bw if symmetric else rng.choice([1e9, 2e9, 5e9])), lat))
    return tuple(links)


def make_instance(seed: int, num_stages: int, num_replicas: int, num_devices: int, *,
                  twins: bool = False, symmetric: bool = True, latency: bool = True,
                  links: bool = False) -> tuple[Graph, Topology, Plan]:
    """A random graph split into stages (node i in stage i % S) and a random topology: a
    random matrix of bandwidth and latency, or (``links``) a random network of physical
    links routed over shortest paths (then ``twins`` is ignored)."""
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
    physical: tuple[Link, ...] = ()
    if links:
        physical = random_links(rng, d, symmetric=symmetric, latency=latency)
        routes = route(d, physical)
        bw, lat = routes.bandwidth.copy(), routes.latency.copy()
        twins = False
    if twins and d >= 3:  # make devices 1 and 2 interchangeable
        for m in (bw, lat):
            m[2, :], m[:, 2] = m[1, :], m[:, 1]
            m[1, 2] = m[2, 1] = m[1, 0]
        flops[2] = flops[1]
    np.fill_diagonal(bw, 0.0)
    np.fill_diagonal(lat, 0.0)
    topo = Topology(name="t", devices=tuple(Device(f"d{i}", 1e12, float(flops[i]))
                                            for i in range(d)),
                    bandwidth=bw, latency=lat, links=physical)
    stages = tuple(Stage(tuple(range(s, n, num_stages)),
                         tuple(range(s * num_replicas, (s + 1) * num_replicas)))
                   for s in range(num_stages))
    plan = Plan(graph="g", topology="t", algorithm="test", stages=stages,
                objective=Objective("max_stage_seconds", 0.0))
    return graph, topo, plan


def _contention_extra(topo: Topology, dev: np.ndarray, nbytes: np.ndarray, model: str
                      ) -> np.ndarray:
    """What link contention adds to every replica's communication, (P, S, R), written from
    its definition: replica r of stage a sends replica r of stage b one transfer carrying
    a's tensors for b and the gradients of b's tensors for a, 1/R of each; all transfers
    stream at once; over each link of its route a transfer shares the link with the
    transfers of the *other* sending devices; its bandwidth time is the largest over its
    links of (its bytes + theirs) / link bandwidth, at least its bytes over the route's
    bottleneck; the excess is charged to the sender, and under p2p to the receiver too."""
    n_perm, s_count, r_count = dev.shape
    routes = routes_of(topo)
    link_bw: dict[tuple[int, int], float] = {}
    for lk in topo.links:  # the lowest-latency link of a pair, then the fastest
        key = (lk.src, lk.dst)
        if key not in link_bw or (lk.latency, -lk.bandwidth) < link_bw[key]:
            link_bw[key] = (lk.latency, -lk.bandwidth)
    names = sorted(link_bw)
    index = {lk: i for i, lk in enumerate(names)}
    bw = np.array([-link_bw[lk][1] for lk in names])
    d = topo.num_devices
    on = np.zeros((d, d, len(names)))  # 1 where the route x -> y crosses the link
    for x in range(d):
        for y in range(d):
            if x != y and topo.bandwidth[x, y] > 0:
                for hop in routes.links_on_path(x, y):
                    on[x, y, index[hop]] = 1.0
    with np.errstate(divide="ignore"):
        inv = np.where(topo.bandwidth > 0, 1.0 / topo.bandwidth, np.inf)
    transfers = [(a, b, r, (nbytes[a, b] + nbytes[b, a]) / r_count)
                 for a in range(s_count) for b in range(s_count) for r in range(r_count)
                 if a != b and nbytes[a, b] + nbytes[b, a] > 0]
    load = np.zeros((n_perm, len(names)))
    for a, b, r, m in transfers:
        load += on[dev[:, a, r], dev[:, b, r]] * m
    extra = np.zeros((n_perm, s_count, r_count))
    for a, b, r, m in transfers:
        x, y = dev[:, a, r], dev[:, b, r]
        own = sum(on[x, dev[:, b2, r]] * m2 for a2, b2, r2, m2 in transfers
                  if (a2, r2) == (a, r))  # the same device sends it
        mine = on[x, y] > 0
        shared = np.where(mine, (m + load - own) / bw, 0.0).max(axis=1)
        alone = m * inv[x, y]
        with np.errstate(invalid="ignore"):
            more = np.where(np.isfinite(alone), np.maximum(shared - alone, 0.0), 0.0)
        extra[:, a, r] += more
        if model == "p2p":
            extra[:, b, r] += more
    return extra


def brute_force(graph: Graph, topo: Topology, plan: Plan, model: str,
                microbatches: int = 8, contention: bool = False) -> float:
    """min over every injective mapping of the max stage time, written from the definitions:
    a replica computes 1/R of its stage's work; a producer's tensor goes once to every other
    stage that reads it (its largest edge), 1/R of it between replicas of the same index,
    one latency per tensor; p2p charges what a replica sends and receives in both passes,
    overlap the larger of compute and what it sends plus the ring all-reduce over
    M + S - 1 steps, allreduce compute plus the ring all-reduce. With ``contention`` (on a
    topology with links), transfers share links (:func:`_contention_extra`)."""
    S, R, D = plan.num_stages, plan.num_replicas, topo.num_devices
    stage = np.empty(graph.num_nodes, dtype=np.int64)
    for s, stg in enumerate(plan.stages):
        stage[list(stg.nodes)] = s
    work = np.zeros(S)
    np.add.at(work, stage, graph.fwd_flops + graph.bwd_flops)
    comp = work[:, None] / R / topo.device_flops[None, :]  # (S, D)
    with np.errstate(divide="ignore"):
        inv = np.where(topo.bandwidth > 0, 1.0 / topo.bandwidth, np.inf)
    np.fill_diagonal(inv, 0.0)
    lat = topo.latency
    perms = np.array(list(itertools.permutations(range(D), S * R)), dtype=np.int64)
    dev = perms.reshape(-1, S, R)
    c = comp[np.arange(S)[None, :, None], dev]  # (P, S, R)
    tensor: dict[tuple[int, int], float] = {}  # (producer, consuming stage) -> bytes
    for u, v, b in zip(graph.src.tolist(), graph.dst.tolist(), graph.edge_bytes.tolist(),
                       strict=True):
        if b > 0 and stage[u] != stage[v]:
            tensor[(u, stage[v])] = max(tensor.get((u, stage[v]), 0.0), float(b))
    nbytes, count = np.zeros((S, S)), np.zeros((S, S))
    for (u, t), b in tensor.items():
        nbytes[stage[u], t] += b
        count[stage[u], t] += 1
    comm = np.zeros_like(c)
    for a in range(S):
        for b in range(S):
            if nbytes[a, b] <= 0:
                continue
            x, y = dev[:, a, :], dev[:, b, :]
            with np.errstate(invalid="ignore"):
                fwd = count[a, b] * lat[x, y] + nbytes[a, b] / R * inv[x, y]  # a -> b
                bwd = count[a, b] * lat[y, x] + nbytes[a, b] / R * inv[y, x]  # its gradient
                if model == "p2p":  # both ends pay both messages
                    comm[:, a, :] += fwd + bwd
                    comm[:, b, :] += fwd + bwd
                else:  # what each end sends
                    comm[:, a, :] += fwd
                    comm[:, b, :] += bwd
    if contention and topo.links and model != "allreduce":
        comm = comm + _contention_extra(topo, dev, nbytes, model)
    params = np.zeros(S)
    np.add.at(params, stage, graph.param_bytes)
    ar = np.zeros((dev.shape[0], S))
    if R > 1:
        for a in range(S):
            if params[a] > 0:
                x, y = dev[:, a, :], np.roll(dev[:, a, :], -1, axis=1)
                with np.errstate(invalid="ignore"):
                    ar[:, a] = np.max(2 * (R - 1) * (lat[x, y] + params[a] / R * inv[x, y]),
                                      axis=1)
    if model == "p2p":
        t = c + comm
    elif model == "overlap":
        t = np.maximum(c, comm) + ar[:, :, None] / (microbatches + S - 1)
    else:
        t = c + ar[:, :, None]
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


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), size=sizes,
       model=st.sampled_from(["overlap", "p2p", "allreduce"]),
       twins=st.booleans(), symmetric=st.booleans(),
       network=st.sampled_from(["matrix", "links", "links-no-contention"]))
def test_optimal_equals_exhaustive(seed, size, model, twins, symmetric, network):
    graph, topo, plan = make_instance(seed, *size, twins=twins, symmetric=symmetric,
                                      links=network != "matrix")
    contention = network == "links"  # auto: on where there are links, unless turned off
    opts = {"model": model, "seed": seed, **({} if contention else {"contention": False})}
    expect = brute_force(graph, topo, plan, model, contention=contention)
    if math.isinf(expect):  # every mapping needs a pair the topology cannot connect
        with pytest.raises(InfeasibleError, match="cannot reach"):
            _optimal(graph, topo, plan, **opts)
        return
    res = _optimal(graph, topo, plan, judge=False, **opts)
    out = res.plan
    check_plan(out, plan, topo)
    contended = contention and model != "allreduce"
    assert out.options["contention"] is contended
    assert out.objective.name == f"max_stage_seconds_{model}" + \
        ("_contention" if contended else "")
    try:
        registry.check_reachable(out, graph, topo)
    except InfeasibleError:  # registry.run refuses a mapping that uses a pair with no route
        # (or, when no two devices connect, plans on one part, too small for the plan)
        with pytest.raises(ShardplanError, match="cannot reach"):
            registry.run("map", "optimal", graph, topo, plan=plan, **opts)
    assert out.status == "optimal"
    assert out.objective.value == pytest.approx(expect, rel=1e-7)
    assert out.objective.lower_bound == pytest.approx(out.objective.value)
    # The recorded value is what `shardplan cost` recomputes from the three files.
    name, value, _ = evaluate(out, graph, topo, "max-stage")
    assert name == out.objective.name and value == pytest.approx(out.objective.value,
                                                                 rel=1e-12)
    # Eq. 8 / 9 lower bounds never exceed the optimum.
    prob = build_problem(plan, graph, topo, model=model, contention=contention)
    assert prob.contention is contended
    assert lower_bound(prob, model) <= expect * (1 + 1e-9)


@pytest.mark.parametrize("model", ["overlap", "p2p", "allreduce"])
def test_symmetry_rules_do_not_change_the_optimum(model):
    for seed in range(6):
        graph, topo, plan = make_instance(seed, 2, 3, 7, twins=True, latency=seed % 2 == 0)
        try:
            a = _optimal(graph, topo, plan, model=model, judge=False)
        except InfeasibleError:
            continue
        b = _optimal(graph, topo, plan, model=model, symmetry=False, judge=False)
        assert a.objective == pytest.approx(b.objective, rel=1e-9)
        assert a.objective == pytest.approx(brute_force(graph, topo, plan, model), rel=1e-7)


def test_consecutive_layout_and_value():
    graph, topo, plan = make_instance(3, 3, 2, 6)
    for order, expect in (("stage-major", [(0, 1), (2, 3), (4, 5)]),
                          ("replica-major", [(0, 3), (1, 4), (2, 5)])):
        res = registry.run("map", "consecutive", graph, topo, plan=plan, model="p2p",
                           order=order)
        assert [st.devices for st in res.plan.stages] == expect
        assert res.plan.status == "feasible"
        # the mapping search's arrays and the stage-time model agree (two code paths)
        assert evaluate(res.plan, graph, topo, "max-stage")[1] == pytest.approx(
            res.objective, rel=1e-12)
        opt = registry.run("map", "optimal", graph, topo, plan=plan, model="p2p",
                           judge=False)
        assert opt.objective <= res.objective * (1 + 1e-12)


def test_recorded_options_leave_out_the_plan_and_name_the_model():
    graph, topo, plan = make_instance(1, 2, 2, 4)
    res = registry.run("map", "optimal", graph, topo, plan=plan, seed=4)
    assert "plan" not in res.plan.options
    assert res.plan.options["model"] == "overlap"  # auto: the simulator's view
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
    res = registry.run("map", "optimal", graph, topo, plan=plan, model="p2p", time_limit=0.5,
                       judge=False)
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
@pytest.mark.parametrize("model", ["overlap", "p2p", "allreduce"])
def test_worker_processes_find_the_same_optimum(model):
    graph, topo, plan = make_instance(11, 4, 2, 8)
    expect = brute_force(graph, topo, plan, model)
    res = registry.run("map", "optimal", graph, topo, plan=plan, model=model, workers=2,
                       judge=False)
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

    topo = build(kind, shape=shape, link_bandwidth=1e9, hop_latency=2e-4, flops=1e12)
    for seed, (s, r) in enumerate([(3, 2), (2, 3), (4, 2)]):
        graph, _, plan = make_instance(seed, s, r, topo.num_devices)
        expect = brute_force(graph, topo, plan, model)
        # without contention, the grid's whole automorphism group prunes (contention keeps
        # only the symmetries that map routes onto routes: tests/mapping/test_contention.py)
        res = registry.run("map", "optimal", graph, topo, plan=plan, model=model, judge=False,
                           contention=False)
        assert res.plan.status == "optimal"
        assert res.objective == pytest.approx(expect, rel=1e-7)
