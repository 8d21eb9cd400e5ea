"""Boundary descent: block moves of stage boundaries along a topological order."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardplan import registry
from shardplan.cost import CostModel, stage_times
from shardplan.errors import ShardplanError
from shardplan.generate import chain, layered
from shardplan.ir import ExecutionSettings, Graph
from shardplan.partition._pipeline_common import is_monotone, placement
from shardplan.partition._pipeline_descent import descend
from shardplan.topology import build


def _topo():
    return build("hierarchical", shape=(2, 4), level_names=("box", "device"),
                 bandwidth=(1e9, 1e10), latency=(1e-5, 1e-6), memory_bytes=2e10)


def _value(model, a, dev, view):
    k = dev.shape[0]
    return stage_times(model, a, dev, num_stages=k, order=range(k)).value(view)


def _random_topological_order(g, seed):
    """Kahn's algorithm taking a random ready node each time: a split contiguous in it is
    monotone but, unlike one of the graph's own order, not contiguous in node ids."""
    rng = np.random.default_rng(seed)
    indeg = np.bincount(g.dst, minlength=g.num_nodes)
    succ = [[] for _ in range(g.num_nodes)]
    for u, v in zip(g.src.tolist(), g.dst.tolist(), strict=True):
        succ[u].append(v)
    ready = [v for v in range(g.num_nodes) if indeg[v] == 0]
    out = []
    while ready:
        u = ready.pop(int(rng.integers(len(ready))))
        out.append(u)
        for v in succ[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    return np.array(out)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 1000), k=st.integers(2, 4), r=st.integers(1, 2),
       cuts=st.lists(st.floats(0.0, 1.0), min_size=3, max_size=3),
       view=st.sampled_from(["overlap", "eq3", "p2p"]))
def test_descent_keeps_a_valid_split_and_never_worsens(seed, k, r, cuts, view):
    g = layered(num_nodes=40, width=5, seed=seed, skip_probability=0.3)
    topo = _topo()
    model = CostModel.from_settings(g, topo, ExecutionSettings(microbatches=3))
    n = g.num_nodes
    # a lopsided contiguous split of the topological order (every stage non-empty)
    b = sorted({1 + int(c * (n - k)) for c in cuts[:k - 1]})
    while len(b) < k - 1:
        b.append(b[-1] + 1 if b else 1)
    b = sorted(b)
    for i in range(1, len(b)):
        b[i] = max(b[i], b[i - 1] + 1)
    a = np.empty(n, dtype=np.int64)
    a[_random_topological_order(g, seed)] = np.searchsorted(np.array(b), np.arange(n),
                                                            side="right")
    dev = placement(k, r)
    out, stats = descend(model, a, dev, view)
    assert is_monotone(g, out)
    assert np.bincount(out, minlength=k).min() >= 1 and out.max() == k - 1
    before, after = _value(model, a, dev, view), _value(model, out, dev, view)
    assert after <= before
    assert stats["descent_start"] == before and stats["descent_end"] == after
    if stats["descent_moves"] == 0:
        assert np.array_equal(out, a)


def test_descent_reaches_the_optimum_of_a_uniform_chain_from_the_worst_split():
    """All operators but one per later stage start in stage 0; the best split of a chain of
    equal operators (by enumeration of every split) is where descent ends."""
    g = chain(24, weight_low=5, weight_high=5)
    topo = build("flat", num_devices=3, bandwidth=1e10, latency=1e-5)
    model = CostModel.from_settings(g, topo, ExecutionSettings(microbatches=4))
    n, k = g.num_nodes, 3
    dev = placement(k, 1)
    order = g.topological_order
    a = np.zeros(n, dtype=np.int64)
    a[order[-2]], a[order[-1]] = 1, 2
    out, stats = descend(model, a, dev, "overlap")
    best = min(_value(model, _split(order, (i, j)), dev, "overlap")
               for i, j in itertools.combinations(range(1, n), 2))
    assert _value(model, out, dev, "overlap") == best
    assert stats["descent_moves"] > 0


def _split(order, bounds):
    a = np.empty(order.size, dtype=np.int64)
    a[order] = np.searchsorted(np.array(bounds), np.arange(order.size), side="right")
    return a


def test_descent_stops_at_the_deadline_with_the_split_it_has():
    g = layered(num_nodes=60, width=5, seed=1, skip_probability=0.2)
    model = CostModel.from_settings(g, _topo(), ExecutionSettings(microbatches=3))
    a = np.empty(g.num_nodes, dtype=np.int64)
    a[g.topological_order] = np.arange(g.num_nodes) * 3 // g.num_nodes
    out, stats = descend(model, a, placement(3, 2), "overlap", check=lambda: True)
    assert stats["descent_evaluated"] == 0 and np.array_equal(out, a)


def test_parmesan_descends_from_its_refined_starts_and_keeps_them():
    """The refined starts go through descent; a descended plan that moved is one more
    candidate the simulator judges, beside its start."""
    g = layered(num_nodes=300, width=10, seed=3, skip_probability=0.2)
    res = registry.run("partition", "parmesan", g, _topo(), seed=0, stages=4, replicas=2,
                       refine_steps=3)
    stats = res.plan.meta["search"]
    names = [k[len("descent_end_"):] for k in stats if k.startswith("descent_end_")]
    assert len(names) >= 3
    for name in names:
        assert stats[f"descent_end_{name}"] <= stats[f"descent_start_{name}"]
        assert name in stats["simulated"]
        assert (f"{name}_descent" in stats["simulated"]) == (stats[f"descent_moves_{name}"] > 0)
    assert any(stats[f"descent_end_{name}"] < stats[f"descent_start_{name}"] * (1 - 1e-9)
               for name in names)
    sims = [v for v in stats["simulated"].values() if v is not None]
    assert min(sims) == stats["simulated"][stats["kept"]]


def test_parmesan_without_descent_is_the_papers_flow():
    g = layered(num_nodes=300, width=10, seed=3, skip_probability=0.2)
    res = registry.run("partition", "parmesan", g, _topo(), seed=0, stages=4, replicas=2,
                       refine_steps=3, descent=False)
    stats = res.plan.meta["search"]
    assert not any(k.startswith("descent_") for k in stats)
    assert not any(name.endswith("_descent") for name in stats["simulated"])


def test_parmesan_descent_option_must_be_a_bool():
    g = layered(num_nodes=30, width=5, seed=3)
    with pytest.raises(ShardplanError, match="descent must be true or false"):
        registry.run("partition", "parmesan", g, _topo(), seed=0, stages=2, replicas=2,
                     descent="yes")


def _weighted_chain(flops):
    n = len(flops)
    return Graph.from_arrays(name="weighted-chain", fwd_flops=[float(f) for f in flops],
                             src=list(range(n - 1)), dst=list(range(1, n)),
                             output_bytes=[1000] * n)


@pytest.mark.parametrize("flops,k", [
    ([1] * 10, 2),                           # two stages: the last boundary alone moves
    ([200] + [10] * 11, 3),                  # the optimum keeps the heavy first node alone
    ([10] * 11 + [200], 3),                  # ... the heavy last node alone
    ([10] * 5 + [200] + [10] * 6, 3),        # ... the heavy middle node alone
    ([10] * 4 + [200] + [10] * 3 + [200] + [10] * 3, 4),
])
@pytest.mark.parametrize("start", ["first", "last"])
def test_descent_reaches_the_best_split_of_a_weighted_chain(flops, k, start):
    """From the split with every spare operator in the first (or last) stage, descent ends
    at the best of all contiguous splits (enumerated): stages of one heavy operator, at the
    ends and inside, and two stages, where only the last boundary moves."""
    g = _weighted_chain(np.array(flops) * 1e9)
    topo = build("flat", num_devices=k, bandwidth=1e10, latency=1e-6)
    model = CostModel.from_settings(g, topo, ExecutionSettings(microbatches=4))
    n = g.num_nodes
    dev = placement(k, 1)
    order = g.topological_order
    heavy = (n - k + 1,) + (1,) * (k - 1) if start == "first" else (1,) * (k - 1) + (
        n - k + 1,)
    a = np.repeat(np.arange(k), heavy)[np.argsort(order)]
    out, _ = descend(model, a, dev, "overlap")
    best = min(_value(model, _split(order, b), dev, "overlap")
               for b in itertools.combinations(range(1, n), k - 1))
    assert np.bincount(out, minlength=k).min() >= 1
    assert _value(model, out, dev, "overlap") == pytest.approx(best, rel=1e-12)
