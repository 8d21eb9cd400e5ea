r"""Import PipeDream profiles (``graph.txt``, also read by DAPPLE and Piper) as graphs.

The format: one line per node, then one tab-indented line per edge::

    node4 -- Conv2d(64, 64, kernel_size=(3, 3)) -- forward_compute_time=0.900, backward_compute_time=1.850, activation_size=6422528.000, parameter_size=147456.000
    node9 -- ReLU(inplace) -- forward_compute_time=0.040, ... -- stage_id=1
    \tnode4 -- node9

Times are milliseconds measured at the profiling batch size; ``activation_size`` (the node's
output, bytes; a ``[a; b]`` list for several outputs, summed) and ``parameter_size`` are bytes.
A partitioned profile ends node lines with ``-- stage_id=N``.

PipeDream's optimizer (``optimizer/optimizer_graph_hierarchical.py``) removes two kinds of nodes
before it searches: the sources whose description starts with ``Input`` (data loading: their
time is not model compute, and the input always lives on the first stage) and the sinks whose
description starts with ``__getitem__`` (tuple unpacking left over by the tracer). The
importer does the same by default and records what it dropped in the graph's ``meta``
(``dropped_on_import``, which ``shardplan inspect`` shows); ``keep_inputs=True`` keeps them.
"""  # noqa: E501

from __future__ import annotations

import heapq
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from shardplan.errors import InvalidFileError
from shardplan.ir import Graph
from shardplan.ir.io import read_text

__all__ = ["load_pipedream", "parse_pipedream"]

_SEP = " -- "
_FIELDS = ("forward_compute_time", "backward_compute_time", "activation_size",
           "parameter_size")
_PAIR = re.compile(r"\s*([A-Za-z_]\w*)\s*=\s*(\[[^\]]*\]|[^,\[\]]*)\s*(?:,|$)")
_OP = re.compile(r"[A-Za-z_][\w.]*")


def _natural_key(node_id: str) -> tuple[object, ...]:
    """``node2`` before ``node10``: digit runs compare as numbers."""
    parts = re.split(r"(\d+)", node_id)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts))


def _number(text: str, what: str, where: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise InvalidFileError(f"{where}: {what} is not a number: {text.strip()!r}") from None
    if not math.isfinite(v) or v < 0:
        raise InvalidFileError(f"{where}: {what} must be finite and >= 0, got {text.strip()!r}")
    return v


def _parse_metadata(text: str, where: str) -> dict[str, float]:
    pos, out = 0, {}
    text = text.strip()
    while pos < len(text):
        m = _PAIR.match(text, pos)
        if m is None or m.end() == pos:
            raise InvalidFileError(f"{where}: cannot read the fields {text[pos:][:40]!r} "
                                   f"(expected key=value, key=value, ...)")
        key, raw = m.group(1), m.group(2)
        pos = m.end()
        if key not in _FIELDS:
            continue  # a field some fork added: ignored
        if raw.startswith("["):
            items = [x for x in re.split(r"[;,]", raw[1:-1]) if x.strip()]
            out[key] = sum(_number(x, key, where) for x in items)
        else:
            out[key] = _number(raw, key, where)
    missing = [f for f in _FIELDS if f not in out]
    if missing:
        raise InvalidFileError(f"{where}: node line lacks {', '.join(missing)}")
    return out


def _op_of(description: str) -> str:
    """The layer type word of a description: ``Conv2d(3, 64, ...)`` -> ``Conv2d``."""
    m = _OP.match(description.strip())
    return m.group(0).rsplit(".", 1)[-1] if m else "op"


def _dropped(ids: list[str], descs: list[str], src: np.ndarray, dst: np.ndarray
             ) -> dict[int, str]:
    """The nodes PipeDream's optimizer removes: ``Input`` sources, then the ``__getitem__``
    sinks of what is left (once, as PipeDream does). ``{node: reason}``. O(n + m)."""
    n = len(ids)
    indeg = np.bincount(dst, minlength=n)
    out: dict[int, str] = {v: "input" for v in range(n)
                           if indeg[v] == 0 and descs[v].startswith("Input")}
    if out:
        gone = np.zeros(n, dtype=bool)
        gone[list(out)] = True
        keep = ~gone[src] & ~gone[dst]
        outdeg = np.bincount(src[keep], minlength=n)
    else:
        gone = np.zeros(n, dtype=bool)
        outdeg = np.bincount(src, minlength=n)
    for v in range(n):
        if not gone[v] and outdeg[v] == 0 and descs[v].startswith("__getitem__"):
            out[v] = "getitem sink"
    return out


def parse_pipedream(text: str, *, name: str = "pipedream", batch_size: int = 1,
                    source: str = "<profile>", keep_inputs: bool = False) -> Graph:
    """Parse the text of a PipeDream profile into a :class:`Graph`.

    Nodes are renumbered ``0..n-1`` in a topological order (Kahn's algorithm, ties broken by
    the natural order of the original ids, so ``node2`` comes before ``node10``); the original
    id becomes the node's ``name``. The description becomes its ``module`` and its layer type
    word (``Conv2d``) its ``op``. Measured times become ``fwd_seconds``/``bwd_seconds``
    (milliseconds / 1000); FLOPs are unknown and set to 0. ``activation_size`` becomes
    ``output_bytes`` and the bytes of every edge leaving the node; ``parameter_size``
    becomes ``param_bytes`` and ``weight`` the parameter count assuming 4-byte parameters (the
    contract's default). A ``stage_id`` is kept as the node field ``pipedream_stage_id``.

    Parameters
    ----------
    text : str
        The profile.
    name : str
        Graph name.
    batch_size : int
        Batch size the profile was taken at (the format does not record it).
    source : str
        File name used in error messages.
    keep_inputs : bool
        Keep the ``Input`` sources and ``__getitem__`` sinks that PipeDream's optimizer
        removes (see the module docstring); by default they are dropped and listed in
        ``meta["dropped_on_import"]``.

    Returns
    -------
    Graph

    Raises
    ------
    InvalidFileError
        A malformed line (with its number), a repeated node id, an edge naming an unknown
        node, no node at all (or none left once the input nodes are dropped), or a cycle.

    Notes
    -----
    PipeDream's own reader splits node lines on ``" -- "`` and takes the third piece as the
    fields; we accept descriptions that themselves contain ``" -- "`` by taking the last
    piece that starts with ``forward_compute_time=`` as the fields. Fields other than the four
    above are ignored. A repeated edge is kept once. Blank lines are skipped; an edge line is
    any line starting with whitespace. O((n + m) log n).

    Examples
    --------
    >>> g = parse_pipedream(
    ...     "node1 -- Input -- forward_compute_time=1.0, backward_compute_time=0.0, "
    ...     "activation_size=8.0, parameter_size=0.0\\n"
    ...     "node2 -- Linear(in_features=2, out_features=2, bias=True) -- "
    ...     "forward_compute_time=0.5, backward_compute_time=1.5, activation_size=8.0, "
    ...     "parameter_size=24.0\\n"
    ...     "node3 -- ReLU() -- forward_compute_time=0.1, backward_compute_time=0.1, "
    ...     "activation_size=8.0, parameter_size=0.0\\n"
    ...     "\\tnode1 -- node2\\n\\tnode2 -- node3\\n")
    >>> g.names, g.ops, g.fwd_seconds.tolist(), g.edge_bytes.tolist()
    (('node2', 'node3'), ('Linear', 'ReLU'), [0.0005, 0.0001], [8])
    >>> g.meta["dropped_on_import"][0]["name"]
    'node1'
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
            or batch_size < 1:
        raise InvalidFileError(f"batch_size must be a positive integer, got {batch_size!r}")
    ids: list[str] = []
    index: dict[str, int] = {}
    descs: list[str] = []
    fields: list[dict[str, float]] = []
    stages: list[int | None] = []
    raw_edges: list[tuple[str, str, int]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        where = f"{source} line {lineno}"
        if not line.strip():
            continue
        if line[0] in " \t":
            parts = line.strip().split(_SEP)
            if len(parts) != 2 or not all(p.strip() and " " not in p.strip() for p in parts):
                raise InvalidFileError(f"{where}: expected an edge 'nodeA -- nodeB', got "
                                       f"{line.strip()[:60]!r}")
            raw_edges.append((parts[0].strip(), parts[1].strip(), lineno))
            continue
        parts = line.strip().split(_SEP)
        meta_at = max((i for i, p in enumerate(parts) if i >= 1 and
                       p.lstrip().startswith("forward_compute_time=")), default=-1)
        if len(parts) < 3 or meta_at < 2:
            raise InvalidFileError(f"{where}: expected 'nodeN -- description -- "
                                   f"forward_compute_time=MS, ...', got {line.strip()[:60]!r}")
        node_id = parts[0].strip()
        if not node_id or any(c.isspace() for c in node_id):
            raise InvalidFileError(f"{where}: bad node id {node_id!r}")
        if node_id in index:
            raise InvalidFileError(f"{where}: node {node_id!r} is defined twice")
        stage: int | None = None
        for extra in parts[meta_at + 1:]:
            key, _, value = extra.partition("=")
            if key.strip() != "stage_id":
                raise InvalidFileError(f"{where}: unexpected field {extra.strip()[:40]!r} "
                                       f"after the times and sizes")
            try:
                stage = int(value)
            except ValueError:
                raise InvalidFileError(f"{where}: stage_id is not an integer: "
                                       f"{value.strip()!r}") from None
        index[node_id] = len(ids)
        ids.append(node_id)
        descs.append(_SEP.join(parts[1:meta_at]).strip())
        fields.append(_parse_metadata(parts[meta_at], where))
        stages.append(stage)
    n = len(ids)
    if n == 0:
        raise InvalidFileError(f"{source}: no node lines (expected 'nodeN -- description -- "
                               f"forward_compute_time=MS, ...')")

    pairs: dict[tuple[int, int], None] = {}
    for a, b, lineno in raw_edges:
        for end in (a, b):
            if end not in index:
                raise InvalidFileError(f"{source} line {lineno}: edge {a} -- {b} names "
                                       f"unknown node {end!r}")
        if a == b:
            raise InvalidFileError(f"{source} line {lineno}: edge {a} -- {b} is a self loop: "
                                   f"the profile must be a DAG")
        pairs.setdefault((index[a], index[b]), None)
    src = np.array([p[0] for p in pairs], dtype=np.int64)
    dst = np.array([p[1] for p in pairs], dtype=np.int64)

    order = _topological_order(ids, src, dst, source)
    meta: dict[str, Any] = {"imported_from": "pipedream"}
    if not keep_inputs:
        drop = _dropped(ids, descs, src, dst)
        if drop:
            if len(drop) == n:
                raise InvalidFileError(f"{source}: every node is an Input or __getitem__ node "
                                       "(nothing is left to partition; keep them with "
                                       "--keep-inputs)")
            meta["dropped_on_import"] = [
                {"name": ids[v], "description": descs[v], "reason": drop[v],
                 "fwd_seconds": fields[v]["forward_compute_time"] / 1e3,
                 "bwd_seconds": fields[v]["backward_compute_time"] / 1e3}
                for v in order if v in drop]
            order = [v for v in order if v not in drop]
            keep = np.array([a not in drop and b not in drop
                             for a, b in zip(src.tolist(), dst.tolist(), strict=True)],
                            dtype=bool)
            src, dst = src[keep], dst[keep]
    n = len(order)
    new_id = np.full(len(ids), -1, dtype=np.int64)
    new_id[order] = np.arange(n)
    src, dst = new_id[src], new_id[dst]
    e_order = np.lexsort((dst, src))
    src, dst = src[e_order], dst[e_order]

    def col(key: str) -> np.ndarray:
        return np.array([fields[i][key] for i in order], dtype=np.float64)

    out_bytes = np.rint(col("activation_size")).astype(np.int64)
    param_bytes = np.rint(col("parameter_size")).astype(np.int64)
    node_extra: tuple[dict[str, Any], ...] | None = None
    if any(s is not None for s in stages):
        node_extra = tuple({} if stages[i] is None else {"pipedream_stage_id": stages[i]}
                      for i in order)
    zeros = np.zeros(n, dtype=np.float64)
    return Graph.from_arrays(
        name=name, batch_size=int(batch_size), fwd_flops=zeros, bwd_flops=zeros,
        src=src, dst=dst, edge_bytes=out_bytes[src], param_bytes=param_bytes,
        output_bytes=out_bytes, names=[ids[i] for i in order],
        ops=[_op_of(descs[i]) for i in order], modules=[descs[i] for i in order],
        fwd_seconds=col("forward_compute_time") / 1e3,
        bwd_seconds=col("backward_compute_time") / 1e3,
        node_extra=node_extra, meta=meta,
    )


def _topological_order(ids: list[str], src: np.ndarray, dst: np.ndarray,
                       source: str) -> list[int]:
    """Kahn's algorithm with a heap on the natural order of the ids; a cycle is an error."""
    n = len(ids)
    succ: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    for a, b in zip(src.tolist(), dst.tolist(), strict=True):
        succ[a].append(b)
        indeg[b] += 1
    keys = [_natural_key(x) for x in ids]
    heap = [(keys[v], v) for v in range(n) if indeg[v] == 0]
    heapq.heapify(heap)
    order: list[int] = []
    while heap:
        _, v = heapq.heappop(heap)
        order.append(v)
        for w in succ[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                heapq.heappush(heap, (keys[w], w))
    if len(order) < n:
        adj = sp.csr_matrix((np.ones(src.size, dtype=np.int8), (src, dst)), shape=(n, n))
        _, labels = connected_components(adj, directed=True, connection="strong")
        counts = np.bincount(labels)
        cyc = sorted((ids[v] for v in np.flatnonzero(counts[labels] > 1)), key=_natural_key)
        more = " ..." if len(cyc) > 5 else ""
        raise InvalidFileError(f"{source}: the profile has a cycle through "
                               f"{', '.join(cyc[:5])}{more}: it must be a DAG")
    return order


def load_pipedream(path: str | os.PathLike[str], *, name: str | None = None,
                   batch_size: int = 1, keep_inputs: bool = False) -> Graph:
    """Read a PipeDream profile file (see :func:`parse_pipedream`, ``keep_inputs`` included).

    The graph is named after the file (``vgg16.txt`` -> ``vgg16``) unless ``name`` is given.
    Any unreadable file is a one-line :class:`InvalidFileError`.
    """
    p = Path(path)
    text = read_text(p)
    return parse_pipedream(text, name=name or p.stem, batch_size=batch_size, source=str(path),
                           keep_inputs=keep_inputs)
