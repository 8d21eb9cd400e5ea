"""The pipeline partitioners' lower bound with the gradient all-reduce
(:func:`shardplan.partition._pipeline_common.pipeline_lower_bound`): pinned by hand, and never
above the exact optimum found by enumerating every monotone split of small graphs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardplan import registry
from shardplan.cost import CostModel, stage_times
from shardplan.generate import layered
from shardplan.ir import Device, ExecutionSettings, Graph, Topology
from shardplan.partition._pipeline_common import pipeline_lower_bound, placement
from shardplan.topology import build


def _two_nodes() -> Graph:
    # forward 1 and 3 TFLOP (backward twice): 3 s and 9 s at 1e12 FLOP/s; node 1 holds
    # 4e8 parameter bytes, its output 1 kB
    return Graph.from_arrays(name="g", fwd_flops=[1e12, 3e12], src=[0], dst=[1],
                             param_bytes=[0, 400_000_000], output_bytes=[1000, 0])


@pytest.mark.parametrize("algorithm", ["parmesan", "uniform", "pipedream-sequence"])
def test_allreduce_bound_by_hand_and_tight(algorithm: str) -> None:
    """2 stages x 2 replicas, M = 4 (F = M + S - 1 = 5 steps), links of 1e-5 s and 1e9 B/s.
    Node 1's stage computes 9 / 2 = 4.5 s per replica and all-reduces 4e8 B over 2
    replicas: 2 steps of 1e-5 + 2e8 / 1e9 s, 0.40002 s, a fifth of it per step. The only
    split reaches the bound: 4.5 + 0.080004 s (the average over stages is (12 / 2 +
    0.080004) / 2, lower)."""
    g = _two_nodes()
    t = build("flat", num_devices=4, flops=1e12, bandwidth=1e9, latency=1e-5)
    plan = registry.run("partition", algorithm, g, t, stages=2, replicas=2,
                        microbatches=4).plan
    assert plan.objective.lower_bound == pytest.approx(4.5 + 0.40002 / 5, rel=1e-11)
    assert plan.objective.value == pytest.approx(plan.objective.lower_bound, rel=1e-11)
    assert plan.objective.lower_bound <= plan.objective.value
    eq3 = registry.run("partition", algorithm, g, t, stages=2, replicas=2, microbatches=4,
                       objective="eq3").plan
    assert eq3.objective.lower_bound == pytest.approx(4.5, rel=1e-12)  # no all-reduce term


def test_allreduce_bound_averages_over_stages() -> None:
    """Four equal nodes of 3 s and 1e9 B each on 2 x 2: the average over stages,
    (12 / 2 + 2 (1e-5 + 4e9 / 2e9) / 5) / 2 = 3.400002 s, beats the largest node's
    1.5 + 2 (1e-5 + 1e9 / 2e9) / 5 = 1.700004 s and the work bound 3 s."""
    g = Graph.from_arrays(name="g", fwd_flops=[1e12] * 4, src=[0, 1, 2], dst=[1, 2, 3],
                          param_bytes=[1_000_000_000] * 4)
    t = build("flat", num_devices=4, flops=1e12, bandwidth=1e9, latency=1e-5)
    model = CostModel.from_settings(g, t, ExecutionSettings(microbatches=4))
    assert pipeline_lower_bound(model, 2, 2) == pytest.approx(3.400002, rel=1e-11)
    assert pipeline_lower_bound(model, 2, 2, "eq3") == pytest.approx(3.0, rel=1e-12)
    assert pipeline_lower_bound(model, 2, 1) == pytest.approx(6.0, rel=1e-12)  # no ring


def test_measured_curves_drop_the_ring_term() -> None:
    g = _two_nodes()
    t = build("flat", num_devices=4, flops=1e12, bandwidth=1e9, latency=1e-5)
    d = t.to_dict()
    d["collectives"] = {"allreduce": {"2": [[1.0, 1e-6], [1e9, 1e-3]]}}
    measured = Topology.from_dict(d)
    model = CostModel.from_settings(g, measured, ExecutionSettings(microbatches=4))
    assert pipeline_lower_bound(model, 2, 2) == pytest.approx(4.5, rel=1e-12)


def _monotone_splits(g: Graph, k: int):
    """Every assignment of the nodes to stages 0..k-1, monotone along edges, every stage
    used (node ids are a topological order here)."""
    preds = [[] for _ in range(g.num_nodes)]
    for u, v in zip(g.src.tolist(), g.dst.tolist(), strict=True):
        preds[v].append(u)
    a = np.zeros(g.num_nodes, dtype=np.int64)

    def rec(v: int):
        if v == g.num_nodes:
            if len(set(a.tolist())) == k:
                yield a.copy()
            return
        lo = max((int(a[u]) for u in preds[v]), default=0)
        for s in range(lo, k):
            a[v] = s
            yield from rec(v + 1)

    yield from rec(0)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 7), k=st.integers(1, 3),
       r=st.integers(1, 3), view=st.sampled_from(["overlap", "eq3"]),
       sync=st.sampled_from(["end", "bucketed", "sharded"]), m=st.integers(1, 6),
       recompute=st.booleans())
def test_never_above_the_exact_optimum(seed, n, k, r, view, sync, m, recompute) -> None:
    """On random small graphs and random links (every pair its own latency and bandwidth,
    devices of two speeds), the bound is at most the best value over every monotone split
    into k stages x r replicas on the consecutive placement."""
    if k > n:
        k = n
    rng = np.random.default_rng(seed)
    g = layered(n, width=int(rng.integers(1, 4)), seed=seed, skip_probability=0.3,
                params_per_weight=float(rng.choice([0.0, 1e4, 1e7])))
    num = k * r
    bw = rng.uniform(1e8, 1e11, (num, num))
    lat = rng.uniform(0.0, 1e-4, (num, num))
    np.fill_diagonal(bw, 0)
    np.fill_diagonal(lat, 0)
    flops = rng.choice([1e10, 3e10], num)
    t = Topology(name="rand", devices=tuple(Device(f"d{i}", 1e15, float(f))
                                            for i, f in enumerate(flops)),
                 bandwidth=bw, latency=lat)
    s = ExecutionSettings(microbatches=m, gradient_sync=sync, recompute=recompute)
    model = CostModel.from_settings(g, t, s)
    dev = placement(k, r)
    best = min(stage_times(model, a, dev, num_stages=k, order=range(k)).value(view)
               for a in _monotone_splits(g, k))
    bound = pipeline_lower_bound(model, k, r, view)
    assert bound <= best * (1 + 1e-12)  # (the work sums round differently)
    assert bound >= model.lower_bound_seconds(num, replicas=r) * (1 - 1e-12) or \
        len(set(flops.tolist())) > 1
