"""Module-level capture: contract an operator graph onto the user's atomic modules.

Paper 000, section 3.2: the user names the submodule types that are the smallest unit of
sharding; every *instance* of those types becomes one vertex, the vertices are connected by
edges weighted by how many nodes lie between them on shortest paths of the traced graph, and a
DAG is made of the result. See :func:`fold_modules` for what we decided where the paper is
silent.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from shardplan.capture._export import OpCapture
from shardplan.errors import ShardplanError
from shardplan.ir import Graph

__all__ = ["atomic_instances", "fold_modules"]

_INF = float("inf")


def _norm_type(name: str) -> str:
    return name.strip().split(".")[-1]


def atomic_instances(cap: OpCapture, atomic: Sequence[str]) -> list[str | None]:
    """Per op, the path of its outermost enclosing atomic module instance (None outside all).

    Raises
    ------
    ShardplanError
        When a named type encloses no operator of the model (the message lists the types
        that do).
    """
    wanted = {_norm_type(a) for a in atomic if a.strip()}
    if not wanted:
        raise ShardplanError("--atomic needs at least one module type, such as Linear")
    present = {typ for stack in cap.stacks for _, typ in stack}
    missing = sorted(wanted - present)
    if missing:
        raise ShardplanError(f"atomic module type {missing[0]!r} is not in the model "
                             f"(its module types: {', '.join(sorted(present))})")
    out: list[str | None] = []
    for stack in cap.stacks:
        inst = next((fqn for fqn, typ in stack if typ in wanted), None)
        out.append(inst)
    return out


def _assign(n: int, succ: list[list[int]], pred: list[list[int]], inst_group: list[int],
            rank: list[int]) -> list[int]:
    """Group of every op: atomic ops keep theirs, the others fold into a neighbour group.

    A non-atomic op joins the earliest-starting atomic group reachable downstream of it; an op
    with no atomic group downstream joins the latest-starting group among its producers' (or,
    with no producer group either, the earliest among its consumers'; the two rules repeat
    until nothing changes). A connected piece of ops still without a group has no edge to a
    grouped op: it joins, whole, the group of its program neighbour.
    Every op edge ``u -> v`` then goes from a group that starts no later than ``v``'s, so
    folding itself never creates a cycle; only atomic instances that interleave do.
    """
    by_rank = {r: g for g, r in enumerate(rank)}
    reach = [_INF] * n  # smallest group rank reachable downstream (any path)
    for i in range(n - 1, -1, -1):
        best = _INF
        for v in succ[i]:
            if inst_group[v] >= 0:
                best = min(best, rank[inst_group[v]])
            best = min(best, reach[v])
        reach[i] = best
    group = list(inst_group)
    for i in range(n):
        if group[i] < 0 and reach[i] < _INF:
            group[i] = by_rank[int(reach[i])]
    changed = True
    while changed:  # to a fixed point: one rule can enable the other
        changed = False
        for i in range(n):  # nothing atomic downstream: the latest producer group
            if group[i] < 0:
                ranks = [rank[group[u]] for u in pred[i] if group[u] >= 0]
                if ranks:
                    group[i] = by_rank[max(ranks)]
                    changed = True
        for i in range(n - 1, -1, -1):  # no producer group either: the earliest consumer's
            if group[i] < 0:
                ranks = [rank[group[v]] for v in succ[i] if group[v] >= 0]
                if ranks:
                    group[i] = by_rank[min(ranks)]
                    changed = True
    # What is left are whole weakly connected pieces with no edge to a grouped op (buffer
    # updates and the like): each piece goes, as one, to the group of the op nearest its
    # first op in program order, so that no edge of the piece crosses groups.
    for i in range(n):
        if group[i] >= 0:
            continue
        piece, stack = [], [i]
        seen = {i}
        while stack:
            u = stack.pop()
            piece.append(u)
            for w in (*pred[u], *succ[u]):
                if w not in seen and group[w] < 0:
                    seen.add(w)
                    stack.append(w)
        target = 0
        for d in range(1, n):
            hits = [j for j in (i - d, i + d) if 0 <= j < n and group[j] >= 0]
            if hits:
                target = group[hits[0]]
                break
        for u in piece:
            group[u] = target
    return group


def _hops(n: int, succ: list[list[int]], inst_group: list[int], num_groups: int
          ) -> dict[tuple[int, int], int]:
    """Fewest non-atomic ops on a path from atomic group a to b avoiding other atomic ops."""
    members: list[list[int]] = [[] for _ in range(num_groups)]
    for i, g in enumerate(inst_group):
        if g >= 0:
            members[g].append(i)
    out: dict[tuple[int, int], int] = {}
    for a in range(num_groups):
        dist = {i: 0 for i in members[a]}
        queue = deque(members[a])
        while queue:
            u = queue.popleft()
            for v in succ[u]:
                b = inst_group[v]
                if b == a:
                    continue
                if b >= 0:
                    out[(a, b)] = min(out.get((a, b), n), dist[u])
                elif v not in dist:
                    dist[v] = dist[u] + 1
                    queue.append(v)
    return out


def _common_prefix(paths: Sequence[str]) -> str:
    parts = [p.split(".") if p else [] for p in paths]
    common: list[str] = []
    for items in zip(*parts, strict=False):
        if all(x == items[0] for x in items):
            common.append(items[0])
        else:
            break
    return ".".join(common)


def fold_modules(cap: OpCapture, op_graph: Graph, atomic: Sequence[str]) -> Graph:
    """The module-level graph: one node per atomic module instance.

    Parameters
    ----------
    cap : OpCapture
        The operator-level capture (module stacks, tensor uses).
    op_graph : Graph
        The operator-level graph built from ``cap`` (FLOPs, bytes, optional seconds).
    atomic : sequence of str
        Module class names (``"Linear"``; a dotted path's last part counts).

    Returns
    -------
    Graph
        Node ``i`` is an atomic instance (or several merged, see Notes) with the sums of its
        operators' FLOPs, parameters, seconds and weights; ``output_bytes`` is the bytes of the
        distinct tensors leaving it (model outputs included). Its ``ops`` lists the operators
        it holds, ``[position, fx name, operator, module]`` each in program order: what
        ``shardplan train`` cuts the exported program by. An edge ``a -> b`` carries the
        bytes of the distinct tensors of ``a`` read by ``b``. ``meta["edge_hops"]`` holds, per
        edge, the fewest operators between the two instances on a path of the operator graph
        that avoids other atomic instances (the paper's edge weight; 0 when the edge exists
        only through folded operators).

    Notes
    -----
    What the paper leaves open, decided here:

    - An operator inside several atomic instances (an atomic type nested in another) belongs
      to the outermost one.
    - Operators outside every atomic instance fold into the earliest-starting atomic instance
      reachable downstream of them, or, with none downstream, into the latest-starting one
      upstream; FLOP, parameter and time totals are preserved exactly. This order makes the
      folding itself acyclic.
    - A module called twice, or instances whose operators interleave, can still make the
      contracted graph cyclic; each strongly connected component is merged into one node
      (``op`` ``"merged"``, ``members`` lists the instances).
    - We keep every contracted edge, a DAG, rather than the paper's minimum spanning tree: a
      tree drops real data dependencies, and a planner must pay for every tensor that crosses
      a cut.

    O(k (n + m)) for k instances, n operators and m operator edges (the hop search); the rest
    is O(n + m).
    """
    n = len(cap)
    inst = atomic_instances(cap, atomic)
    inst_ids: dict[str, int] = {}
    inst_group = [-1] * n
    for i, fqn in enumerate(inst):
        if fqn is not None:
            inst_group[i] = inst_ids.setdefault(fqn, len(inst_ids))
    k = len(inst_ids)
    inst_names = list(inst_ids)
    rank = [0] * k  # first op of each instance (instances numbered in that order already)
    for i in range(n - 1, -1, -1):
        if inst_group[i] >= 0:
            rank[inst_group[i]] = i
    succ: list[list[int]] = [[] for _ in range(n)]
    pred: list[list[int]] = [[] for _ in range(n)]
    for s, d in zip(op_graph.src.tolist(), op_graph.dst.tolist(), strict=True):
        succ[s].append(d)
        pred[d].append(s)
    group = _assign(n, succ, pred, inst_group, rank)

    # Merge strongly connected instances, then number the merged nodes topologically.
    gs, gd = _group_pairs(cap, group)
    mat = sp.csr_matrix((np.ones(len(gs)), (gs, gd)), shape=(k, k))
    _, labels = connected_components(mat, directed=True, connection="strong")
    comp_first: dict[int, int] = {}
    for g in range(k):
        comp_first[int(labels[g])] = min(comp_first.get(int(labels[g]), n), rank[g])
    comp_pairs = {(int(labels[a]), int(labels[b])) for a, b in zip(gs, gd, strict=True)
                  if labels[a] != labels[b]}
    order = _toposort(sorted(comp_first, key=comp_first.get), comp_pairs)
    node_of_comp = {c: j for j, c in enumerate(order)}
    node_of_group = [node_of_comp[int(labels[g])] for g in range(k)]
    node_of_op = np.array([node_of_group[g] for g in group], dtype=np.int64)
    num = len(order)

    # Sums per node.
    def total(col: np.ndarray | None) -> np.ndarray | None:
        if col is None:
            return None
        return np.bincount(node_of_op, weights=np.nan_to_num(col), minlength=num)

    # Edges and bytes leaving each node (distinct tensors).
    edge_keys: dict[tuple[int, int], set[tuple[int, tuple[int, ...]]]] = {}
    leaving: list[set[tuple[int, tuple[int, ...]]]] = [set() for _ in range(num)]
    key_bytes: dict[tuple[int, tuple[int, ...]], int] = {}
    for u in cap.uses:
        a, b = int(node_of_op[u.producer]), int(node_of_op[u.consumer])
        if a == b:
            continue
        key = (u.producer, u.key)
        key_bytes[key] = u.bytes
        edge_keys.setdefault((a, b), set()).add(key)
        leaving[a].add(key)
    for producer, key, nbytes in cap.outputs:
        leaving[int(node_of_op[producer])].add((producer, key))
        key_bytes[(producer, key)] = nbytes
    pairs = sorted(edge_keys)
    hops = _hops(n, succ, inst_group, k)
    members: list[list[int]] = [[] for _ in range(num)]
    for g in range(k):
        members[node_of_group[g]].append(g)
    edge_hops = []
    for a, b in pairs:
        found = [hops[(x, y)] for x in members[a] for y in members[b] if (x, y) in hops]
        edge_hops.append(min(found) if found else 0)

    names, ops, modules, extras = [], [], [], []
    atomic_ops = np.bincount(node_of_op[np.array(inst_group) >= 0], minlength=num) \
        if n else np.zeros(num, dtype=np.int64)
    op_count = np.bincount(node_of_op, minlength=num)
    type_of = _instance_types(cap, inst, {_norm_type(a) for a in atomic})
    for j in range(num):
        mem = [inst_names[g] for g in members[j]]
        label = [m or type_of[m] for m in mem]
        if len(mem) == 1:
            names.append(label[0])
            ops.append(type_of[mem[0]])
            modules.append(mem[0])
        else:
            nm = "+".join(label) if len(label) <= 4 else \
                f"{label[0]}+...+{label[-1]} ({len(label)} modules)"
            names.append(nm)
            ops.append("merged")
            modules.append(_common_prefix(mem))
        extra: dict[str, Any] = {"num_ops": int(op_count[j]),
                                 "folded_ops": int(op_count[j] - atomic_ops[j]),
                                 "ops": [[int(i), cap.names[i], cap.ops[i], cap.modules[i]]
                                         for i in np.flatnonzero(node_of_op == j).tolist()]}
        if len(mem) > 1:
            extra["members"] = mem
        shared = sorted({p for i in np.flatnonzero(node_of_op == j) for p in
                         cap.shared_params[i]})
        if shared:
            extra["shared_params"] = shared
        extras.append(extra)
    optional: dict[str, Any] = {}
    if op_graph.fwd_seconds is not None:
        optional["fwd_seconds"] = total(op_graph.fwd_seconds)
    if op_graph.bwd_seconds is not None:
        optional["bwd_seconds"] = total(op_graph.bwd_seconds)
    if op_graph.param_tensors is not None:
        optional["param_tensors"] = total(op_graph.param_tensors)
    meta = dict(op_graph.meta)
    meta.update({"granularity": "module", "atomic": sorted({_norm_type(a) for a in atomic}),
                 "edge_hops": edge_hops, "op_nodes": n,
                 "merged_instances": int(k - num)})
    return Graph(
        name=op_graph.name, batch_size=op_graph.batch_size, names=tuple(names),
        ops=tuple(ops), modules=tuple(modules),
        fwd_flops=total(op_graph.fwd_flops), bwd_flops=total(op_graph.bwd_flops),
        param_bytes=np.bincount(node_of_op, weights=op_graph.param_bytes, minlength=num)
        .round().astype(np.int64),
        output_bytes=np.array([sum(key_bytes[x] for x in leaving[j]) for j in range(num)],
                              dtype=np.int64),
        weight=total(op_graph.weight),
        src=np.array([p[0] for p in pairs], dtype=np.int64),
        dst=np.array([p[1] for p in pairs], dtype=np.int64),
        edge_bytes=np.array([sum(key_bytes[x] for x in edge_keys[p]) for p in pairs],
                            dtype=np.int64),
        node_extra=tuple(extras), meta=meta, **optional,
    )


def _instance_types(cap: OpCapture, inst: list[str | None], wanted: set[str]
                    ) -> dict[str, str]:
    out: dict[str, str] = {}
    for stack, fqn in zip(cap.stacks, inst, strict=True):
        if fqn is not None and fqn not in out:
            out[fqn] = next(typ for f, typ in stack if f == fqn and typ in wanted)
    return out


def _group_pairs(cap: OpCapture, group: list[int]) -> tuple[list[int], list[int]]:
    pairs = {(group[u.producer], group[u.consumer]) for u in cap.uses
             if group[u.producer] != group[u.consumer]}
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _toposort(nodes: list[int], pairs: set[tuple[int, int]]) -> list[int]:
    """Kahn's algorithm; among ready nodes the one listed first in ``nodes`` goes first."""
    import heapq

    pos = {c: i for i, c in enumerate(nodes)}
    succ: dict[int, list[int]] = {c: [] for c in nodes}
    indeg = dict.fromkeys(nodes, 0)
    for a, b in pairs:
        succ[a].append(b)
        indeg[b] += 1
    ready = [pos[c] for c in nodes if indeg[c] == 0]
    heapq.heapify(ready)
    out: list[int] = []
    while ready:
        c = nodes[heapq.heappop(ready)]
        out.append(c)
        for d in succ[c]:
            indeg[d] -= 1
            if indeg[d] == 0:
                heapq.heappush(ready, pos[d])
    assert len(out) == len(nodes), "condensation of strongly connected components is a DAG"
    return out
