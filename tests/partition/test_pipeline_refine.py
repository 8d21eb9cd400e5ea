"""Iterative refinement (Parmesan 4.3): incremental stage times equal the cost model."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardplan.cost import CostModel, stage_times
from shardplan.generate import layered
from shardplan.ir import ExecutionSettings
from shardplan.partition._pipeline_common import is_monotone, placement
from shardplan.partition._pipeline_refine import StageState, refine
from shardplan.topology import build


def _setup(seed: int, k: int, r: int, **settings):
    g = layered(num_nodes=40, width=5, seed=seed, skip_probability=0.3)
    topo = build("hierarchical", shape=(2, 4), level_names=("box", "device"),
                 bandwidth=(1e9, 1e10), latency=(1e-5, 1e-6), memory_bytes=2e10)
    s = ExecutionSettings(microbatches=3, **settings)
    n = g.num_nodes
    a = np.empty(n, dtype=np.int64)
    a[g.topological_order] = np.arange(n) * k // n
    return g, topo, s, a, placement(k, r)


def _want(model, a, dev, view):
    k = dev.shape[0]
    return stage_times(model, a, dev, num_stages=k, order=range(k)).stage_seconds(view)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 1000), k=st.integers(2, 4), r=st.integers(1, 2),
       picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=25),
       view=st.sampled_from(["overlap", "eq3"]), recompute=st.booleans(),
       batch=st.sampled_from([None, 3]))
def test_incremental_state_matches_cost_model(seed, k, r, picks, view, recompute, batch):
    g, topo, s, a, dev = _setup(seed, k, r, recompute=recompute, microbatch_size=batch)
    model = CostModel.from_settings(g, topo, s)
    state = StageState(g, model, model.settings, a, dev, view)
    for p in picks:
        cands = state.candidates()
        if not cands:
            break
        v, t = cands[p % len(cands)]
        state.move(v, t)
        assert is_monotone(g, state.a)
        assert len(set(state.a.tolist())) == k
        want = _want(model, state.a, dev, view)
        got = state.stage_seconds()
        assert np.allclose(np.nan_to_num(got, posinf=-1), np.nan_to_num(want, posinf=-1),
                           rtol=1e-9, atol=0)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 1000), k=st.integers(2, 4), view=st.sampled_from(["overlap", "eq3"]))
def test_refinement_never_worsens(seed, k, view):
    g, topo, s, a, dev = _setup(seed, k, 1)
    model = CostModel.from_settings(g, topo, s)
    before = _want(model, a, dev, view).max()
    state = StageState(g, model, model.settings, a, dev, view)
    stats = refine(state, 30)
    after = _want(model, state.a, dev, view).max()
    assert after <= before * (1 + 1e-12)
    assert np.isclose(stats["refine_end"], after, rtol=1e-12)
    assert is_monotone(g, state.a)
