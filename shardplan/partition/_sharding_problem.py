"""The problem the sharding search solves (:class:`Problem`: a graph's nodes, weights and
edges, k components, the slot cost matrix and the objective's targets and scales), and the
seeded generator of each restart. See :mod:`shardplan.partition._sharding_search`."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from shardplan._rng import make_rng

__all__ = ["Problem", "STARTS", "restart_rng"]


STARTS = ("random", "topo", "metis")


@dataclass(frozen=True, eq=False)
class Problem:
    """A sharding-cost instance on local node ids ``0..n-1``.

    Attributes
    ----------
    weight : ndarray (n,)
    src, dst : ndarray (m,)
        Edges (parallel edges count once each).
    succ_ptr, succ, pred_ptr, pred : ndarray
        CSR successor / predecessor lists.
    rank : ndarray (n,)
        A topological rank of every node (for the ``topo`` start).
    level : ndarray (n,)
        Longest-path depth (the ``topo`` start sorts by it, ties at random after restart 0).
    cost : ndarray (D, D)
        M over the slots; diagonal zero.
    k : int
        Components.
    target, scale : ndarray (D,)
        Per slot: target weight T and scale s of the imbalance term.
    min_size : ndarray (D,)
        Per slot: the fewest nodes a component placed there must hold.
    initial_placement : ndarray (k,) or None
        Fixed start placement (hierarchical levels: identity); None: greedy.
    acyclic : bool
        Keep the partition *monotone*: every edge runs from a component to itself or to a
        later one (component ids in order), so the components form a DAG that a pipeline
        runs forward (acyclic DAG partitioning). Every start, move and exchange keeps it;
        see :func:`allowed_range`.
    """

    weight: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    succ_ptr: np.ndarray
    succ: np.ndarray
    pred_ptr: np.ndarray
    pred: np.ndarray
    rank: np.ndarray
    level: np.ndarray
    cost: np.ndarray
    k: int
    target: np.ndarray
    scale: np.ndarray
    min_size: np.ndarray
    initial_placement: np.ndarray | None = None
    acyclic: bool = False

    @property
    def n(self) -> int:
        return int(self.weight.shape[0])

    @functools.cached_property
    def symmetric(self) -> bool:
        """Whether ``cost`` is symmetric (computed once: O(D^2))."""
        return bool(np.array_equal(self.cost, self.cost.T))

    @classmethod
    def build(cls, weight: np.ndarray, src: np.ndarray, dst: np.ndarray, rank: np.ndarray,
              level: np.ndarray, cost: np.ndarray, k: int, *, target: np.ndarray | None = None,
              scale: np.ndarray | None = None, min_size: np.ndarray | None = None,
              initial_placement: np.ndarray | None = None, acyclic: bool = False) -> Problem:
        """Build CSR lists; default targets ``total / k``, scale 1, min size 1. O(m log m)."""
        n = int(weight.shape[0])
        d = int(cost.shape[0])
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)

        def csr(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            order = np.argsort(a, kind="stable")
            ptr = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(np.bincount(a, minlength=n), out=ptr[1:])
            return ptr, b[order]

        sp, sc = csr(src, dst)
        pp, pc = csr(dst, src)
        total = float(np.sum(weight))
        return cls(
            weight=np.asarray(weight, dtype=np.float64), src=src, dst=dst, succ_ptr=sp,
            succ=sc, pred_ptr=pp, pred=pc, rank=np.asarray(rank, dtype=np.int64),
            level=np.asarray(level, dtype=np.int64), cost=np.asarray(cost, dtype=np.float64),
            k=int(k),
            target=np.full(d, total / k) if target is None else np.asarray(target, np.float64),
            scale=np.ones(d) if scale is None else np.asarray(scale, np.float64),
            min_size=np.ones(d, np.int64) if min_size is None else np.asarray(min_size,
                                                                               np.int64),
            initial_placement=initial_placement, acyclic=bool(acyclic),
        )

    def objective(self, assignment: np.ndarray, placement: np.ndarray) -> float:
        """The objective from scratch, vectorised: O(n + m)."""
        w = np.bincount(assignment, weights=self.weight, minlength=self.k)
        imb = float(np.sum(self.scale[placement] * (w - self.target[placement]) ** 2))
        cu, cv = assignment[self.src], assignment[self.dst]
        cut = cu != cv
        return imb + float(np.sum(self.cost[placement[cu[cut]], placement[cv[cut]]]))

    def is_monotone(self, assignment: np.ndarray) -> bool:
        """Whether every edge runs from a component to itself or a later one. O(m)."""
        return bool(np.all(assignment[self.src] <= assignment[self.dst]))

    def comm_sparse(self, assignment: np.ndarray) -> sp.csr_matrix:
        """:meth:`comm_matrix` as a sparse ``(k, k)`` matrix: O(m), no k^2 memory (a
        partition onto thousands of devices has few pairs of components that talk)."""
        k = self.k
        cu, cv = assignment[self.src], assignment[self.dst]
        cut = cu != cv
        return sp.csr_matrix((np.ones(int(cut.sum())), (cu[cut], cv[cut])), shape=(k, k))

    def comm_matrix(self, assignment: np.ndarray) -> np.ndarray:
        """``A[i, j]`` = edges from component i to component j (i != j; diagonal 0). O(m)."""
        k = self.k
        cu, cv = assignment[self.src], assignment[self.dst]
        a = np.bincount(cu * k + cv, minlength=k * k).reshape(k, k).astype(np.float64)
        np.fill_diagonal(a, 0.0)
        return a


def restart_rng(seed: int, restart: int) -> np.random.Generator:
    """The generator of restart ``restart``: a function of the master seed and the index
    only, so results do not depend on the number of workers or on scheduling."""
    return make_rng(np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed,
                                                                                 restart]))))
