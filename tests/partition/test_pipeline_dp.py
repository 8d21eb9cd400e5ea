"""The fronted-subgraph DP (Parmesan eq. 2) against exhaustive enumeration and chain DPs."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardplan import registry
from shardplan.cost import CostModel, stage_times
from shardplan.ir import ExecutionSettings, Graph
from shardplan.partition._pipeline_dp import (
    StageContext,
    Units,
    enumerate_fronted,
    fronted_dp,
    surrogate_seconds,
)
from shardplan.topology import build

BW, LAT = 1e9, 1e-4
RATE = 1e12


def _topology(num_devices: int, memory: float = 1e12):
    return build("flat", num_devices=num_devices, bandwidth=BW, latency=LAT,
                 memory_bytes=memory, flops=RATE)


@st.composite
def dags(draw, max_nodes: int = 12):
    n = draw(st.integers(2, max_nodes))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    keep = draw(st.lists(st.booleans(), min_size=len(pairs), max_size=len(pairs)))
    edges = [p for p, k in zip(pairs, keep, strict=True) if k and p[1] - p[0] <= 3]
    flops = draw(st.lists(st.integers(1, 9), min_size=n, max_size=n))
    out = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    params = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    return Graph.from_arrays(
        name="g", fwd_flops=[f * 1e8 for f in flops], src=[e[0] for e in edges],
        dst=[e[1] for e in edges], output_bytes=[o * 10**5 for o in out],
        param_bytes=[p * 10**8 for p in params])


def _stage_time(g: Graph, nodes: set[int], position: int, num_stages: int, r: int,
                microbatches: int, memory: float, sends: str, view: str = "eq3") -> float:
    """Surrogate stage time, written from the definitions (not from the module)."""
    comp = sum(g.fwd_flops[v] + g.bwd_flops[v] for v in nodes) / RATE / r
    tensors: dict[int, float] = {}
    for u, v, b in zip(g.src.tolist(), g.dst.tolist(), g.edge_bytes.tolist(), strict=True):
        if b > 0 and ((u in nodes) != (v in nodes)):
            tensors[u] = max(tensors.get(u, 0.0), float(b))
    # a producer's tensor size is the largest bytes over all its out-edges
    for u in list(tensors):
        tensors[u] = float(max(b for s, b in zip(g.src.tolist(), g.edge_bytes.tolist(), strict=True)
                               if s == u))
    # a sent tensor: once per consumer outside the stage, at most once per later stage
    times = {u: 1 for u in tensors if u not in nodes}
    for u in tensors:
        if u in nodes:
            outside = {v for s, v in zip(g.src.tolist(), g.dst.tolist(), strict=True)
                       if s == u and v not in nodes}
            times[u] = min(len(outside) if sends == "bounded" else 1,
                           num_stages - 1 - position)
    sends_t = sum(times[u] * (LAT + b / r / BW) for u, b in tensors.items())
    received = sum(b for u, b in tensors.items() if u not in nodes)
    flight = min(num_stages - position, microbatches)
    mem = sum(3 * g.param_bytes[v]  # params, gradients, momentum
               + g.output_bytes[v] * flight / r for v in nodes) \
        + flight * received / r
    if view == "eq3":  # everything sent and received, in both passes
        t = comp + 2 * sends_t
    else:  # overlap: compute or sends, plus the ring all-reduce over M + S - 1 steps
        params = sum(float(g.param_bytes[v]) for v in nodes)
        ar = 2 * (r - 1) * (LAT + params / r / BW) if r > 1 and params > 0 else 0.0
        t = max(comp, sends_t) + ar / (microbatches + num_stages - 1)
    return t if mem <= memory else math.inf


def _brute_force(g: Graph, num_stages: int, r: int, microbatches: int, memory: float,
                 sends: str, view: str = "eq3") -> float:
    """Every ordered convex partition: monotone maps onto 0..S-1, all stages non-empty."""
    n = g.num_nodes
    preds = [[] for _ in range(n)]
    for u, v in zip(g.src.tolist(), g.dst.tolist(), strict=True):
        preds[v].append(u)
    order = [int(v) for v in g.topological_order]
    best = math.inf
    a = [0] * n

    def rec(i: int) -> None:
        nonlocal best
        if i == n:
            if len(set(a)) < num_stages:
                return
            worst = max(_stage_time(g, {v for v in range(n) if a[v] == s}, s, num_stages, r,
                                    microbatches, memory, sends, view)
                        for s in range(num_stages))
            best = min(best, worst)
            return
        v = order[i]
        lo = max((a[u] for u in preds[v]), default=0)
        for s in range(lo, num_stages):
            a[v] = s
            rec(i + 1)

    rec(0)
    return best


def _dp(g: Graph, num_stages: int, r: int, microbatches: int, memory: float, sends: str,
        view: str = "eq3"):
    topo = _topology(num_stages * r, memory)
    s = ExecutionSettings(optimizer="sgd-momentum", microbatches=microbatches)
    ctx = StageContext.build(CostModel.from_settings(g, topo, s), topo, s, num_stages, r, view)
    units = Units.from_assignment(g, np.arange(g.num_nodes), g.num_nodes)
    fronted = enumerate_fronted(units.preds, 10**6)
    assert fronted is not None
    value, stage_of = fronted_dp(units, ctx, fronted, sends=sends)
    return value, stage_of, units, ctx


@settings(max_examples=60, deadline=None)
@given(g=dags(), num_stages=st.integers(1, 3), r=st.integers(1, 2),
       microbatches=st.integers(1, 3),
       memory=st.sampled_from([4e8, 7e8, 1.2e9, 1e12]),
       sends=st.sampled_from(["once", "bounded"]), view=st.sampled_from(["eq3", "overlap"]))
def test_dp_equals_exhaustive_enumeration(g, num_stages, r, microbatches, memory, sends, view):
    if num_stages > g.num_nodes:
        num_stages = g.num_nodes
    want = _brute_force(g, num_stages, r, microbatches, memory, sends, view)
    value, stage_of, units, ctx = _dp(g, num_stages, r, microbatches, memory, sends, view)
    if math.isinf(want):
        assert math.isinf(value)
        return
    assert math.isclose(value, want, rel_tol=1e-9)
    # the returned partition is monotone, uses every stage and achieves the value
    assert np.all(stage_of[g.src] <= stage_of[g.dst])
    assert set(stage_of.tolist()) == set(range(num_stages))
    assert math.isclose(surrogate_seconds(units, ctx, stage_of, sends), value, rel_tol=1e-9)


def _chain(weights, out):
    n = len(weights)
    return Graph.from_arrays(name="chain", fwd_flops=[w * 1e8 for w in weights],
                             src=list(range(n - 1)), dst=list(range(1, n)),
                             output_bytes=[o * 10**5 for o in out])


def _linear_partition(g: Graph, num_stages: int) -> float:
    """The classic O(n^2 S) linear-partition DP over a chain (segments [i, j))."""
    n = g.num_nodes
    work = (g.fwd_flops + g.bwd_flops) / RATE
    ob = g.output_bytes.astype(float)

    def seg(i: int, j: int) -> float:
        t = work[i:j].sum()
        if i > 0 and ob[i - 1] > 0:
            t += 2 * (LAT + ob[i - 1] / BW)
        if j < n and ob[j - 1] > 0:
            t += 2 * (LAT + ob[j - 1] / BW)
        return t

    inf = math.inf
    table = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    table[0][0] = 0.0
    for s in range(1, num_stages + 1):
        for j in range(1, n + 1):
            table[s][j] = min((max(table[s - 1][i], seg(i, j)) for i in range(j)), default=inf)
    return table[num_stages][n]


@settings(max_examples=25, deadline=None)
@given(data=st.data(), n=st.integers(2, 30), num_stages=st.integers(1, 5))
def test_chain_parmesan_equals_linear_partition(data, n, num_stages):
    num_stages = min(num_stages, n)
    weights = data.draw(st.lists(st.integers(1, 20), min_size=n, max_size=n))
    out = data.draw(st.lists(st.integers(0, 30), min_size=n, max_size=n))
    g = _chain(weights, out)
    topo = _topology(num_stages)
    res = registry.run("partition", "parmesan", g, topo, stages=num_stages, replicas=1,
                       optimizer="sgd", objective="eq3")
    want = _linear_partition(g, num_stages)
    assert math.isclose(res.plan.objective.value, want, rel_tol=1e-9)
    assert res.plan.status == "optimal"
    assert res.stats["mode"] == "exact"


def test_fronted_count_of_a_chain_and_a_diamond(diamond):
    chain = _chain([1] * 6, [1] * 6)
    units = Units.from_assignment(chain, np.arange(6), 6)
    masks, sizes = enumerate_fronted(units.preds, 100)
    assert masks.shape == (7, 6)  # Theorem 4.5: |V| + 1 with the empty set
    assert sizes.tolist() == list(range(7))
    units = Units.from_assignment(diamond, np.arange(4), 4)
    masks, _ = enumerate_fronted(units.preds, 100)
    assert masks.shape[0] == 6  # {}, {0}, {0,1}, {0,2}, {0,1,2}, all
    assert enumerate_fronted(units.preds, 3) is None


@settings(max_examples=15, deadline=None)
@given(g=dags(max_nodes=9), num_stages=st.integers(2, 3))
def test_true_optimum_lies_between_the_surrogates(g, num_stages):
    """On a flat topology the cost model's optimum (brute force) is bracketed by the two
    surrogate optima, and parmesan's plan is never worse than the bounded one."""
    from shardplan.partition._pipeline_common import placement

    num_stages = min(num_stages, g.num_nodes)
    lo = _brute_force(g, num_stages, 1, 2, 1e12, "once")
    hi = _brute_force(g, num_stages, 1, 2, 1e12, "bounded")
    topo = _topology(num_stages)
    s = ExecutionSettings(optimizer="sgd-momentum", microbatches=2)
    model = CostModel.from_settings(g, topo, s)
    n = g.num_nodes
    preds = [[] for _ in range(n)]
    for u, v in zip(g.src.tolist(), g.dst.tolist(), strict=True):
        preds[v].append(u)
    best = math.inf
    a = np.zeros(n, dtype=np.int64)
    order = [int(v) for v in g.topological_order]

    def rec(i: int) -> None:
        nonlocal best
        if i == n:
            if len(set(a.tolist())) == num_stages:
                t = stage_times(model, a, placement(num_stages, 1), num_stages=num_stages,
                                order=range(num_stages)).value("eq3")
                best = min(best, float(t))
            return
        v = order[i]
        for k in range(max((int(a[u]) for u in preds[v]), default=0), num_stages):
            a[v] = k
            rec(i + 1)

    rec(0)
    assert lo <= best * (1 + 1e-9) and best <= hi * (1 + 1e-9)
    res = registry.run("partition", "parmesan", g, topo, stages=num_stages, replicas=1,
                       optimizer="sgd-momentum", microbatches=2, objective="eq3")
    assert best * (1 - 1e-9) <= res.plan.objective.value <= hi * (1 + 1e-9)
    if res.plan.status == "optimal":
        assert math.isclose(res.plan.objective.value, best, rel_tol=1e-9)
