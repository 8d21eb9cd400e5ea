"""The computation graph value object (``shardplan.graph/1``).

A :class:`Graph` stores its nodes column-wise (one NumPy array per attribute) and its edges as
three arrays ``src``, ``dst``, ``bytes``, so the queries every planner needs run vectorised on
10^4-10^5 nodes. It is immutable: the arrays are read-only and derived structures (adjacency in
CSR form, topological order) are computed once and cached.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, cast

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from shardplan.errors import InvalidFileError, ShardplanError

__all__ = ["GRAPH_FORMAT", "MAX_BYTES", "Edge", "Graph", "Node", "space_at_batch"]

GRAPH_FORMAT = "shardplan.graph/1"

#: Byte counts (and ids) must stay below 2^53: every such integer is exact as a float64 (the
#: files are JSON numbers) and far from int64's limit, past which 1e30 bytes wrapped around
#: to a negative count. No tensor comes near it (2^53 bytes is 8 PiB).
MAX_BYTES = float(2**53)
#: Bound on a node's FLOPs, weight, seconds and working memory: far beyond any model (a large
#: language model's whole training run is about 1e25 FLOPs), and low enough that sums and
#: products of them stay finite floats (1e308 per node overflowed the planner).
MAX_QUANTITY = 1e30

_FLOAT_COLUMNS = ("fwd_flops", "bwd_flops", "weight")
_INT_COLUMNS = ("param_bytes", "output_bytes")
_OPTIONAL_FLOAT_COLUMNS = ("fwd_seconds", "bwd_seconds", "memory_bytes", "param_tensors")
_NODE_KEYS = {"id", "name", "op", "module", "space", *_FLOAT_COLUMNS, *_INT_COLUMNS,
              *_OPTIONAL_FLOAT_COLUMNS}


def space_at_batch(space: Any, old: int, new: int) -> Any:
    """A node's PaSE iteration space (its JSON form) taken from ``old`` to ``new`` samples.

    The space's batch dimension (``batch_dim``, else its first) scales when its size is a
    whole multiple of ``old`` (a merged batch x sequence dimension too: it holds that many
    samples' rows); a space whose batch dimension is not (a position embedding's 1, an
    operator on parameters) is batch-independent and kept. The output dimensions built from
    the batch dimension scale alike, and so does an opaque operator's ``flops``. O(d).

    Examples
    --------
    >>> sp = {"kind": "gemm", "dims": [["b", 16], ["n", 4]], "output": [["b"], ["n"]],
    ...       "output_shape": [16, 4], "m": ["b"], "n": ["n"], "k": []}
    >>> out = space_at_batch(sp, 8, 32)
    >>> out["dims"], out["output_shape"]
    ([['b', 64], ['n', 4]], [64, 4])
    >>> space_at_batch({"kind": "reshape", "dims": [["d0", 1]]}, 8, 32)["dims"]
    [['d0', 1]]
    """
    if old == new or not isinstance(space, Mapping):
        return space
    dims = space.get("dims") or []
    if not dims:
        return space
    bd = space.get("batch_dim", dims[0][0])
    sizes = {str(n): int(s) for n, s in dims}
    size = sizes.get(str(bd))
    if size is None or size % old:
        return space
    out = dict(space)
    out["dims"] = [[n, (int(s) // old) * new if n == bd else int(s)] for n, s in dims]
    shape = list(space.get("output_shape") or [])
    groups = list(space.get("output") or [])
    for i, g in enumerate(groups[:len(shape)]):
        if bd in g and (int(shape[i]) * new) % old == 0:
            shape[i] = int(shape[i]) * new // old
    if shape:
        out["output_shape"] = shape
    if space.get("kind") == "opaque" and "flops" in space:
        out["flops"] = float(space["flops"]) * new / old
    return out


@dataclass(frozen=True, slots=True)
class Node:
    """One node of a graph, as a plain record (a view built on demand from the columns)."""

    id: int
    name: str
    op: str
    module: str
    fwd_flops: float
    bwd_flops: float
    param_bytes: int
    output_bytes: int
    weight: float
    fwd_seconds: float | None = None
    bwd_seconds: float | None = None
    memory_bytes: float | None = None
    param_tensors: float | None = None
    space: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Edge:
    """A data dependency ``src -> dst`` carrying a tensor of ``bytes`` bytes."""

    src: int
    dst: int
    bytes: int


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    a.setflags(write=False)
    return a


def _frontier_expand(indptr: np.ndarray, indices: np.ndarray, frontier: np.ndarray) -> np.ndarray:
    """All neighbours (with repeats) of the nodes in ``frontier`` in a CSR adjacency."""
    starts = indptr[frontier]
    lens = indptr[frontier + 1] - starts
    total = int(lens.sum())
    if total == 0:
        return np.empty(0, dtype=indices.dtype)
    offsets = np.repeat(starts - np.concatenate(([0], np.cumsum(lens)[:-1])), lens)
    return indices[offsets + np.arange(total)]


@dataclass(frozen=True, eq=False)
class Graph:
    """A DAG of operators (or modules) with compute, memory and communication attributes.

    Build one with :meth:`Graph.from_nodes` (records) or :meth:`Graph.from_arrays` (columns), or
    load one with :func:`shardplan.ir.load_graph`. Construction validates: every edge endpoint
    exists, no self loop, no cycle, no negative or non-finite size, unique node names.

    Attributes
    ----------
    name : str
        Model name.
    batch_size : int
        The batch size at which FLOPs and bytes were measured.
    names, ops, modules : tuple of str
        Per node: unique name, operator kind (``"conv2d"``), owning module path.
    fwd_flops, bwd_flops, weight : ndarray of float64, shape (n,)
    param_bytes, output_bytes : ndarray of int64, shape (n,)
    fwd_seconds, bwd_seconds, memory_bytes : ndarray of float64 or None
        Optional columns; ``NaN`` marks a node without the value.
    param_tensors : ndarray of float64 or None
        Optional column: how many parameter tensors the node's ``param_bytes`` are (what an
        optimizer steps one at a time); ``NaN`` where not known.
    spaces : tuple of (dict or None) or None
        PaSE iteration spaces, per node.
    src, dst, edge_bytes : ndarray of int64, shape (m,)
        The edges.
    """

    name: str
    batch_size: int
    names: tuple[str, ...]
    ops: tuple[str, ...]
    modules: tuple[str, ...]
    fwd_flops: np.ndarray
    bwd_flops: np.ndarray
    param_bytes: np.ndarray
    output_bytes: np.ndarray
    weight: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    edge_bytes: np.ndarray
    fwd_seconds: np.ndarray | None = None
    bwd_seconds: np.ndarray | None = None
    memory_bytes: np.ndarray | None = None
    param_tensors: np.ndarray | None = None
    spaces: tuple[Mapping[str, Any] | None, ...] | None = None
    node_extra: tuple[Mapping[str, Any], ...] | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ construction
    def __post_init__(self) -> None:
        n = len(self.names)
        if not isinstance(self.batch_size, (int, np.integer)) or self.batch_size < 1:
            raise InvalidFileError(f"graph batch_size must be a positive integer, got "
                                   f"{self.batch_size!r}")
        if len(self.ops) != n or len(self.modules) != n:
            raise InvalidFileError("graph columns names/ops/modules differ in length")
        for col in (*_FLOAT_COLUMNS, *_INT_COLUMNS):
            arr = np.asarray(getattr(self, col), dtype=np.float64)
            if arr.shape != (n,):
                raise InvalidFileError(f"graph column {col!r} has shape {arr.shape}, "
                                       f"expected ({n},)")
            bad = np.flatnonzero(~np.isfinite(arr) | (arr < 0))
            if bad.size:
                i = int(bad[0])
                raise InvalidFileError(f"node {i} ({self.names[i]!r}) has a negative or "
                                       f"non-finite {col}: {arr[i]!r}")
            huge = np.flatnonzero(arr >= MAX_QUANTITY)
            if huge.size:
                i = int(huge[0])
                raise InvalidFileError(f"node {i} ({self.names[i]!r}) has {col} "
                                       f"{arr[i]:.6g}: must be below {MAX_QUANTITY:.0e}")
            if col in _INT_COLUMNS:
                big = np.flatnonzero(arr >= MAX_BYTES)
                if big.size:
                    i = int(big[0])
                    raise InvalidFileError(f"node {i} ({self.names[i]!r}) has {col} "
                                           f"{arr[i]:.6g}: byte counts must be below 2^53")
                arr = arr.astype(np.int64)
            object.__setattr__(self, col, _readonly(arr))
        for col in _OPTIONAL_FLOAT_COLUMNS:
            val = getattr(self, col)
            if val is not None:
                arr = np.asarray(val, dtype=np.float64)
                if arr.shape != (n,):
                    raise InvalidFileError(f"graph column {col!r} has shape {arr.shape}")
                inf = np.flatnonzero(np.isinf(arr))  # NaN marks an absent value
                if inf.size:
                    i = int(inf[0])
                    raise InvalidFileError(f"node {i} ({self.names[i]!r}) has a non-finite "
                                           f"{col}: {arr[i]!r}")
                huge = np.flatnonzero(np.abs(np.nan_to_num(arr)) >= MAX_QUANTITY)
                if huge.size:
                    i = int(huge[0])
                    raise InvalidFileError(f"node {i} ({self.names[i]!r}) has {col} "
                                           f"{arr[i]:.6g}: must be below {MAX_QUANTITY:.0e}")
                object.__setattr__(self, col, _readonly(arr))
        for col in ("src", "dst", "edge_bytes"):
            arr = np.asarray(getattr(self, col), dtype=np.float64).reshape(-1)
            if not np.all(np.isfinite(arr)):
                raise InvalidFileError(f"edge column {col!r} holds a non-finite value")
            big = np.flatnonzero(np.abs(arr) >= MAX_BYTES)
            if big.size:
                e = int(big[0])
                raise InvalidFileError(f"edge {e} has {'bytes' if col == 'edge_bytes' else col}"
                                       f" {arr[e]:.6g}: integers in a graph must be below 2^53")
            object.__setattr__(self, col, _readonly(arr.astype(np.int64)))
        if not (self.src.shape == self.dst.shape == self.edge_bytes.shape):
            raise InvalidFileError("edge arrays src/dst/bytes differ in length")
        if self.spaces is not None and len(self.spaces) != n:
            raise InvalidFileError("graph spaces column has the wrong length")
        if self.node_extra is not None and len(self.node_extra) != n:
            raise InvalidFileError("graph node_extra column has the wrong length")
        self._validate()

    def _validate(self) -> None:
        n = self.num_nodes
        for col in _OPTIONAL_FLOAT_COLUMNS:
            arr = getattr(self, col)
            if arr is not None:
                bad = np.flatnonzero(arr < 0)  # NaN (absent) compares False
                if len(bad):
                    i = int(bad[0])
                    raise InvalidFileError(f"node {i} ({self.names[i]!r}) has a negative "
                                           f"{col}: {arr[i]!r}")
        if len(set(self.names)) != n:
            seen: set[str] = set()
            for nm in self.names:
                if nm in seen:
                    raise InvalidFileError(f"duplicate node name {nm!r}")
                seen.add(nm)
        if self.num_edges:
            for end in ("src", "dst"):
                arr = getattr(self, end)
                bad = np.flatnonzero((arr < 0) | (arr >= n))
                if len(bad):
                    e = int(bad[0])
                    raise InvalidFileError(f"edge {e} ({int(self.src[e])} -> {int(self.dst[e])}) "
                                           f"has a dangling {end}: graph has {n} nodes")
            loops = np.flatnonzero(self.src == self.dst)
            if len(loops):
                raise InvalidFileError(f"edge {int(loops[0])} is a self loop on node "
                                       f"{int(self.src[loops[0]])}")
            neg = np.flatnonzero(self.edge_bytes < 0)
            if len(neg):
                raise InvalidFileError(f"edge {int(neg[0])} has negative bytes "
                                       f"{int(self.edge_bytes[neg[0]])}")
            if not np.all(self.src < self.dst):  # ids in topological order: cannot cycle
                ncomp, labels = connected_components(self._adjacency, directed=True,
                                                     connection="strong")
                if ncomp < n:
                    counts = np.bincount(labels)
                    cyc = np.flatnonzero(counts[labels] > 1)
                    raise InvalidFileError(
                        f"graph has a cycle through nodes {cyc[:5].tolist()}"
                        f"{' ...' if len(cyc) > 5 else ''}: a computation graph must be a DAG")

    @classmethod
    def from_arrays(
        cls,
        *,
        name: str,
        batch_size: int = 1,
        fwd_flops: Sequence[float] | np.ndarray,
        src: Sequence[int] | np.ndarray,
        dst: Sequence[int] | np.ndarray,
        edge_bytes: Sequence[int] | np.ndarray | None = None,
        bwd_flops: Sequence[float] | np.ndarray | None = None,
        param_bytes: Sequence[int] | np.ndarray | None = None,
        output_bytes: Sequence[int] | np.ndarray | None = None,
        weight: Sequence[float] | np.ndarray | None = None,
        names: Sequence[str] | None = None,
        ops: Sequence[str] | None = None,
        modules: Sequence[str] | None = None,
        **optional: Any,
    ) -> Graph:
        """Build a graph from columns; missing columns get defaults.

        Defaults: ``bwd_flops = 2 * fwd_flops``, zero parameter and output bytes, edge bytes equal
        to the source node's output bytes, ``weight`` = parameter count assuming 4-byte
        parameters (the contract's default), names ``n0, n1, ...``.
        """
        fwd = np.asarray(fwd_flops, dtype=np.float64)
        n = fwd.shape[0]
        src_a = np.asarray(src, dtype=np.int64)
        # Floats until validated: a cast to int64 first would wrap huge values around.
        pb = np.zeros(n) if param_bytes is None else np.asarray(param_bytes, np.float64)
        ob = np.zeros(n) if output_bytes is None else np.asarray(output_bytes, np.float64)
        if edge_bytes is None:
            edge_bytes = ob[np.clip(src_a, 0, max(n - 1, 0))] if n else np.zeros(0, np.int64)
        return cls(
            name=name,
            batch_size=int(batch_size),
            names=tuple(names) if names is not None else tuple(f"n{i}" for i in range(n)),
            ops=tuple(ops) if ops is not None else ("op",) * n,
            modules=tuple(modules) if modules is not None else ("",) * n,
            fwd_flops=fwd,
            # Columns given as sequences are converted by __post_init__.
            bwd_flops=2.0 * fwd if bwd_flops is None else cast(np.ndarray, bwd_flops),
            param_bytes=pb,
            output_bytes=ob,
            weight=pb / 4.0 if weight is None else cast(np.ndarray, weight),
            src=src_a,
            dst=cast(np.ndarray, dst),
            edge_bytes=cast(np.ndarray, edge_bytes),
            **optional,
        )

    @classmethod
    def from_nodes(cls, *, name: str, batch_size: int, nodes: Sequence[Node],
                   edges: Iterable[Edge | tuple[int, int, int]],
                   meta: Mapping[str, Any] | None = None) -> Graph:
        """Build a graph from :class:`Node` records (ids must be 0..n-1 in order)."""
        for i, nd in enumerate(nodes):
            if nd.id != i:
                raise InvalidFileError(f"node at position {i} has id {nd.id}: ids must be "
                                       f"0..n-1 in order")
        edge_list = [(e.src, e.dst, e.bytes) if isinstance(e, Edge) else tuple(e) for e in edges]
        e_arr = np.array(edge_list, dtype=np.float64).reshape(-1, 3)  # validated, then int64

        def opt(attr: str) -> np.ndarray | None:
            vals = [getattr(nd, attr) for nd in nodes]
            if all(v is None for v in vals):
                return None
            return np.array([np.nan if v is None else v for v in vals], dtype=np.float64)

        spaces = tuple(nd.space for nd in nodes)
        extras = tuple(dict(nd.extra) for nd in nodes)
        return cls(
            name=name, batch_size=batch_size,
            names=tuple(nd.name for nd in nodes), ops=tuple(nd.op for nd in nodes),
            modules=tuple(nd.module for nd in nodes),
            fwd_flops=np.array([nd.fwd_flops for nd in nodes], dtype=np.float64),
            bwd_flops=np.array([nd.bwd_flops for nd in nodes], dtype=np.float64),
            param_bytes=np.array([nd.param_bytes for nd in nodes], dtype=np.float64),
            output_bytes=np.array([nd.output_bytes for nd in nodes], dtype=np.float64),
            weight=np.array([nd.weight for nd in nodes], dtype=np.float64),
            src=e_arr[:, 0], dst=e_arr[:, 1], edge_bytes=e_arr[:, 2],
            fwd_seconds=opt("fwd_seconds"), bwd_seconds=opt("bwd_seconds"),
            memory_bytes=opt("memory_bytes"), param_tensors=opt("param_tensors"),
            spaces=None if all(s is None for s in spaces) else spaces,
            node_extra=None if not any(extras) else extras,
            meta=dict(meta or {}),
        )

    def at_batch_size(self, batch_size: int) -> Graph:
        """The same graph with its per-sample quantities scaled to ``batch_size`` samples.

        FLOPs, measured seconds, output and edge bytes and working memory are taken to grow
        linearly with the batch (exact for FLOPs and activation bytes of the layers a graph
        holds; a first-order model for measured seconds, which small batches make
        latency-bound); parameter bytes and node weights do not change. PaSE iteration
        spaces follow the batch (:func:`space_at_batch`): a space whose batch dimension
        holds a whole number of the graph's samples has it, the output dimensions made of
        it and an opaque operator's FLOPs scaled alike, so that a strategy searched on the
        result splits the batch the plan runs (a space priced at its captured batch of 8
        allowed at most a 2-way batch split under the cutoff of 4). O(n + m).

        Examples
        --------
        >>> g = Graph.from_arrays(name="g", batch_size=8, fwd_flops=[8.0, 16.0], src=[0],
        ...                       dst=[1], output_bytes=[80, 0], param_bytes=[4, 4])
        >>> h = g.at_batch_size(2)
        >>> h.batch_size, h.fwd_flops.tolist(), h.edge_bytes.tolist(), h.param_bytes.tolist()
        (2, [2.0, 4.0], [20], [4, 4])
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
                or batch_size < 1:
            raise InvalidFileError(f"batch size must be a positive integer, got {batch_size!r}")
        if batch_size == self.batch_size:
            return self
        f = batch_size / float(self.batch_size)

        def scaled(arr: np.ndarray | None, integer: bool = False) -> np.ndarray | None:
            if arr is None:
                return None
            out = np.asarray(arr, dtype=np.float64) * f
            return np.rint(out).astype(np.int64) if integer else out

        spaces = None if self.spaces is None else tuple(
            None if sp is None else space_at_batch(sp, self.batch_size, int(batch_size))
            for sp in self.spaces)
        return self.replace(
            batch_size=int(batch_size), fwd_flops=scaled(self.fwd_flops),
            bwd_flops=scaled(self.bwd_flops), output_bytes=scaled(self.output_bytes, True),
            edge_bytes=scaled(self.edge_bytes, True), fwd_seconds=scaled(self.fwd_seconds),
            bwd_seconds=scaled(self.bwd_seconds), memory_bytes=scaled(self.memory_bytes),
            spaces=spaces)

    def subgraph(self, nodes: Sequence[int] | np.ndarray) -> Graph:
        """The graph induced by ``nodes`` (in the order given): their columns and the edges
        between them, renumbered ``0..k-1``. O(n + m).

        Examples
        --------
        >>> g = Graph.from_arrays(name="g", fwd_flops=[1, 2, 3], src=[0, 1], dst=[1, 2])
        >>> h = g.subgraph([1, 2])
        >>> h.fwd_flops.tolist(), h.src.tolist(), h.dst.tolist()
        ([2.0, 3.0], [0], [1])
        """
        idx = np.asarray(nodes, dtype=np.int64).reshape(-1)
        new = np.full(self.num_nodes, -1, dtype=np.int64)
        new[idx] = np.arange(idx.size)
        keep = (new[self.src] >= 0) & (new[self.dst] >= 0)
        pick = idx.tolist()

        def col(arr: np.ndarray | None) -> np.ndarray | None:
            return None if arr is None else np.asarray(arr)[idx]

        def req(arr: np.ndarray) -> np.ndarray:
            return np.asarray(arr)[idx]

        return Graph(
            name=self.name, batch_size=self.batch_size,
            names=tuple(self.names[v] for v in pick), ops=tuple(self.ops[v] for v in pick),
            modules=tuple(self.modules[v] for v in pick), fwd_flops=req(self.fwd_flops),
            bwd_flops=req(self.bwd_flops), param_bytes=req(self.param_bytes),
            output_bytes=req(self.output_bytes), weight=req(self.weight),
            src=new[self.src[keep]], dst=new[self.dst[keep]],
            edge_bytes=self.edge_bytes[keep], fwd_seconds=col(self.fwd_seconds),
            bwd_seconds=col(self.bwd_seconds), memory_bytes=col(self.memory_bytes),
            param_tensors=col(self.param_tensors),
            spaces=None if self.spaces is None else tuple(self.spaces[v] for v in pick),
            node_extra=None if self.node_extra is None else tuple(self.node_extra[v]
                                                                  for v in pick),
            meta=dict(self.meta))

    def replace(self, **changes: Any) -> Graph:
        """A copy with some fields changed (validated again)."""
        fields = {f: getattr(self, f) for f in self.__dataclass_fields__}
        fields.update(changes)
        return Graph(**fields)

    # ------------------------------------------------------------------ sizes and records
    @property
    def num_nodes(self) -> int:
        return len(self.names)

    @property
    def num_edges(self) -> int:
        return int(self.src.shape[0])

    def __len__(self) -> int:
        return self.num_nodes

    def node(self, i: int) -> Node:
        """The record of node ``i``."""

        def opt(col: np.ndarray | None) -> float | None:
            if col is None or math.isnan(col[i]):
                return None
            return float(col[i])

        return Node(
            id=i, name=self.names[i], op=self.ops[i], module=self.modules[i],
            fwd_flops=float(self.fwd_flops[i]), bwd_flops=float(self.bwd_flops[i]),
            param_bytes=int(self.param_bytes[i]), output_bytes=int(self.output_bytes[i]),
            weight=float(self.weight[i]), fwd_seconds=opt(self.fwd_seconds),
            bwd_seconds=opt(self.bwd_seconds), memory_bytes=opt(self.memory_bytes),
            param_tensors=opt(self.param_tensors),
            space=None if self.spaces is None else self.spaces[i],
            extra={} if self.node_extra is None else self.node_extra[i],
        )

    @property
    def nodes(self) -> list[Node]:
        return [self.node(i) for i in range(self.num_nodes)]

    @property
    def edges(self) -> list[Edge]:
        return [Edge(int(s), int(d), int(b))
                for s, d, b in zip(self.src, self.dst, self.edge_bytes, strict=True)]

    # ------------------------------------------------------------------ adjacency
    @cached_property
    def _adjacency(self) -> sp.csr_matrix:
        n = self.num_nodes
        return sp.csr_matrix((np.ones(self.num_edges, dtype=np.int8), (self.src, self.dst)),
                             shape=(n, n))

    @cached_property
    def _succ_csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(indptr, successor ids, edge ids) sorted by source; duplicates kept."""
        order = np.argsort(self.src, kind="stable")
        indptr = np.zeros(self.num_nodes + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.src, minlength=self.num_nodes), out=indptr[1:])
        return _readonly(indptr), _readonly(self.dst[order]), _readonly(order)

    @cached_property
    def _pred_csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        order = np.argsort(self.dst, kind="stable")
        indptr = np.zeros(self.num_nodes + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.dst, minlength=self.num_nodes), out=indptr[1:])
        return _readonly(indptr), _readonly(self.src[order]), _readonly(order)

    def successors(self, i: int) -> np.ndarray:
        """Ids of the nodes that ``i`` has an edge to (sorted by edge order; O(out-degree))."""
        indptr, idx, _ = self._succ_csr
        return idx[indptr[i]:indptr[i + 1]]

    def predecessors(self, i: int) -> np.ndarray:
        """Ids of the nodes with an edge to ``i`` (O(in-degree))."""
        indptr, idx, _ = self._pred_csr
        return idx[indptr[i]:indptr[i + 1]]

    def out_edges(self, i: int) -> np.ndarray:
        """Edge ids leaving ``i``."""
        indptr, _, eid = self._succ_csr
        return eid[indptr[i]:indptr[i + 1]]

    def in_edges(self, i: int) -> np.ndarray:
        """Edge ids entering ``i``."""
        indptr, _, eid = self._pred_csr
        return eid[indptr[i]:indptr[i + 1]]

    @cached_property
    def in_degree(self) -> np.ndarray:
        return _readonly(np.bincount(self.dst, minlength=self.num_nodes))

    @cached_property
    def out_degree(self) -> np.ndarray:
        return _readonly(np.bincount(self.src, minlength=self.num_nodes))

    def sources(self) -> np.ndarray:
        """Nodes without predecessors."""
        return np.flatnonzero(self.in_degree == 0)

    def sinks(self) -> np.ndarray:
        """Nodes without successors."""
        return np.flatnonzero(self.out_degree == 0)

    # ------------------------------------------------------------------ order
    @cached_property
    def topological_order(self) -> np.ndarray:
        """A topological order of the node ids (read-only array).

        When every edge already goes from a smaller to a larger id (as in captured and
        generated graphs) this is the identity; otherwise Kahn's algorithm with a FIFO queue
        (ties in id order). O(n + m).
        """
        n = self.num_nodes
        if self.num_edges == 0 or bool(np.all(self.src < self.dst)):
            return _readonly(np.arange(n, dtype=np.int64))
        indptr, idx, _ = self._succ_csr
        ptr, succ = indptr.tolist(), idx.tolist()
        indeg = self.in_degree.tolist()
        order = [v for v in range(n) if indeg[v] == 0]
        head = 0
        while head < len(order):
            v = order[head]
            head += 1
            for w in succ[ptr[v]:ptr[v + 1]]:
                indeg[w] -= 1
                if indeg[w] == 0:
                    order.append(w)
        assert len(order) == n, "topological order of a cyclic graph"
        return _readonly(np.array(order, dtype=np.int64))

    @cached_property
    def levels(self) -> np.ndarray:
        """Longest-path distance (in edges) from a source, per node. O(n + m)."""
        rank = self.topological_rank
        order = np.argsort(rank[self.src], kind="stable")
        level = [0] * self.num_nodes
        for s, d in zip(self.src[order].tolist(), self.dst[order].tolist(), strict=True):
            if level[s] + 1 > level[d]:
                level[d] = level[s] + 1
        return _readonly(np.array(level, dtype=np.int64))

    @cached_property
    def topological_rank(self) -> np.ndarray:
        """``rank[v]`` = position of ``v`` in :attr:`topological_order`."""
        rank = np.empty(self.num_nodes, dtype=np.int64)
        rank[self.topological_order] = np.arange(self.num_nodes)
        return _readonly(rank)

    # ------------------------------------------------------------------ queries
    def reachable(self, start: Iterable[int] | np.ndarray, *, reverse: bool = False,
                  within: np.ndarray | None = None) -> np.ndarray:
        """Boolean mask of nodes reachable from ``start`` (excluding ``start`` unless reached).

        ``within`` (a boolean mask) restricts the search to those nodes. Frontier-vectorised
        breadth-first search, O(n + m).
        """
        indptr, idx, _ = self._pred_csr if reverse else self._succ_csr
        n = self.num_nodes
        seen = np.zeros(n, dtype=bool)
        frontier = np.unique(np.asarray(list(start) if not isinstance(start, np.ndarray)
                                        else start, dtype=np.int64))
        while frontier.size:
            nxt = _frontier_expand(indptr, idx, frontier)
            if within is not None:
                nxt = nxt[within[nxt]]
            nxt = np.unique(nxt)
            nxt = nxt[~seen[nxt]]
            seen[nxt] = True
            frontier = nxt
        return seen

    def is_convex(self, nodes: Iterable[int] | np.ndarray) -> bool:
        """Whether the node set is convex: no path leaves it and comes back.

        A set S is convex when every path between two nodes of S stays in S. Equivalently, no
        node outside S is both reachable from S and able to reach S. Only nodes whose
        topological rank lies between S's smallest and largest rank can be such a node, so the
        search is restricted to that window. O(n + m) worst case.
        """
        idx = np.unique(np.asarray(list(nodes) if not isinstance(nodes, np.ndarray) else nodes,
                                   dtype=np.int64))
        if idx.size <= 1:
            return True
        n = self.num_nodes
        in_s = np.zeros(n, dtype=bool)
        in_s[idx] = True
        rank = self.topological_rank
        lo, hi = rank[idx].min(), rank[idx].max()
        window = (rank > lo) & (rank < hi) & ~in_s
        indptr, succ, _ = self._succ_csr
        out = _frontier_expand(indptr, succ, idx)
        out = np.unique(out[window[out]])
        if out.size == 0:
            return True
        down = self.reachable(out, within=window)
        down[out] = True
        # Does any node reached from S (outside S) have an edge back into S?
        reached = np.flatnonzero(down)
        back = _frontier_expand(indptr, succ, reached)
        return not bool(in_s[back].any())

    def stage_adjacency(self, assignment: Sequence[int] | np.ndarray,
                        num_stages: int | None = None) -> np.ndarray:
        """Which stages an edge goes between: ``A[a, b]`` is True when some edge runs from a
        node of stage a to a node of stage b (zero-byte edges too). Shape (k, k), False
        diagonal. O(m + k^2)."""
        a = np.asarray(assignment, dtype=np.int64)
        if a.shape != (self.num_nodes,):
            raise ValueError(f"assignment must have one entry per node ({self.num_nodes})")
        k = int(a.max()) + 1 if num_stages is None and a.size else int(num_stages or 0)
        adj = np.zeros((k, k), dtype=bool)
        adj[a[self.src], a[self.dst]] = True
        np.fill_diagonal(adj, False)
        return adj

    def stage_order(self, assignment: Sequence[int] | np.ndarray,
                    num_stages: int | None = None) -> tuple[int, ...]:
        """The stages of a partition in pipeline order: a topological order of the stage
        graph, ties by stage id (so a monotone partition keeps its own order). Raises
        :class:`~shardplan.errors.ShardplanError` when the stages depend on each other in a
        cycle (no pipeline can run them). O(m + k^2 log k).

        Examples
        --------
        >>> g = Graph.from_arrays(name="g", fwd_flops=[1, 1, 1], src=[0, 1], dst=[1, 2])
        >>> g.stage_order([2, 0, 1])
        (2, 0, 1)
        """
        import heapq

        adj = self.stage_adjacency(assignment, num_stages)
        k = adj.shape[0]
        indeg = adj.sum(axis=0)
        ready = [s for s in range(k) if indeg[s] == 0]
        heapq.heapify(ready)
        order: list[int] = []
        while ready:
            s = heapq.heappop(ready)
            order.append(s)
            for t in np.flatnonzero(adj[s]):
                indeg[t] -= 1
                if indeg[t] == 0:
                    heapq.heappush(ready, int(t))
        if len(order) < k:
            raise ShardplanError("the plan's stages depend on each other in a cycle: no "
                                 "pipeline schedule can run them")
        return tuple(order)

    def stage_graph(self, assignment: Sequence[int] | np.ndarray,
                    num_stages: int | None = None) -> np.ndarray:
        """Inter-stage bytes of a partition: ``B[a, b]`` = bytes on edges from stage a to b.

        Parameters
        ----------
        assignment : array of int, shape (n,)
            Stage id of every node.
        num_stages : int, optional
            Number of stages (default: ``max(assignment) + 1``).

        Returns
        -------
        ndarray of float64, shape (k, k)
            Zero diagonal. O(m + k^2).
        """
        a = np.asarray(assignment, dtype=np.int64)
        if a.shape != (self.num_nodes,):
            raise ValueError(f"assignment must have one entry per node ({self.num_nodes})")
        k = int(a.max()) + 1 if num_stages is None and a.size else int(num_stages or 0)
        sa, da = a[self.src], a[self.dst]
        cross = sa != da
        mat = np.zeros((k, k), dtype=np.float64)
        np.add.at(mat, (sa[cross], da[cross]), self.edge_bytes[cross].astype(np.float64))
        return mat

    def is_acyclic_partition(self, assignment: Sequence[int] | np.ndarray) -> bool:
        """Whether the stage graph of a partition is acyclic (so stages can be pipelined)."""
        a = np.asarray(assignment, dtype=np.int64)
        k = int(a.max()) + 1 if a.size else 0
        if k <= 1:
            return True
        sa, da = a[self.src], a[self.dst]
        cross = sa != da
        links = sp.csr_matrix((np.ones(int(cross.sum()), dtype=np.int8),
                               (sa[cross], da[cross])), shape=(k, k))
        ncomp, _ = connected_components(links, directed=True, connection="strong")
        return ncomp == k

    def lower_bounds(self, num_devices: int, *, flops_per_second: float | None = None
                     ) -> dict[str, float]:
        """Lower bounds on the per-device work of any partition onto ``num_devices``.

        Work is forward + backward FLOPs (or seconds, when ``flops_per_second`` is given and
        converts). Returns ``{"average": total / D, "largest_node": max node,
        "bound": max of both}``: no stage can do less than the largest indivisible node, and
        some device does at least the average.
        """
        if num_devices < 1:
            raise ValueError("num_devices must be at least 1")
        work = self.fwd_flops + self.bwd_flops
        if flops_per_second:
            work = work / flops_per_second
        total = float(work.sum())
        largest = float(work.max()) if work.size else 0.0
        avg = total / num_devices
        return {"average": avg, "largest_node": largest, "bound": max(avg, largest)}

    def __repr__(self) -> str:
        """One short line (the default dataclass repr lists every column). O(n)."""
        return (f"Graph(name={self.name!r}, nodes={self.num_nodes}, edges={self.num_edges}, "
                f"batch_size={self.batch_size}, fwd_flops={float(self.fwd_flops.sum()):.4g}, "
                f"param_bytes={int(self.param_bytes.sum())})")

    def _repr_html_(self) -> str:
        """A small table for notebooks: sizes, totals and the most frequent operators."""
        from html import escape

        info = self.summary()
        rows = [("nodes", info["nodes"]), ("edges", info["edges"]),
                ("batch size", info["batch_size"]),
                ("forward FLOPs", f"{info['fwd_flops']:.4g}"),
                ("parameter bytes", f"{info['param_bytes']:,}"),
                ("activation bytes", f"{info['activation_bytes']:,}"),
                ("depth", info["depth"]),
                ("top operators", ", ".join(f"{op} x{c}" for op, c in info["top_ops"].items()))]
        body = "".join(f"<tr><th style='text-align:left'>{escape(str(k))}</th>"
                       f"<td style='text-align:left'>{escape(str(v))}</td></tr>"
                       for k, v in rows)
        return f"<table><caption>graph {escape(self.name)}</caption>{body}</table>"

    def summary(self) -> dict[str, Any]:
        """Sizes, totals and lower bounds, for ``shardplan inspect``."""
        ops, counts = np.unique(np.array(self.ops, dtype=object), return_counts=True)
        top = sorted(zip(counts.tolist(), ops.tolist(), strict=True), reverse=True)[:8]
        return {
            "kind": "graph",
            "name": self.name,
            "batch_size": int(self.batch_size),
            "nodes": self.num_nodes,
            "edges": self.num_edges,
            "fwd_flops": float(self.fwd_flops.sum()),
            "bwd_flops": float(self.bwd_flops.sum()),
            "param_bytes": int(self.param_bytes.sum()),
            "activation_bytes": int(self.output_bytes.sum()),
            "edge_bytes": int(self.edge_bytes.sum()),
            "depth": int(self.levels.max()) + 1 if self.num_nodes else 0,
            "measured_seconds": self.fwd_seconds is not None,
            "largest_node_flops": float((self.fwd_flops + self.bwd_flops).max())
            if self.num_nodes else 0.0,
            "top_ops": {op: c for c, op in top},
        }

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """The ``shardplan.graph/1`` JSON object."""
        nodes: list[dict[str, Any]] = []
        fwd, bwd = self.fwd_flops.tolist(), self.bwd_flops.tolist()
        pb, ob, w = self.param_bytes.tolist(), self.output_bytes.tolist(), self.weight.tolist()
        opt = {c: getattr(self, c).tolist() for c in _OPTIONAL_FLOAT_COLUMNS
               if getattr(self, c) is not None}
        for i in range(self.num_nodes):
            d: dict[str, Any] = {"id": i, "name": self.names[i], "op": self.ops[i],
                                 "module": self.modules[i], "fwd_flops": fwd[i],
                                 "bwd_flops": bwd[i], "param_bytes": pb[i],
                                 "output_bytes": ob[i], "weight": w[i]}
            for c, vals in opt.items():
                if not math.isnan(vals[i]):
                    d[c] = vals[i]
            if self.spaces is not None and self.spaces[i] is not None:
                d["space"] = self.spaces[i]
            if self.node_extra is not None:
                for k, v in self.node_extra[i].items():
                    d.setdefault(k, v)
            nodes.append(d)
        edges = [{"src": s, "dst": t, "bytes": b} for s, t, b in
                 zip(self.src.tolist(), self.dst.tolist(), self.edge_bytes.tolist(), strict=True)]
        out: dict[str, Any] = {"format": GRAPH_FORMAT, "name": self.name,
                               "batch_size": int(self.batch_size), "nodes": nodes,
                               "edges": edges}
        for k, v in self.meta.items():
            out.setdefault(k, v)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Graph:
        """Parse and validate a ``shardplan.graph/1`` object (unknown fields are kept)."""
        if not isinstance(data, Mapping):
            raise InvalidFileError("a graph must be a JSON object")
        fmt = data.get("format")
        if fmt != GRAPH_FORMAT:
            raise InvalidFileError(f"expected format {GRAPH_FORMAT!r}, got {fmt!r}")
        raw_nodes, raw_edges = data.get("nodes"), data.get("edges", [])
        if not isinstance(raw_nodes, list) or not isinstance(raw_edges, list):
            raise InvalidFileError("graph 'nodes' and 'edges' must be lists")
        n = len(raw_nodes)
        if n == 0:
            raise InvalidFileError("a graph needs at least one node (this one has none)")
        cols: dict[str, list[Any]] = {c: [] for c in (*_FLOAT_COLUMNS, *_INT_COLUMNS,
                                                      *_OPTIONAL_FLOAT_COLUMNS)}
        names, ops, modules, spaces, extras = [], [], [], [], []
        for i, nd in enumerate(raw_nodes):
            if not isinstance(nd, Mapping):
                raise InvalidFileError(f"node {i} is not an object")
            if nd.get("id", i) != i:
                raise InvalidFileError(f"node at position {i} has id {nd.get('id')!r}: ids "
                                       f"must equal positions")
            names.append(str(nd.get("name", f"n{i}")))
            ops.append(str(nd.get("op", "op")))
            modules.append(str(nd.get("module", "")))
            try:
                for c in ("fwd_flops", "bwd_flops", "param_bytes", "output_bytes"):
                    v = nd.get(c, 0)
                    if isinstance(v, bool) or not isinstance(v, (int, float)):
                        raise TypeError(c)
                    cols[c].append(v)
                pbytes = cols["param_bytes"][-1]
                w = nd.get("weight", pbytes / 4.0)
                if isinstance(w, bool) or not isinstance(w, (int, float)):
                    raise TypeError("weight")
                cols["weight"].append(w)
                for c in _OPTIONAL_FLOAT_COLUMNS:
                    v = nd.get(c)
                    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                        raise TypeError(c)
                    if v is not None and not math.isfinite(v):  # a literal NaN or Infinity
                        raise InvalidFileError(f"node {i} has a non-finite {c}: {v!r} (leave it "
                                               f"out, or null, when it is not known)")
                    cols[c].append(math.nan if v is None else v)
            except TypeError as exc:
                raise InvalidFileError(f"node {i} has a non-numeric {exc.args[0]!r}") from None
            space = nd.get("space")
            if space is not None and not isinstance(space, Mapping):
                raise InvalidFileError(f"node {i} has a 'space' that is not an object")
            spaces.append(space)
            extras.append({k: v for k, v in nd.items() if k not in _NODE_KEYS})
        src, dst, eb = [], [], []
        for e, ed in enumerate(raw_edges):
            if not isinstance(ed, Mapping) or "src" not in ed or "dst" not in ed:
                raise InvalidFileError(f"edge {e} must be an object with 'src' and 'dst'")
            s, t, b = ed["src"], ed["dst"], ed.get("bytes", 0)
            if not all(isinstance(x, int) and not isinstance(x, bool) for x in (s, t)):
                raise InvalidFileError(f"edge {e} has non-integer endpoints {s!r} -> {t!r}")
            if isinstance(b, bool) or not isinstance(b, (int, float)):
                raise InvalidFileError(f"edge {e} has non-numeric bytes {b!r}")
            src.append(s)
            dst.append(t)
            eb.append(b)
        batch = data.get("batch_size", 1)
        known = {"format", "name", "batch_size", "nodes", "edges"}
        return cls(
            name=str(data.get("name", "graph")), batch_size=batch,
            names=tuple(names), ops=tuple(ops), modules=tuple(modules),
            fwd_flops=np.array(cols["fwd_flops"], dtype=np.float64).reshape(n),
            bwd_flops=np.array(cols["bwd_flops"], dtype=np.float64).reshape(n),
            param_bytes=np.array(cols["param_bytes"], dtype=np.float64).reshape(n),
            output_bytes=np.array(cols["output_bytes"], dtype=np.float64).reshape(n),
            weight=np.array(cols["weight"], dtype=np.float64).reshape(n),
            src=np.array(src, dtype=np.float64), dst=np.array(dst, dtype=np.float64),
            edge_bytes=np.array(eb, dtype=np.float64),
            **{c: (np.array(cols[c], dtype=np.float64)
                   if any(not math.isnan(v) for v in cols[c]) else None)
               for c in _OPTIONAL_FLOAT_COLUMNS},
            spaces=tuple(spaces) if any(s is not None for s in spaces) else None,
            node_extra=tuple(extras) if any(extras) else None,
            meta={k: v for k, v in data.items() if k not in known},
        )
