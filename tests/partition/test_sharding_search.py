"""The local search's vectorised node pass held to the one-node-at-a-time pass it replaces.

The pass evaluates chunks of the visiting order together and screens nodes by a lower bound
of their best move's delta; neither may change a move. The reference below is the scalar
pass (every node's k deltas from the formula, one node at a time). Weights are integers and
costs multiples of 1/4, so every sum is exact in floating point and the two passes must
agree move for move, not only up to rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

import shardplan.partition._sharding_local as local
import shardplan.partition._sharding_moves as moves_mod
import shardplan.partition._sharding_placement as placement_mod
import shardplan.partition._sharding_starts as starts
from shardplan.partition._sharding_acyclic import make_monotone
from shardplan.partition._sharding_moves import _node_pass, _State
from shardplan.partition._sharding_problem import Problem, restart_rng


def _reference_pass(problem: Problem, st: _State, order: np.ndarray, eps: float) -> int:
    """One node at a time: the delta of moving v from c to every b is
    ``s_b w (w + 2 (W_b - T_b)) + s_c w (w - 2 (W_c - T_c)) + cut_b - cut_c``."""
    a, k = st.assignment, problem.k
    p = st.placement
    mp = problem.cost[np.ix_(p, p)]
    tgt, scl, mins = problem.target[p], problem.scale[p], problem.min_size[p]
    moves = 0
    for v in order.tolist():
        c = int(a[v])
        if st.size[c] <= mins[c]:
            continue
        w = problem.weight[v]
        succ = problem.succ[problem.succ_ptr[v]:problem.succ_ptr[v + 1]]
        pred = problem.pred[problem.pred_ptr[v]:problem.pred_ptr[v + 1]]
        best, best_b = np.inf, -1
        for b in range(k):
            if b == c:
                continue
            if problem.acyclic and ((pred.size and b < a[pred].max())
                                    or (succ.size and b > a[succ].min())):
                continue
            cut_b = sum(mp[b, a[u]] for u in succ) + sum(mp[a[u], b] for u in pred)
            cut_c = sum(mp[c, a[u]] for u in succ) + sum(mp[a[u], c] for u in pred)
            dev_b, dev_c = st.weight[b] - tgt[b], st.weight[c] - tgt[c]
            delta = (scl[b] * w * (w + 2 * dev_b) + scl[c] * w * (w - 2 * dev_c)
                     + cut_b - cut_c)
            if delta < best:
                best, best_b = delta, b
        if best < -eps:
            a[v] = best_b
            st.weight[c] -= w
            st.weight[best_b] += w
            st.size[c] -= 1
            st.size[best_b] += 1
            moves += 1
    return moves


def _instance(seed: int) -> tuple[Problem, np.ndarray, np.ndarray]:
    """A random DAG (ids not in topological order), integer weights, costs in quarters
    (asymmetric half of the time), k of 2-40 components on up to k + 3 slots, with the
    hierarchical levels' per-slot targets, scales (1/1, 1/2, 1/4) and minimum sizes on
    some; acyclic (from a monotone start) on a third."""
    rng = np.random.default_rng(seed)
    k = int(rng.choice([2, 3, 5, 8, 40]))
    n = int(rng.integers(k + 2, 4 * k + 30))
    d = k + int(rng.integers(0, 4))
    iu = np.triu_indices(n, 1)
    keep = rng.random(iu[0].size) < min(0.5, 3.0 / n)
    perm = rng.permutation(n)
    src, dst = perm[iu[0][keep]], perm[iu[1][keep]]
    weight = rng.integers(0, 10, n).astype(float)
    cost = rng.integers(0, 17, (d, d)) / 4.0
    if rng.random() < 0.5:
        cost = np.minimum(cost, cost.T)
    np.fill_diagonal(cost, 0.0)
    kw = {}
    if rng.random() < 0.5:
        sizes = rng.choice([1, 2, 4], d)
        kw = {"target": weight.sum() * sizes / sizes.sum() * (d / k), "scale": 1.0 / sizes,
              "min_size": np.minimum(sizes, 2)}
    rank = np.empty(n, dtype=np.int64)
    rank[perm] = np.arange(n)
    problem = Problem.build(weight, src, dst, rank, np.zeros(n, np.int64), cost, k,
                            acyclic=bool(seed % 3 == 0), **kw)
    a = rng.integers(0, k, n)
    if problem.acyclic:
        a = make_monotone(problem, a)
    placement = rng.permutation(d)[:k]
    return problem, a, placement


def _state(problem: Problem, a: np.ndarray, placement: np.ndarray) -> _State:
    k = problem.k
    return _State(a.copy(), placement.copy(),
                  np.bincount(a, weights=problem.weight, minlength=k).astype(float),
                  np.bincount(a, minlength=k))


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("screen", [False, True])
def test_node_pass_makes_the_moves_of_the_scalar_pass(seed: int, screen: bool,
                                                      monkeypatch) -> None:
    """Several passes in a row (so that later passes start near a local optimum, where the
    screening drops most nodes); small chunks and candidate batches, so that a pass takes
    many chunks and a chunk several batches."""
    monkeypatch.setattr(moves_mod, "_CHUNK_MIN", 2)
    monkeypatch.setattr(moves_mod, "_CHUNK_MAX", 8)
    monkeypatch.setattr(moves_mod, "_CHUNK_ENTRIES", 64)
    problem, a, placement = _instance(seed)
    eps = local._eps(problem)
    mine, ref = _state(problem, a, placement), _state(problem, a, placement)
    rng = np.random.default_rng(seed)
    total = 0
    for _ in range(4):
        order = rng.permutation(problem.n)
        moves, timed_out = _node_pass(problem, mine, order, eps, None, screen=screen)
        assert not timed_out
        assert moves == _reference_pass(problem, ref, order, eps)
        assert np.array_equal(mine.assignment, ref.assignment)
        assert np.array_equal(mine.size, ref.size)
        assert np.allclose(mine.weight, ref.weight)
        total += moves
        if problem.acyclic:
            assert problem.is_monotone(mine.assignment)
    if seed == 1:
        assert total > 0  # the instances do move nodes


def test_screening_drops_nodes_near_a_local_optimum(monkeypatch) -> None:
    """At a local optimum of a balanced partition the bound rules out most nodes: the pass
    evaluates the k deltas of only a few (counted through the batch evaluation)."""
    from shardplan.generate import layered
    from shardplan.partition._sharding_common import flat_problem
    from shardplan.topology import build

    g = layered(2000, width=50, seed=0)
    topo = build("hierarchical", shape=(4, 16))
    problem = flat_problem(g, topo, 64)
    rng = restart_rng(0, 0)
    a0 = starts.initial_assignment(problem, "metis", rng, 0, np.arange(64))
    out = local.local_search(problem, a0, placement_mod._placement_start(problem, a0), rng,
                             swaps=False)
    evaluated = []
    real = moves_mod._ranges

    def counting(lo, length):
        evaluated.append(lo.size)
        return real(lo, length)

    monkeypatch.setattr(moves_mod, "_ranges", counting)
    st = _state(problem, out.assignment, out.placement)
    moves, _ = _node_pass(problem, st, rng.permutation(problem.n), local._eps(problem),
                          None, screen=True)
    assert moves == 0
    # Each chunk lists every node once for the bound (two _ranges calls), and the nodes
    # evaluated in full once more: far fewer than all of them.
    screened = sum(evaluated) / 2
    assert screened >= problem.n
    assert screened - problem.n < 0.2 * problem.n


@pytest.mark.parametrize("seed", range(12))
def test_swap_table_takes_the_swaps_of_the_full_recomputation(seed: int, monkeypatch) -> None:
    """Every slot used (k = D): the kept swap table (:class:`_SwapTable`) and the full
    table recomputed every round walk the same swaps from a random placement, with slot
    labels (targets, scales, minimum sizes) that forbid some swaps on half the instances,
    asymmetric costs on half, and the slot costs refreshed every few rounds."""
    from shardplan.generate import layered
    from shardplan.partition._sharding_placement import improve_placement

    rng = np.random.default_rng(seed)
    k = int(rng.integers(5, 30))
    g = layered(int(rng.integers(60, 300)), width=int(rng.integers(4, 12)), seed=seed)
    cost = rng.integers(0, 9, (k, k)) / 4.0  # few distinct values: ties happen
    if seed % 2:
        cost = np.minimum(cost, cost.T)
    np.fill_diagonal(cost, 0.0)
    kw = {}
    if seed % 4 >= 2:
        sizes = rng.choice([1, 2], k)
        kw = {"target": g.weight.sum() * sizes / sizes.sum(), "scale": 1.0 / sizes}
    problem = Problem.build(g.weight, g.src, g.dst, g.topological_rank, g.levels, cost, k,
                            **kw)
    a = rng.integers(0, k, g.num_nodes)
    p0 = rng.permutation(k)
    eps = local._eps(problem)
    monkeypatch.setattr(placement_mod, "_DENSE_WORK", 0)  # the kept slot costs on a small k
    monkeypatch.setattr(placement_mod, "_REFRESH_ROUNDS", 5)
    table, moved = improve_placement(problem, a, p0, eps)
    monkeypatch.setattr(placement_mod, "_TABLE_MIN_K", 10 ** 9)  # every round's full table
    full, moved_too = improve_placement(problem, a, p0, eps)
    assert moved and moved_too
    assert np.array_equal(table, full)
    assert problem.objective(a, table) < problem.objective(a, p0)
    # A few rounds only: stopped early, the two agree as well.
    monkeypatch.setattr(placement_mod, "_TABLE_MIN_K", 2)
    short, _ = improve_placement(problem, a, p0, eps, max_rounds=3)
    monkeypatch.setattr(placement_mod, "_TABLE_MIN_K", 10 ** 9)
    assert np.array_equal(short, improve_placement(problem, a, p0, eps, max_rounds=3)[0])


@pytest.mark.parametrize("seed", range(0, 60, 3))  # the acyclic instances
def test_acyclic_swap_deltas_are_the_monotone_exchanges(seed: int) -> None:
    """With ``acyclic``, an exchange of two non-adjacent nodes of different components has
    a finite delta exactly when the exchanged partition is monotone, and that delta is the
    change of the objective; every other entry (same component, adjacent) is ``inf``. Only
    the nodes that may leave their component enter the pairwise arrays; this holds the
    restriction to the full definition."""
    from shardplan.partition._sharding_swaps import swap_deltas

    problem, a, placement = _instance(seed)
    assert problem.acyclic
    k = problem.k
    weight = np.bincount(a, weights=problem.weight, minlength=k)
    delta = swap_deltas(problem, a, placement, weight)
    base = problem.objective(a, placement)
    adjacent = set(zip(problem.src.tolist(), problem.dst.tolist(), strict=True))
    finite = 0
    for v in range(problem.n):
        for u in range(problem.n):
            b = a.copy()
            b[v], b[u] = a[u], a[v]
            if a[v] == a[u] or (v, u) in adjacent or (u, v) in adjacent \
                    or not problem.is_monotone(b):
                assert delta[v, u] == np.inf, (v, u)
                continue
            finite += 1
            assert delta[v, u] == pytest.approx(problem.objective(b, placement) - base,
                                                abs=1e-9), (v, u)
    if seed == 0:
        assert finite > 0


@pytest.mark.parametrize("workers", [1, 2])
def test_begin_by_lets_only_the_first_restart_begin_late(workers: int) -> None:
    """``begin_by`` passed: the first restart still runs (to its end: no deadline), the
    others are skipped and the summary says ``timed_out``; not given, all run."""
    import time

    from shardplan.partition._sharding_search import run_restarts

    problem, _, _ = _instance(1)
    common = dict(start="topo", seed=0, restarts=3, workers=workers, deadline=None,
                  max_iterations=1000)
    late = run_restarts(problem, begin_by=time.monotonic() - 1.0, **common)
    assert [r.restart for r in late.results] == [0] and late.timed_out
    assert not late.results[0].outcome.timed_out
    full = run_restarts(problem, **common)
    assert [r.restart for r in full.results] == [0, 1, 2] and not full.timed_out
    assert late.results[0].outcome.cost == full.results[0].outcome.cost


def test_metis_start_of_no_nodes_is_silent(capfd: pytest.CaptureFixture[str]) -> None:
    """A split left with no nodes: no METIS call (METIS prints 'Cannot bisect a graph with 0
    vertices!' on stdout, which `shardplan plan` showed), and the seed's draw is kept."""
    empty = np.zeros(0, dtype=np.int64)
    cost = np.ones((3, 3)) - np.eye(3)
    problem = Problem.build(np.zeros(0), empty, empty, empty, empty, cost, 3)
    rng = np.random.default_rng(7)
    out = starts._metis(problem, rng, np.arange(3))
    assert out.shape == (0,)
    assert "Cannot" not in capfd.readouterr().out
    fresh = np.random.default_rng(7)
    fresh.integers(2**31 - 1)
    assert rng.integers(1000) == fresh.integers(1000)
