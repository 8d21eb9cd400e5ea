"""A pipeline plan in the terms the training frameworks use: module paths and layers.

Frameworks cut a model where a module starts (torch's ``SplitPoint.BEGINNING``), into lists
of top-level modules (torchtitan's ``module_fqns_per_model_part``) or into runs of layers
(Megatron's layout, DeepSpeed's ``parts``). A plan's stages are node sets of a captured graph;
each node names its owning module. :func:`pipeline_parts` checks that the stages, in
pipeline order, are consecutive runs of the graph's program order (node ids, the order
``torch.export`` traced them), which every framework requires, and names where each starts.
Nodes without a module (operators called in the top module's ``forward``) hold no weights
and go where the framework's tracer puts them; they are left out of every check.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardplan.errors import ShardplanError
from shardplan.ir import Graph, Plan

__all__ = ["PipelineParts", "layer_key", "pipeline_parts"]

UNITS = ("module", "layer")


def _block_depth(modules: tuple[str, ...]) -> int | None:
    """The depth of the repeated-block list: the position of the first numeric component
    of any module path (``blocks.0.attn`` -> 1, ``transformer.h.3`` -> 2), or None."""
    best: int | None = None
    for m in modules:
        for i, part in enumerate(m.split(".") if m else ()):
            if part.isdigit():
                best = i if best is None else min(best, i)
                break
    return best


def layer_key(module: str, depth: int | None) -> str:
    """The layer a module path belongs to: up to its block index (``blocks.3``) when it is
    in the block list at ``depth``, else its first ``depth`` components (the first one when
    there is no block list): ``tok_emb``, ``ln_f``, ``head``, ``transformer.wte``."""
    parts = module.split(".")
    if depth is not None and len(parts) > depth and parts[depth].isdigit():
        return ".".join(parts[:depth + 1])
    return ".".join(parts[:max(depth or 1, 1)])


@dataclass(frozen=True)
class PipelineParts:
    """A plan's stages as runs of the program order.

    Attributes
    ----------
    order : tuple of int
        Plan stage ids in pipeline order.
    nodes : tuple of tuple of int
        Per pipeline position, its nodes with a module, in program order.
    layers : tuple of str
        Every layer (:func:`layer_key`) in program order.
    stage_layers : tuple of tuple of str
        Per pipeline position, its layers; a layer split over two positions is in both.
    starts : tuple of str
        Per position after the first, the module path at which it starts: the shortest
        prefix of its first node's module whose first node in program order is that node.
    split_layers : tuple of str
        Layers whose nodes lie in more than one stage.
    block_depth : int or None
        The depth of the repeated-block list in module paths (:func:`layer_key`).
    moved : tuple of str
        One line per stage start that was moved to where the format can split, naming
        the nodes that changed stage (empty when the plan's split is exported as is).
    """

    order: tuple[int, ...]
    nodes: tuple[tuple[int, ...], ...]
    layers: tuple[str, ...]
    stage_layers: tuple[tuple[str, ...], ...]
    starts: tuple[str, ...]
    split_layers: tuple[str, ...]
    block_depth: int | None
    moved: tuple[str, ...] = ()

    def whole_layers(self, fmt: str) -> None:
        """Raise unless every layer lies in one stage (frameworks that partition layers)."""
        if self.split_layers:
            raise ShardplanError(f"{fmt} places whole layers on stages, and the plan splits "
                                 f"layer {self.split_layers[0]!r} between two stages")


def _names(graph: Graph, nodes: list[int], limit: int = 6) -> str:
    """``'a', 'b' and 3 more``: the first ``limit`` node names of ``nodes``."""
    shown = ", ".join(repr(graph.names[v]) for v in nodes[:limit])
    return shown + (f" and {len(nodes) - limit} more" if len(nodes) > limit else "")


def _snap(cuts: list[int], allowed: np.ndarray, fmt: str, what: str) -> list[int]:
    """Each cut (an index into the module-named nodes, ascending) moved to the nearest
    allowed index (ties: the earlier), keeping the cuts strictly ascending and every piece
    non-empty; one-line :class:`ShardplanError` when the allowed cuts are too few."""
    n = len(allowed)
    places = np.flatnonzero(allowed[1:]) + 1
    out: list[int] = []
    for q, cut in enumerate(cuts):
        lo = out[-1] + 1 if out else 1
        hi = n - (len(cuts) - q)  # leave a node for every later piece
        ok = places[(places >= lo) & (places <= hi)]
        if ok.size == 0:
            raise ShardplanError(f"{fmt} splits at {what}, and the model has too few of them "
                                 f"for the plan's {len(cuts) + 1} stages")
        out.append(int(ok[np.lexsort((ok, np.abs(ok - cut)))[0]]))
    return out


def pipeline_parts(plan: Plan, graph: Graph, fmt: str, *, unit: str = "module",
                   exact: bool = False) -> PipelineParts:
    """The plan's stages as runs of program order (see the module docstring), or one-line
    :class:`ShardplanError` naming why ``fmt`` cannot express them.

    ``unit`` is where ``fmt`` can start a stage: ``"module"`` (torch: where some module
    path starts) or ``"layer"`` (torchtitan, Megatron, DeepSpeed: where a layer starts). A
    stage that starts elsewhere (inside a module, or a layer) has its start moved to the
    nearest place the format can express, counted in module-named nodes (ties: the
    earlier place), and :attr:`PipelineParts.moved` says which nodes changed stage; with
    ``exact`` such a plan is refused instead. O(n d + k log k) for module depth d.
    """
    from shardplan.simulate import stage_order

    if plan.strategy is not None:
        raise ShardplanError(f"{fmt} takes a pipeline split, and this plan shards layers "
                             "(a strategy plan); export it as chrome-trace")
    order = stage_order(graph, plan)
    assign = plan.assignment(graph.num_nodes)
    pos = np.empty(plan.num_stages, dtype=np.int64)
    pos[list(order)] = np.arange(plan.num_stages)
    mods = graph.modules
    named = [v for v in range(graph.num_nodes) if mods[v]]
    if not named:
        raise ShardplanError(f"{fmt} splits a model by module paths, and no node of the graph "
                             "names its module (a generated or imported graph)")
    seq = pos[assign[named]]
    if np.any(np.diff(seq) < 0):
        bad = named[int(np.flatnonzero(np.diff(seq) < 0)[0]) + 1]
        raise ShardplanError(f"{fmt} cuts the program into consecutive pieces, and the plan's "
                             f"stages are not: node {graph.names[bad]!r} "
                             f"({mods[bad]}) runs after a node of a later stage")
    k = plan.num_stages
    counts = np.bincount(seq, minlength=k)
    if np.any(counts == 0):
        empty = int(np.flatnonzero(counts == 0)[0])
        raise ShardplanError(f"{fmt} needs modules in every stage, and pipeline stage {empty} "
                             "holds only module-less operators")
    depth = _block_depth(tuple(mods[v] for v in named))
    first_of: dict[str, int] = {}
    for v in named:
        parts = mods[v].split(".")
        for i in range(1, len(parts) + 1):
            first_of.setdefault(".".join(parts[:i]), v)
    keys = [layer_key(mods[v], depth) for v in named]
    if unit == "layer":
        allowed = np.array([i == 0 or (keys[i] != keys[i - 1] and first_of[keys[i]] == v)
                            for i, v in enumerate(named)])
        what = "layer boundaries"
    else:
        allowed = np.array([any(first_of[p] == v for p in _prefixes(mods[v])) for v in named])
        what = "module starts"
    cuts = [int(c) for c in np.cumsum(counts)[:-1]]
    moved: list[str] = []
    if not all(allowed[c] for c in cuts):
        q = next(q for q, c in enumerate(cuts) if not allowed[c])
        v = named[cuts[q]]
        if exact:
            raise ShardplanError(f"{fmt} splits at {what}, and pipeline stage {q + 1} starts "
                                 f"inside one, at node {graph.names[v]!r} ({mods[v]})")
        new = _snap(cuts, allowed, fmt, what)
        for q, (old, cut) in enumerate(zip(cuts, new, strict=True)):
            if old == cut:
                continue
            lo, hi = min(old, cut), max(old, cut)
            src, dst = (q + 1, q) if cut > old else (q, q + 1)
            moved.append(f"{fmt} splits at {what}: nodes {_names(graph, named[lo:hi])} move "
                         f"from pipeline stage {src} to {dst}")
        cuts = new
        seq = np.repeat(np.arange(k), np.diff([0, *cuts, len(named)]))
    nodes = tuple(tuple(v for v, p in zip(named, seq.tolist(), strict=True) if p == q)
                  for q in range(k))
    starts = []
    for q in range(1, k):
        v = nodes[q][0]
        starts.append(next(p for p in _prefixes(mods[v]) if first_of[p] == v))
    layers: list[str] = []
    owners: dict[str, set[int]] = {}
    stage_layers: list[list[str]] = [[] for _ in range(k)]
    for key, p in zip(keys, seq.tolist(), strict=True):
        if key not in owners:
            layers.append(key)
            owners[key] = set()
        owners[key].add(p)
        if not stage_layers[p] or stage_layers[p][-1] != key:
            stage_layers[p].append(key)
    split = tuple(key for key in layers if len(owners[key]) > 1)
    return PipelineParts(order=tuple(order), nodes=nodes, layers=tuple(layers),
                         stage_layers=tuple(tuple(s) for s in stage_layers),
                         starts=tuple(starts), split_layers=split, block_depth=depth,
                         moved=tuple(moved))


def _prefixes(module: str) -> list[str]:
    """``a``, ``a.b``, ``a.b.c`` of ``a.b.c``: shortest first."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
