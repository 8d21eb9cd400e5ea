"""The closed-form ring collective (shardplan.simulate._ring) against the stepwise one."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardplan import partition
from shardplan.errors import ShardplanError
from shardplan.generate import layered
from shardplan.ir import Device, Topology
from shardplan.simulate import _engine, simulate
from shardplan.simulate._ring import ring_arrivals
from shardplan.topology import build


def _stepwise(monkeypatch: pytest.MonkeyPatch, *args, **kw):
    with monkeypatch.context() as m:
        m.setattr(_engine._Sim, "ring_private", lambda self, s: False)
        return simulate(*args, **kw)


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = _engine._Sim.ring_closed

    def spy(self, s, key, steps_left):
        calls.append(steps_left)
        return real(self, s, key, steps_left)

    monkeypatch.setattr(_engine._Sim, "ring_closed", spy)
    return calls


def _random_topology(rng: np.random.Generator, num: int) -> Topology:
    bw = rng.uniform(1e8, 1e10, (num, num))
    lat = rng.uniform(0.0, 1e-4, (num, num))
    np.fill_diagonal(bw, 0)
    np.fill_diagonal(lat, 0)
    return Topology(name="rand", devices=tuple(Device(f"d{i}", 16e9, 1e11)
                                               for i in range(num)),
                    bandwidth=bw, latency=lat)


def _same(a, b) -> None:
    assert a.iteration_seconds == pytest.approx(b.iteration_seconds, rel=1e-9)
    assert a.pipeline_seconds == pytest.approx(b.pipeline_seconds, rel=1e-9)
    assert np.allclose(a.allreduce_seconds, b.allreduce_seconds, rtol=1e-9, atol=0.0,
                       equal_nan=True)
    assert len(a.intervals) == len(b.intervals)
    ka = sorted((iv.device, iv.kind, iv.stage, iv.microbatch, iv.start, iv.end)
                for iv in a.intervals)
    kb = sorted((iv.device, iv.kind, iv.stage, iv.microbatch, iv.start, iv.end)
                for iv in b.intervals)
    for x, y in zip(ka, kb, strict=True):
        assert x[:4] == y[:4]
        assert x[4] == pytest.approx(y[4], rel=1e-9, abs=1e-15)
        assert x[5] == pytest.approx(y[5], rel=1e-9, abs=1e-15)


def test_ring_arrivals_hand_computed() -> None:
    """Two replicas, links of 1 s latency and 2 B/s and 0.5 s and 4 B/s, 4 B chunks:
    steps take max(1 + 2, 0.5 + 1) = 3 s."""
    out = ring_arrivals(10.0, np.array([1.0, 0.5]), np.array([2.0, 4.0]), 4.0, 2)
    assert out.tolist() == [10.0, 13.0, 16.0]
    assert ring_arrivals(1.0, np.array([1.0, 0.5]), np.array([2.0, 4.0]), 0.0, 3).tolist() \
        == [1.0, 2.0, 3.0, 4.0]
    assert ring_arrivals(2.0, np.array([1.0]), np.array([1.0]), 1.0, 0).tolist() == [2.0]


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([(1, 2), (2, 2), (2, 3), (3, 2), (1, 4)]),
       st.integers(1, 5), st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b"]),
       st.sampled_from(["end", "bucketed", "sharded"]), st.booleans())
def test_closed_form_equals_stepwise(seed: int, sr: tuple[int, int], m: int, schedule: str,
                                     sync: str, overlap: bool) -> None:
    """Random graphs, random links (every pair its own latency and bandwidth), every
    schedule, gradient sync and overlap setting: the simulation with closed-form rings is
    the stepwise one (times, all-reduce spans, every interval)."""
    s, r = sr
    if schedule == "interleaved-1f1b" and s % 2:
        s *= 2
    rng = np.random.default_rng(seed)
    g = layered(int(rng.integers(4 * s, 12 * s)), width=int(rng.integers(1, 5)), seed=seed,
                skip_probability=0.2, params_per_weight=1e4)
    topo = _random_topology(rng, s * r)
    plan = partition(g, topo, algorithm="uniform", stages=s, replicas=r)
    kw = dict(schedule=schedule, microbatches=m, gradient_sync=sync, overlap=overlap,
              bucket_bytes=int(rng.integers(1, 4)) * 100_000)
    if schedule == "interleaved-1f1b":
        kw["virtual_stages"] = 2
    with pytest.MonkeyPatch.context() as monkeypatch:
        calls = _counting(monkeypatch)
        try:
            fast = simulate(plan, g, topo, **kw)
        except ShardplanError as exc:  # (a schedule that cannot run fails alike)
            fast = str(exc)
    with pytest.MonkeyPatch.context() as monkeypatch:
        try:
            slow = _stepwise(monkeypatch, plan, g, topo, **kw)
        except ShardplanError as exc:
            slow = str(exc)
    if isinstance(fast, str) or isinstance(slow, str):
        assert fast == slow
        return
    _same(fast, slow)
    if sync == "end" and r > 1 and schedule != "interleaved-1f1b":
        assert calls, "the closed form was never taken"


def test_closed_form_on_a_hierarchy_with_many_replicas(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """Two stages of 16 replicas across boxes: nearly every ring step in closed form, the
    same result as stepwise."""
    g = layered(201, seed=1, params_per_weight=1e4)
    topo = build("hierarchical", shape=(4, 8))
    plan = partition(g, topo, algorithm="uniform", stages=2, replicas=16)
    calls = _counting(monkeypatch)
    fast = simulate(plan, g, topo, microbatches=4)
    slow = _stepwise(monkeypatch, plan, g, topo, microbatches=4)
    _same(fast, slow)
    assert sum(calls) >= 2 * 2 * 15 - 2  # at most the first step of each ring stepwise
    quiet = simulate(plan, g, topo, microbatches=4, timeline=False)
    assert quiet.iteration_seconds == fast.iteration_seconds


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(["mesh2d", "torus2d", "dgx1"]),
       st.sampled_from([(1, 8), (2, 4), (4, 2)]), st.integers(1, 4),
       st.sampled_from(["gpipe", "1f1b"]), st.sampled_from(["end", "bucketed", "sharded"]),
       st.booleans())
def test_closed_form_on_routed_links_equals_stepwise(seed: int, kind: str, sr: tuple[int, int],
                                                     m: int, schedule: str, sync: str,
                                                     overlap: bool) -> None:
    """Meshes, tori and DGX-1's physical links (routes share links): where the closed form
    is taken (disjoint ring paths, nothing else left to run), the result is the stepwise
    one."""
    s, r = sr
    rng = np.random.default_rng(seed)
    g = layered(int(rng.integers(4 * s, 12 * s)), width=int(rng.integers(1, 4)), seed=seed,
                skip_probability=0.2, params_per_weight=1e4)
    topo = build(kind, boxes=1) if kind == "dgx1" else \
        build(kind, shape=(2, 4) if kind == "mesh2d" else (4, 4))
    r = topo.num_devices // s
    plan = partition(g, topo, algorithm="uniform", stages=s, replicas=r)
    kw = dict(schedule=schedule, microbatches=m, gradient_sync=sync, overlap=overlap,
              bucket_bytes=int(rng.integers(1, 4)) * 100_000)
    with pytest.MonkeyPatch.context() as monkeypatch:
        calls = _counting(monkeypatch)
        fast = simulate(plan, g, topo, **kw)
    with pytest.MonkeyPatch.context() as monkeypatch:
        slow = _stepwise(monkeypatch, plan, g, topo, **kw)
    _same(fast, slow)
    if s == 1 and sync == "end" and kind != "dgx1":  # one ring, alone, neighbours adjacent
        assert calls, "the closed form was never taken"


def test_routed_rings_whose_paths_cross_stay_stepwise(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ring on a line of 8 devices in the order 0 4 1 5 2 6 3 7: its paths share links,
    so it runs step by step; in order 0..7 the paths are disjoint and it is closed."""
    from shardplan.ir import Objective, Plan, Stage

    g = layered(40, seed=2, params_per_weight=1e4)
    topo = build("mesh2d", shape=(1, 8))

    def dp(order):
        return Plan(g.name, topo.name, "hand", (Stage(tuple(range(g.num_nodes)), order),),
                    Objective("x", 0.0))

    calls = _counting(monkeypatch)
    crossed = simulate(dp((0, 4, 1, 5, 2, 6, 3, 7)), g, topo, microbatches=2)
    assert calls == []
    with pytest.MonkeyPatch.context() as inner:
        _same(crossed, _stepwise(inner, dp((0, 4, 1, 5, 2, 6, 3, 7)), g, topo,
                                 microbatches=2))
    line = simulate(dp(tuple(range(8))), g, topo, microbatches=2)
    assert calls
    assert line.iteration_seconds < crossed.iteration_seconds


@pytest.mark.parametrize("m", [1, 2, 4])
def test_two_rings_that_cross_each_other(monkeypatch: pytest.MonkeyPatch, m: int) -> None:
    """Two stages on a line of 8, on the even and the odd devices: each ring's paths are
    disjoint, but the two rings share links, so neither may be closed while the other runs;
    the result is the stepwise one."""
    from shardplan.ir import Objective, Plan, Stage

    g = layered(40, seed=5, params_per_weight=1e4)
    topo = build("mesh2d", shape=(1, 8))
    order = g.topological_order.tolist()
    plan = Plan(g.name, topo.name, "hand",
                (Stage(tuple(order[:20]), (0, 2, 4, 6)), Stage(tuple(order[20:]), (1, 3, 5, 7))),
                Objective("x", 0.0))
    fast = simulate(plan, g, topo, microbatches=m)
    with pytest.MonkeyPatch.context() as inner:
        _same(fast, _stepwise(inner, plan, g, topo, microbatches=m))
