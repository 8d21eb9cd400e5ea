"""Stamping identical transformer blocks out to a model's full depth.

Exporting a 126-layer model traces 126 copies of the same block. :func:`stamp_blocks` takes
the operator graph of the same model built with two blocks (``layers.0``, ``layers.1``) and
writes the graph of ``num_blocks`` blocks: the nodes before the blocks (the prefix), the
first block, ``num_blocks - 1`` copies of the second block and the nodes after the blocks
(the suffix), with every edge, space and name the full capture would have. The second block
is the template because its inputs come from a block, as those of every later block do.

It checks what it relies on and returns None (capture the whole model instead) when a check
fails: the nodes of each block are contiguous in program order, prefix first and suffix
last; the two blocks are the same operators on the same module paths (``layers.0`` read as
``layers.1``) with the same FLOPs, bytes, spaces and internal edges; and no edge leaves the
first block for the suffix (which block would feed the suffix then is not known).
``tests/capture/test_meta.py`` checks stamped graphs against full captures.

fx names are numbered as ``torch.fx`` numbers them (one counter per base name, in program
order: ``linear``, ``linear_1``, ...): each copy repeats the small graph's steps between
names of the same base, so that the stamped graph names the nodes of the program a full
export makes; module paths and shared parameters of copy ``i`` read
``layers.i``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from shardplan.ir import Graph

__all__ = ["block_of", "stamp_blocks"]

_SUFFIX = re.compile(r"_\d+$")


def block_of(module: str, container: str = "layers") -> int | None:
    """The block index of a module path (``layers.3.attention.wq`` -> 3), or None."""
    parts = module.split(".")
    if len(parts) >= 2 and parts[0] == container and parts[1].isdigit():
        return int(parts[1])
    return None


def _rename(path: str, container: str, old: int, new: int) -> str:
    head = f"{container}.{old}"
    if path == head or path.startswith(head + "."):
        return f"{container}.{new}" + path[len(head):]
    return path


def _space_key(space: Mapping[str, Any] | None, shift: Any) -> Any:
    """A space with its ``inputs`` keys (producer ids) mapped by ``shift``; None for None."""
    if space is None:
        return None
    out = dict(space)
    if "inputs" in out:
        out["inputs"] = {str(shift(int(k))): v for k, v in out["inputs"].items()}
    return out


def _numbered(name: str) -> tuple[str, int]:
    """``linear_4`` -> ``("linear", 4)``; ``linear`` -> ``("linear", 0)``."""
    m = _SUFFIX.search(name)
    return (name[:m.start()], int(m.group()[1:])) if m else (name, 0)


def _inside(space: Mapping[str, Any] | None, first: int, k: int, shift: int = 0) -> Any:
    """A block node's space with only the inputs from its own block (``[first, first + k)``),
    their ids moved by ``shift``: what two identical blocks share."""
    if space is None:
        return None
    out = dict(space)
    out["inputs"] = {str(int(j) + shift): v for j, v in space.get("inputs", {}).items()
                     if first <= int(j) < first + k}
    return out


def stamp_blocks(graph: Graph, num_blocks: int, *, container: str = "layers"
                 ) -> Graph | None:
    """The graph of ``num_blocks`` blocks, from the graph of the same model with two.

    Parameters
    ----------
    graph : Graph
        Operator-level graph of the model with blocks ``container.0`` and ``container.1``.
    num_blocks : int
        Blocks of the full model (at least 2).
    container : str
        The module path holding the blocks (``layers`` in the zoo's GPT and Llama).

    Returns
    -------
    Graph or None
        None when the graph is not made of two identical contiguous blocks (see the module
        docstring); the caller then captures the whole model.

    Notes
    -----
    O(N + M) for the N nodes and M edges of the stamped graph.
    """
    n = graph.num_nodes
    blk = [block_of(m, container) for m in graph.modules]
    b0 = [i for i in range(n) if blk[i] == 0]
    b1 = [i for i in range(n) if blk[i] == 1]
    k = len(b0)
    if num_blocks < 2 or k == 0 or len(b1) != k or any(b not in (None, 0, 1) for b in blk):
        return None
    p = b0[0]
    if b0 != list(range(p, p + k)) or b1 != list(range(p + k, p + 2 * k)):
        return None
    if any(blk[i] is not None for i in range(p)) or any(blk[i] is not None
                                                         for i in range(p + 2 * k, n)):
        return None
    s0 = p + 2 * k  # first suffix node in the small graph
    extra = (num_blocks - 2) * k

    # The two blocks must be the same, node by node.
    for a, b in zip(b0, b1, strict=True):
        if graph.ops[a] != graph.ops[b] or \
                _rename(graph.modules[a], container, 0, 1) != graph.modules[b]:
            return None
        for col in ("fwd_flops", "bwd_flops", "param_bytes", "output_bytes", "weight",
                    "memory_bytes", "param_tensors"):
            arr = getattr(graph, col)
            if arr is not None and not (arr[a] == arr[b] or (np.isnan(arr[a])
                                                             and np.isnan(arr[b]))):
                return None
        if graph.spaces is not None and _inside(graph.spaces[a], p, k) != \
                _inside(graph.spaces[b], p + k, k, shift=-k):
            return None  # the blocks' spaces differ (inputs from outside the block aside)

    src, dst, eb = graph.src.tolist(), graph.dst.tolist(), graph.edge_bytes.tolist()

    def part(i: int) -> str:
        return "P" if i < p else "B0" if i < p + k else "B1" if i < s0 else "S"

    inner0 = sorted((u - p, v - p, w) for u, v, w in zip(src, dst, eb, strict=True)
                    if part(u) == part(v) == "B0")
    inner1 = sorted((u - p - k, v - p - k, w) for u, v, w in zip(src, dst, eb, strict=True)
                    if part(u) == part(v) == "B1")
    if inner0 != inner1:
        return None

    def start(i: int) -> int:  # first node of copy i in the stamped graph
        return p + i * k

    new_src: list[int] = []
    new_dst: list[int] = []
    new_bytes: list[int] = []

    def add(u: int, v: int, w: int) -> None:
        new_src.append(u)
        new_dst.append(v)
        new_bytes.append(w)

    for u, v, w in zip(src, dst, eb, strict=True):
        pu, pv = part(u), part(v)
        if pv == "S":
            if pu == "B0":
                return None
            add(u + extra if pu in ("B1", "S") else u, v + extra, w)
        elif pv == "B1" and pu == "B1":
            for i in range(1, num_blocks):
                add(u - p - k + start(i), v - p - k + start(i), w)
        elif pv == "B1" and pu == "B0":
            for i in range(1, num_blocks):
                add(u - p + start(i - 1), v - p - k + start(i), w)
        elif pv == "B1":  # from the prefix, into every block after the first
            for i in range(1, num_blocks):
                add(u, v - p - k + start(i), w)
        else:  # into the prefix or the first block: as they are
            add(u, v, w)

    # Per new node, the small graph's node it copies and the block index it takes.
    source = [*range(s0 - k), *(b for _ in range(1, num_blocks) for b in b1),
              *range(s0, n)]
    copy_of = [None] * p + [0] * k + [i for i in range(1, num_blocks) for _ in range(k)] \
        + [None] * (n - s0)
    num = len(source)

    def shift_for(j: int, i: int | None) -> Any:
        """Producer ids of new node j's space (a copy of small node source[j])."""
        def shift(q: int) -> int:
            pq = part(q)
            if pq == "P":
                return q
            if pq == "B0":
                return q if i in (None, 0) else q - p + start(i - 1)
            if pq == "B1":
                return q + extra if i is None else q - p - k + start(i)
            return q + extra
        return shift

    gap: list[int] = []  # per small node: its name's number minus the previous one's
    last: dict[str, int] = {}
    for nm in graph.names:
        base, number = _numbered(nm)
        gap.append(number - last.get(base, -1))
        last[base] = number
    modules, names = [], []
    counters: dict[str, int] = {}
    spaces: list[Any] = []
    extras: list[Mapping[str, Any]] = []
    for j in range(num):
        s, i = source[j], copy_of[j]
        modules.append(graph.modules[s] if i in (None, 0)
                       else _rename(graph.modules[s], container, 1, i))
        base, number = _numbered(graph.names[s])
        if s < s0 - k:  # prefix and first block: named as in the small graph
            counters[base] = number
            names.append(graph.names[s])
        else:  # the small graph's step from the previous name of the same base, repeated
            counters[base] = counters.get(base, -1) + gap[s]
            names.append(base if counters[base] == 0 else f"{base}_{counters[base]}")
        if graph.spaces is not None:
            spaces.append(_space_key(graph.spaces[s], shift_for(j, i if s >= p else None)))
        if graph.node_extra is not None:
            ex = dict(graph.node_extra[s])
            if i not in (None, 0) and "shared_params" in ex:
                ex["shared_params"] = [_rename(x, container, 1, i)
                                       for x in ex["shared_params"]]
            extras.append(ex)
    if len(set(names)) != num or tuple(names[:s0 - k]) != graph.names[:s0 - k]:
        return None  # the small graph's names are not numbered as torch.fx numbers them

    order = np.lexsort((np.asarray(new_dst), np.asarray(new_src)))
    idx = np.asarray(source, dtype=np.int64)
    optional: dict[str, Any] = {}
    for col in ("fwd_seconds", "bwd_seconds", "memory_bytes", "param_tensors"):
        arr = getattr(graph, col)
        if arr is not None:
            optional[col] = arr[idx]
    return Graph(
        name=graph.name, batch_size=graph.batch_size, names=tuple(names),
        ops=tuple(graph.ops[s] for s in source), modules=tuple(modules),
        fwd_flops=graph.fwd_flops[idx], bwd_flops=graph.bwd_flops[idx],
        param_bytes=graph.param_bytes[idx], output_bytes=graph.output_bytes[idx],
        weight=graph.weight[idx],
        src=np.asarray(new_src, dtype=np.int64)[order],
        dst=np.asarray(new_dst, dtype=np.int64)[order],
        edge_bytes=np.asarray(new_bytes, dtype=np.int64)[order],
        spaces=tuple(spaces) if graph.spaces is not None else None,
        node_extra=tuple(extras) if graph.node_extra is not None else None,
        meta=dict(graph.meta), **optional,
    )
