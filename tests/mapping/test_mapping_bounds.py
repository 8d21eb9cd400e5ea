"""Parmesan's mapping lower bounds (equations 8 and 9, section 5.2) pinned to exact values.

Tests elsewhere check that a bound never exceeds the optimum; a valid but looser bound
passes them and silently weakens the search's pruning and reported gaps. Here each bound is
computed by hand on small hand-made problems and pinned; a mapped plan's recorded bound is
at least the largest single-stage bound; a search cut short keeps at least the initial one.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from shardplan import registry
from shardplan.generate import layered
from shardplan.mapping._bounds import (
    allreduce_min,
    allreduce_node_bounds,
    lower_bound,
    p2p_node_bounds,
    ring_bottleneck,
)
from shardplan.mapping._search import solve
from shardplan.mapping._stage_time import MappingProblem, build_problem, stage_times
from shardplan.topology import build


def _problem(compute, stage_bytes, inv_bandwidth, *, replicas=1, param_bytes=None,
             view="p2p", latency=None) -> MappingProblem:
    compute = np.asarray(compute, dtype=float)
    s, d = compute.shape
    m = np.asarray(stage_bytes, dtype=float)
    ib = np.asarray(inv_bandwidth, dtype=float)
    lat = np.zeros((d, d)) if latency is None else np.asarray(latency, dtype=float)
    pair = (lat + lat.T, ib + ib.T) if view == "p2p" else (lat, ib)
    return MappingProblem(
        compute=compute, stage_bytes=m, tensors=(m > 0).astype(float), adjacent=m > 0,
        param_bytes=np.zeros(s) if param_bytes is None else np.asarray(param_bytes, float),
        num_replicas=replicas, latency=lat, inv_bandwidth=ib, device_flops=np.ones(d),
        fits=np.ones((s, d), dtype=bool), view=view, pair_latency=pair[0],
        pair_inv_bandwidth=pair[1], ar_weight={"p2p": 0.0, "allreduce": 1.0}[view])


def _chain3() -> MappingProblem:
    """Stages 0 - 1 - 2 (1 byte, then 2 bytes) on 3 devices; 1/B symmetric: 1 between
    devices 0 and 1, 2 between 0 and 2, 4 between 1 and 2 (a round trip pays twice)."""
    ib = [[0, 1, 2], [1, 0, 4], [2, 4, 0]]
    m = [[0, 1, 0], [1, 0, 2], [0, 2, 0]]
    return _problem([[1, 2, 3], [0.5, 0.5, 0.5], [1, 1, 1]], m, ib)


def test_p2p_bound_by_hand() -> None:
    # Round-trip costs per byte from device 0: 2 to device 1, 4 to device 2; from 1: 2, 8;
    # from 2: 4, 8. Stage 0 (one neighbour, 1 byte): its cheapest link. Stage 1 (1 and 2
    # bytes): the heavier neighbour on the cheaper link, e.g. on device 0: 2*2 + 1*4 = 8.
    bounds = p2p_node_bounds(_chain3())
    assert bounds.tolist() == [[3.0, 4.0, 7.0], [8.5, 12.5, 16.5], [5.0, 5.0, 9.0]]
    assert lower_bound(_chain3(), "p2p") == 8.5


def test_p2p_bound_is_below_the_enumerated_optimum() -> None:
    prob = _chain3()
    best = min(float(stage_times(prob, np.array(p)[:, None], "p2p").max())
               for p in itertools.permutations(range(3)))
    assert best == 8.5  # this bound is tight here: stage 1 on device 0 as bounded


def test_p2p_bound_with_latency_solves_the_assignment() -> None:
    # With latency the neighbours' costs need not sort alike: stage 1's neighbours cost
    # (latency 3 + 1 byte) and (latency 3 + 2 bytes) per link; one link has latency 0 and
    # 1/B 10, the other latency 5 and 1/B 1. Round trips double both.
    lat = [[0, 0, 5], [0, 0, 0], [5, 0, 0]]
    ib = [[0, 10, 1], [10, 0, 100], [1, 100, 0]]
    m = [[0, 1, 0], [1, 0, 2], [0, 2, 0]]
    prob = _problem(np.zeros((3, 3)), m, ib, latency=lat)
    # Stage 1 on device 0: links to 1 (2*(0 + 10 b)) and to 2 (2*(5 + 1 b)) per tensor b.
    # Stage 0 (1 byte) to 1, stage 2 (2 bytes) to 2: 20 + 14 = 34; swapped: 40 + 12 = 52.
    assert p2p_node_bounds(prob)[1, 0] == 34.0


def test_allreduce_bound_by_hand() -> None:
    # Two stages, 2 replicas each on 4 devices; stage 0 reduces 4 bytes (a ring link costs
    # 2 (R - 1) P / R = 4 bytes), stage 1 nothing. R = 2: a device's slowest ring link is at
    # least its cheapest link (1, 1, 2, 3 per byte).
    ib = [[0, 1, 2, 3], [1, 0, 5, 6], [2, 5, 0, 7], [3, 6, 7, 0]]
    prob = _problem([[1, 1, 1, 1], [2, 3, 1, 4]], np.zeros((2, 2)), ib, replicas=2,
                    param_bytes=[4, 0], view="allreduce")
    assert allreduce_min(prob).tolist() == [[4, 4, 8, 12], [0, 0, 0, 0]]
    assert allreduce_node_bounds(prob).tolist() == [[5, 5, 9, 13], [2, 3, 1, 4]]
    assert lower_bound(prob, "allreduce") == 5.0  # the 2nd smallest of each row, largest


def test_allreduce_bound_second_link_for_rings_of_three() -> None:
    # R = 3 on a symmetric topology: a device's two ring neighbours are distinct, so its
    # slowest link is at least its second cheapest. P = 3: factor 2 * 2 * 3 / 3 = 4.
    ib = [[0, 1, 2, 3], [1, 0, 5, 6], [2, 5, 0, 7], [3, 6, 7, 0]]
    prob = _problem([[1, 1, 1, 1]], np.zeros((1, 1)), ib, replicas=3, param_bytes=[3],
                    view="allreduce")
    assert allreduce_node_bounds(prob).tolist() == [[9, 21, 21, 25]]
    assert ring_bottleneck(prob.inv_bandwidth, 3) == 2.0
    assert lower_bound(prob, "allreduce") == 21.0  # 3rd smallest; the ring term gives 9


def test_ring_term_beats_equation_9_when_replicas_exceed_a_fast_group() -> None:
    # Two groups of 3 devices, 1/B 1 inside and 10 across; R = 4 replicas must leave a
    # group: every device's two cheapest links are inside (eq. 9: 1 + 3 * 1 = 4), but the
    # ring's slowest link is at least 10 (1 + 3 * 10 = 31). P = 2: factor 2 * 3 * 2 / 4 = 3.
    ib = np.full((6, 6), 10.0)
    for g in ((0, 1, 2), (3, 4, 5)):
        ib[np.ix_(g, g)] = 1.0
    np.fill_diagonal(ib, 0.0)
    prob = _problem(np.ones((1, 6)), np.zeros((1, 1)), ib, replicas=4, param_bytes=[2],
                    view="allreduce")
    assert allreduce_node_bounds(prob).tolist() == [[4.0] * 6]
    assert ring_bottleneck(ib, 4) == 10.0
    assert lower_bound(prob, "allreduce") == 31.0


def _stage_bound(problem: MappingProblem, model: str) -> float:
    """The largest single-stage bound: max over s of the R-th smallest node bound."""
    nb = allreduce_node_bounds(problem) if model == "allreduce" else p2p_node_bounds(problem)
    r = problem.num_replicas
    return float(np.partition(nb, r - 1, axis=1)[:, r - 1].max())


@pytest.mark.parametrize("model", ["p2p", "allreduce", "overlap"])
@pytest.mark.parametrize("seed", range(3))
def test_recorded_bound_is_at_least_the_largest_stage_bound(model: str, seed: int) -> None:
    g = layered(30, width=3, seed=seed)
    topo = build("uniform-dist", num_devices=8, seed=seed)
    plan = registry.run("partition", "parmesan", g, topo, stages=4, replicas=2).plan
    mapped = registry.run("map", "optimal", g, topo, plan=plan, model=model, judge=False,
                          seed=seed).plan
    prob = build_problem(plan, g, topo, model=model)
    lb = mapped.objective.lower_bound
    assert lb is not None
    assert lb >= _stage_bound(prob, model) * (1 - 1e-12)
    assert lb >= lower_bound(prob, model) * (1 - 1e-12)
    assert lb <= mapped.objective.value * (1 + 1e-12)


@pytest.mark.parametrize("model", ["p2p", "allreduce"])
def test_a_search_cut_short_keeps_at_least_the_initial_bound(model: str) -> None:
    # Every bisection target is stopped at once (target_time_limit): status timed_out, and
    # the bound reported is the initial one (eq. 8 / 9 with the ring term), never less.
    g = layered(30, width=3, seed=1)
    topo = build("uniform-dist", num_devices=8, seed=1)
    plan = registry.run("partition", "parmesan", g, topo, stages=4, replicas=2).plan
    prob = build_problem(plan, g, topo, model=model)
    sol = solve(prob, model, target_time_limit=1e-12, local_search=False)
    trivial = lower_bound(prob, model)
    assert sol.status == "timed_out" and sol.stats["timed_out_targets"] >= 1
    assert sol.lower_bound >= min(trivial, sol.value) * (1 - 1e-12)
    assert sol.lower_bound >= _stage_bound(prob, model) * (1 - 1e-12)
    assert sol.stats["initial_lower_bound"] == trivial
