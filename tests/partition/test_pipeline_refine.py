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


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 1000), k=st.integers(2, 4), r=st.integers(1, 4),
       sync=st.sampled_from(["end", "sharded"]), view=st.sampled_from(["overlap", "eq3"]))
def test_replica_classes_and_vectorised_comm_are_exact(seed, k, r, sync, view):
    """The vectorised send/receive seconds (one row per class of alike replicas) are
    :func:`uniform_comm`'s, bit for bit, and the stage times the cost model's, with up to
    4 replicas across boxes (several classes) and FSDP's gathers."""
    from shardplan.cost._pipeline import uniform_comm

    g, topo, s, a, _ = _setup(seed, k, r, gradient_sync=sync)
    topo8 = build("hierarchical", shape=(4, 4), bandwidth=(1e9, 1e10), latency=(1e-5, 1e-6),
                  memory_bytes=2e10)
    dev = placement(k, r)
    model = CostModel.from_settings(g, topo8, s)
    state = StageState(g, model, model.settings, a, dev, view)
    lat = topo8.latency
    lats = [lat[np.ix_(p, p)] * (p[:, None] != p[None, :]) for p in dev.T]
    ibs = [model.inverse_bandwidth[np.ix_(p, p)] for p in dev.T]
    want_s, want_r = uniform_comm(state.B, state.T, lats, ibs, r)
    got_s, got_r = state.comm()
    assert got_s.shape[0] <= r
    assert np.array_equal(np.sort(np.unique(want_s, axis=0), axis=0),
                          np.sort(np.unique(got_s, axis=0), axis=0))
    assert np.array_equal(want_s.max(axis=0), got_s.max(axis=0))
    assert np.array_equal(want_r.max(axis=0), got_r.max(axis=0))
    want = _want(model, a, dev, view)
    assert np.allclose(np.nan_to_num(state.stage_seconds(), posinf=-1),
                       np.nan_to_num(want, posinf=-1), rtol=1e-12, atol=0)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 1000), k=st.integers(2, 4), r=st.integers(1, 3),
       picks=st.lists(st.integers(0, 10**6), min_size=0, max_size=10),
       view=st.sampled_from(["overlap", "eq3"]), sync=st.sampled_from(["end", "sharded"]),
       chunk=st.sampled_from([1, 64, 1 << 21]))
def test_batch_evaluation_equals_moving(seed, k, r, picks, view, sync, chunk):
    """Every candidate's key evaluated in one batch (in chunks of any size) equals moving
    the operator, reading the key and moving it back; the state is left as it was."""
    r = min(r, 8 // k)  # the topology's 8 devices
    g, topo, s, a, dev = _setup(seed, k, r, gradient_sync=sync)
    model = CostModel.from_settings(g, topo, s)
    state = StageState(g, model, model.settings, a, dev, view)
    for p in picks:  # a random reachable state first
        cands = state.candidates()
        state.move(*cands[p % len(cands)])
    cands = state.candidates()
    before = (state.a.copy(), state.B.copy(), state.T.copy())
    got = state.evaluate(cands, chunk=chunk)
    assert np.array_equal(state.a, before[0]) and np.array_equal(state.B, before[1])
    assert np.array_equal(state.T, before[2])
    for (v, t), key in zip(cands, got, strict=True):
        src = int(state.a[v])
        state.move(v, t)
        want = state.key()
        state.move(v, src)
        assert key[1] == want[1]
        assert key[0] == want[0] or np.isclose(key[0], want[0], rtol=1e-12, atol=0)
