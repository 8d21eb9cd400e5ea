"""Iterative refinement (Parmesan 4.3): incremental stage times equal the cost model."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardplan.cost._max_stage import PipelineSettings, pipeline_stage_seconds
from shardplan.generate import layered
from shardplan.partition._pipeline_common import is_monotone, placement
from shardplan.partition._pipeline_refine import StageState, refine
from shardplan.topology import build


def _setup(seed: int, k: int, r: int):
    g = layered(num_nodes=40, width=5, seed=seed, skip_probability=0.3)
    topo = build("hierarchical", shape=(2, 4), level_names=("box", "device"),
                 bandwidth=(1e9, 1e10), latency=(1e-5, 1e-6), memory_bytes=2e10)
    s = PipelineSettings(microbatches=3)
    n = g.num_nodes
    a = np.empty(n, dtype=np.int64)
    a[g.topological_order] = np.arange(n) * k // n
    return g, topo, s, a, placement(k, r)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 1000), k=st.integers(2, 4), r=st.integers(1, 2),
       picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=25))
def test_incremental_state_matches_cost_model(seed, k, r, picks):
    g, topo, s, a, dev = _setup(seed, k, r)
    model = s.model(g, topo)
    state = StageState(g, model, s, a, dev)
    for p in picks:
        cands = state.candidates()
        if not cands:
            break
        v, t = cands[p % len(cands)]
        state.move(v, t)
        assert is_monotone(g, state.a)
        assert len(set(state.a.tolist())) == k
        want, _, _ = pipeline_stage_seconds(model, state.a, dev, s)
        got = state.stage_seconds()
        assert np.allclose(np.nan_to_num(got, posinf=-1), np.nan_to_num(want, posinf=-1),
                           rtol=1e-9, atol=0)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 1000), k=st.integers(2, 4))
def test_refinement_never_worsens(seed, k):
    g, topo, s, a, dev = _setup(seed, k, 1)
    model = s.model(g, topo)
    before = pipeline_stage_seconds(model, a, dev, s)[0].max()
    state = StageState(g, model, s, a, dev)
    stats = refine(state, 30)
    after = pipeline_stage_seconds(model, state.a, dev, s)[0].max()
    assert after <= before * (1 + 1e-12)
    assert np.isclose(stats["refine_end"], after, rtol=1e-12)
    assert is_monotone(g, state.a)
