"""A strategy plan's per-layer layouts on a device mesh (torch-free).

PaSE (paper 004, section II) gives every layer a *configuration*: the split factor of each
dimension of its iteration space. To run it with ``torch.distributed.tensor`` the devices of
a stage become one device mesh whose axes are the prime factors of the device count (4
devices: a 2 x 2 mesh; 8: 2 x 2 x 2; 6: 3 x 2), and every layer's configuration becomes an
assignment of mesh axes to its split dimensions (a factor of 4 takes two axes of 2). From that
assignment follow the placements of every tensor the layer reads: tensor dimension ``j`` is
``Shard(j)`` over the axes of the space dimensions it spans (the space's ``inputs``, ``output``
and the operator's parameter layout), ``Replicate`` over the others. A layer's configuration
that splits fewer than all devices leaves the other axes replicated: those devices hold and
compute the same shard.

Axis assignment, per node in topological order: each split dimension takes first the axes its
producer used for the tensor dimension it reads (so an activation split alike on both sides of
an edge is not moved), then free axes whose sizes make up its factor. A factor whose prime
factors the mesh lacks (a split of 3 on 4 devices, which PaSE allows: it leaves a device
idle) runs as its largest divisor the mesh can make up (1 for 3 on 4 devices), and so does an
embedding table's vocabulary split over more than one axis (DTensor's vocabulary-parallel
embedding supports one); :func:`strategy_notes` says so before the run starts, and DTensor
keeps the result exact.

Placements are plain data here: per mesh axis, the tensor dimension sharded over it or ``-1``
for replicated (:func:`placements`); :mod:`shardplan.runtime._dtensor` turns them into DTensor
placements.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardplan.errors import ShardplanError

__all__ = ["NodeSharding", "arg_groups", "boundary_spec", "mesh_shape", "node_shardings",
           "placements", "prime_factors", "strategy_notes"]

Groups = tuple[tuple[str, ...], ...]


def prime_factors(n: int) -> list[int]:
    """Prime factors of ``n`` in decreasing order, with repetition (``12 -> [3, 2, 2]``).
    O(sqrt n)."""
    n = int(n)
    out: list[int] = []
    p = 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    if n > 1:
        out.append(n)
    return sorted(out, reverse=True)


def mesh_shape(devices: int) -> tuple[int, ...]:
    """The mesh a stage's ``devices`` are laid out as: one axis per prime factor (largest
    first); one device is a mesh of one axis of size 1."""
    if int(devices) < 1:
        raise ShardplanError(f"a mesh needs at least one device, got {devices}")
    return tuple(prime_factors(devices)) or (1,)


@dataclass(frozen=True, slots=True)
class NodeSharding:
    """One graph node's configuration laid out on its stage's mesh.

    Attributes
    ----------
    name, op : str
        The graph node's name (an fx name of the exported program) and operator.
    kind : str
        Its space's kind (``gemm``, ``elementwise``, ...); ``""`` when the graph gave the
        node no space (an operator capture does not model).
    dims : tuple of str
        The space's dimensions, in the order the configuration lists their factors.
    factors : tuple of int
        The configuration as laid out (the plan's, unless ``planned`` says otherwise).
    axes : tuple of tuple of int
        Per dimension, the mesh axes it is split over (their sizes multiply to its factor).
    output : tuple of tuple of str
        Per dimension of the output tensor, the space dimensions it spans.
    inputs : tuple of (str, groups)
        Per producer (graph node name), the space dimensions of each dimension of the tensor
        read from it.
    planned : tuple of int or None
        The plan's configuration when the mesh cannot lay it out (a split of 3 on a 2 x 2
        mesh): each such factor runs as its largest divisor the free axes make up.
    batch_cut : bool
        Whether ``planned`` was cut because the batch dimension's split does not divide the
        run's micro-batch (a split of 2 at one sample per micro-batch).
    """

    name: str
    op: str
    kind: str
    dims: tuple[str, ...]
    factors: tuple[int, ...]
    axes: tuple[tuple[int, ...], ...]
    output: Groups = ()
    inputs: tuple[tuple[str, Groups], ...] = ()
    planned: tuple[int, ...] | None = None
    batch_cut: bool = False

    @property
    def described(self) -> bool:
        """Whether the graph gave the node an iteration space."""
        return bool(self.kind)

    @property
    def split(self) -> bool:
        """Whether the configuration splits anything."""
        return any(f > 1 for f in self.factors)

    def axes_of(self, dim: str) -> tuple[int, ...]:
        return self.axes[self.dims.index(dim)] if dim in self.dims else ()

    def input_groups(self, producer: str) -> Groups | None:
        for name, groups in self.inputs:
            if name == producer:
                return groups
        return None

    def to_dict(self) -> dict[str, Any]:
        out = {"name": self.name, "op": self.op, "kind": self.kind, "dims": list(self.dims),
               "factors": list(self.factors), "axes": [list(a) for a in self.axes]}
        if self.planned is not None:
            out["planned"] = list(self.planned)
        if self.batch_cut:
            out["batch_cut"] = True
        return out


def placements(sharding: NodeSharding, groups: Groups, num_axes: int) -> tuple[int, ...]:
    """Per mesh axis, the tensor dimension sharded over it (``-1``: replicated), for a tensor
    whose dimension ``j`` spans the space dimensions ``groups[j]``. O(axes x dims)."""
    out = [-1] * num_axes
    for j, group in enumerate(groups):
        for dim in group:
            for a in sharding.axes_of(dim):
                if out[a] == -1:
                    out[a] = j
    return tuple(out)


def boundary_spec(sharding: NodeSharding | None, shape: Sequence[int],
                  mesh: Sequence[int]) -> tuple[int, ...] | None:
    """How a tensor crossing a hybrid's stage boundary travels, per mesh axis as
    :func:`placements` says: its producer's layout when that splits the tensor's first
    (batch) dimension alone and the axes splitting it divide it (device ``i`` of the stage
    then sends its batch shard to device ``i`` of the next, which reads it in that layout);
    None: the tensor travels whole. The simulator's side is
    :meth:`shardplan.strategy._price.StagePricer.batch_shards`. O(axes x dims)."""
    if sharding is None or not shape or len(sharding.output) != len(shape):
        return None
    spec = placements(sharding, sharding.output, len(mesh))
    if 0 not in spec or any(j not in (-1, 0) for j in spec):
        return None
    parts = math.prod(int(mesh[a]) for a, j in enumerate(spec) if j == 0)
    return spec if int(shape[0]) % parts == 0 else None


# ----------------------------------------------------------------------- axis assignment
#: Dimensions DTensor splits over at most that many mesh axes: a vocabulary-parallel
#: embedding's table (its ``MaskPartial`` output keeps one mask; torch 2.14 fails with
#: "MaskBuffer has been materialized with conflicting data" over two axes).
_MAX_AXES: dict[str, dict[str, int]] = {"embedding": {"v": 1}}


def _assign(factors: Sequence[int], shape: Sequence[int], preferred: Sequence[Sequence[int]]
            ) -> tuple[tuple[int, ...], ...]:
    """Mesh axes per dimension whose sizes multiply to its factor, each axis used once;
    ``preferred[i]``: axes dimension ``i`` should take if they fit. A factor the free axes
    cannot make up gets the axes of its largest divisor they can (the caller compares)."""
    free = set(range(len(shape)))
    out: list[tuple[int, ...]] = [()] * len(factors)
    order = sorted(range(len(factors)), key=lambda i: (not preferred[i], i))
    for i in order:
        f = int(factors[i])
        if f == 1:
            continue
        pref = [a for a in preferred[i] if a in free]
        prod = 1
        for a in pref:
            prod *= shape[a]
        if pref and prod == f:
            out[i] = tuple(sorted(pref))
            free -= set(pref)
            continue
        chosen: list[int] = []
        for p in prime_factors(f):
            a = next((a for a in sorted(free) if shape[a] == p and a not in chosen), None)
            if a is not None:
                chosen.append(a)
        out[i] = tuple(sorted(chosen))
        free -= set(chosen)
    return tuple(out)


def _batch_dim(sp: Any, captured: int, run: int) -> tuple[int, int] | None:
    """``(i, size)``: the space dimension ``i`` that carries the batch and its size at a
    micro-batch of ``run`` samples, for a space whose output leads with the batch (one space
    dimension spanning output dimension 0, whose captured size is a multiple of the captured
    batch: ``(batch, ...)`` or a merged ``(batch x seq, ...)``); ``None`` otherwise. O(dims).
    """
    if captured < 1 or not sp.output or len(sp.output[0]) != 1 or not sp.output_shape:
        return None
    lead = int(sp.output_shape[0])
    if lead < captured or lead % captured or sp.output[0][0] not in sp.dims:
        return None
    return sp.dims.index(sp.output[0][0]), lead // captured * int(run)


def node_shardings(graph: Any, strategy: Mapping[str, Sequence[int]],
                   groups: Sequence[tuple[Sequence[int], int]], *,
                   run_batch: int | None = None) -> tuple[NodeSharding, ...]:
    """Every node's configuration laid out on its stage's mesh.

    Parameters
    ----------
    graph : Graph
        Nodes with ``space`` (nodes without one get the batch-only space the strategy
        search gave them, :func:`shardplan.strategy.batch_only`).
    strategy : mapping of str to sequence of int
        The plan's ``strategy``: per node id, one factor per space dimension.
    groups : sequence of (nodes, devices)
        Per stage, its node ids and its device count (the mesh is :func:`mesh_shape`).
    run_batch : int, optional
        Samples per micro-batch the run feeds each stage's program (default: the graph's
        batch). A split of the batch dimension that does not divide its size at this batch
        (DTensor cannot reshape a dimension sharded unevenly, nor one sample over two
        devices) runs as the largest divisor of both (``batch_cut``).

    Returns
    -------
    tuple of NodeSharding
        Indexed by node id.

    Raises
    ------
    ShardplanError
        A node without a configuration, a configuration of the wrong length or one using
        more devices than its stage has.

    Notes
    -----
    O(n d + m) for n nodes of at most d dimensions and m edges.
    """
    from shardplan.strategy.tables import graph_spaces

    spaces = graph_spaces(graph)
    raw = graph.spaces
    stage_devices: dict[int, int] = {}
    for nodes, devices in groups:
        for v in nodes:
            stage_devices[int(v)] = int(devices)
    names = graph.names
    out: list[NodeSharding | None] = [None] * graph.num_nodes
    for v in (int(x) for x in graph.topological_order):
        sp = spaces[v]
        devices = stage_devices[v]
        factors = strategy.get(str(v))
        if factors is None:
            raise ShardplanError(f"the plan's strategy has no configuration for node {v} "
                                 f"({names[v]!r})")
        factors = tuple(int(f) for f in factors)
        if len(factors) != len(sp.dims):
            raise ShardplanError(f"node {v} ({names[v]!r}): the configuration {list(factors)} "
                                 f"has {len(factors)} factors, its space {len(sp.dims)} "
                                 f"dimensions")
        prod = 1
        for f in factors:
            if f < 1:
                raise ShardplanError(f"node {v} ({names[v]!r}): split factors must be "
                                     f"positive, got {list(factors)}")
            prod *= f
        if prod > devices:
            raise ShardplanError(f"node {v} ({names[v]!r}): the configuration "
                                 f"{list(factors)} uses {prod} devices, its stage has "
                                 f"{devices}")
        shape = mesh_shape(devices)
        wanted, cut = factors, False
        lead = None if run_batch is None else _batch_dim(sp, int(graph.batch_size),
                                                         int(run_batch))
        if lead is not None and lead[1] % factors[lead[0]]:
            i = lead[0]
            wanted = (*factors[:i], math.gcd(factors[i], lead[1]), *factors[i + 1:])
            cut = True
        inputs = tuple((names[int(p)], tuple(tuple(g) for g in grp))
                       for p, grp in sp.inputs.items() if 0 <= int(p) < graph.num_nodes)
        # Prefer the axes each producer split the tensor dimension this dimension reads.
        preferred: list[list[int]] = [[] for _ in sp.dims]
        for p, grp in sp.inputs.items():
            src = out[int(p)] if 0 <= int(p) < graph.num_nodes else None
            if src is None or len(grp) != len(src.output):
                continue
            for g, src_group in zip(grp, src.output, strict=True):
                used = sorted({a for d in src_group for a in src.axes_of(d)})
                for d in g:
                    if not preferred[sp.dims.index(d)]:
                        preferred[sp.dims.index(d)] = used
        axes = _assign(wanted, shape, preferred)
        for dim, most in _MAX_AXES.get(graph.ops[v], {}).items():
            if dim in sp.dims and len(axes[sp.dims.index(dim)]) > most:
                i = sp.dims.index(dim)
                axes = (*axes[:i], axes[i][:most], *axes[i + 1:])
        laid = tuple(_size(shape, a) for a in axes)
        kind = sp.kind if raw is not None and raw[v] is not None else ""
        out[v] = NodeSharding(name=names[v], op=graph.ops[v], kind=kind, dims=sp.dims,
                              factors=laid, axes=axes, output=sp.output, inputs=inputs,
                              planned=factors if laid != factors else None,
                              batch_cut=cut and laid != factors)
    return tuple(o for o in out if o is not None)


def _size(shape: Sequence[int], axes: Sequence[int]) -> int:
    out = 1
    for a in axes:
        out *= int(shape[a])
    return out


def strategy_notes(shardings: Sequence[NodeSharding]) -> list[str]:
    """What the runtime does differently from the plan, said before it starts: configurations
    the mesh cannot lay out run with smaller splits; operators the graph gave no iteration
    space split their batch only where DTensor knows the operator, and run whole on every
    device of their stage where it does not (the run's result names those)."""
    notes = []
    small = [s for s in shardings if s.planned is not None and s.batch_cut]
    if small:
        shown = ", ".join(f"{s.name} {list(s.planned)} -> {list(s.factors)}" for s in small[:3])
        more = f" and {len(small) - 3} more" if len(small) > 3 else ""
        notes.append(f"{len(small)} configuration{'s' if len(small) > 1 else ''} split the "
                     f"batch by a factor that does not divide the micro-batch: "
                     f"{'they run' if len(small) > 1 else 'it runs'} with the largest split "
                     f"that does ({shown}{more})")
    cut = [s for s in shardings if s.planned is not None and not s.batch_cut]
    if cut:
        shown = ", ".join(f"{s.name} {list(s.planned)} -> {list(s.factors)}" for s in cut[:3])
        more = f" and {len(cut) - 3} more" if len(cut) > 3 else ""
        notes.append(f"{len(cut)} configuration{'s' if len(cut) > 1 else ''} split by a "
                     f"factor the device mesh has no axes for run{'' if len(cut) > 1 else 's'} "
                     f"with the largest split it has ({shown}{more})")
    loose = [s.name for s in shardings if not s.described]
    if loose:
        shown = ", ".join(loose[:4]) + (f" and {len(loose) - 4} more" if len(loose) > 4
                                        else "")
        notes.append(f"{len(loose)} operator{'s' if len(loose) > 1 else ''} without an "
                     f"iteration space ({shown}): split over the batch only, where their "
                     f"configuration says so and DTensor has a rule for the operator; "
                     f"otherwise run whole on every device of the stage")
    return notes


# ------------------------------------------------------------------- operator argument rules
_GEMM_WEIGHTS = {
    # op: {argument position: groups by space dimension name}
    "linear": {1: ("n", "k"), 2: ("n",)},
    "addmm": {0: ("n",), 2: ("k", "n")},
    "mm": {1: ("k", "n")},
    "embedding": {0: ("v", "n")},
    "conv2d": {1: ("o", "c", "r", "s"), 2: ("o",)},
    "convolution": {1: ("o", "c", "r", "s"), 2: ("o",)},
}


def arg_groups(sharding: NodeSharding, position: int | str, shape: Sequence[int],
               out_shape: Sequence[int] | None) -> Groups:
    """The space dimensions of each dimension of the tensor at argument ``position`` of the
    node's operator, for arguments the space does not describe (parameters, the model's
    inputs, values of operators the graph leaves out).

    Parameters and matrix operands follow the operator's layout (``linear``'s weight is
    ``(n, k)``, ``addmm``'s ``(k, n)``, a convolution's ``(o, c, r, s)``, an embedding
    table ``(v, n)``, a normalisation's weight the normalised dimension); other tensors
    broadcast against the output (a dimension of the output's size takes the output's
    dimensions). An operator without a space (kind ``""``) splits the leading dimension of
    tensors whose leading size is the output's, its batch. O(rank).
    """
    rank = len(shape)
    dims = set(sharding.dims)
    if not sharding.described:
        if "batch" in dims and rank and out_shape and shape[0] == out_shape[0]:
            return (("batch",),) + ((),) * (rank - 1)
        return ((),) * rank
    table = _GEMM_WEIGHTS.get(sharding.op, {})
    if isinstance(position, int) and position in table and len(table[position]) == rank:
        return tuple((d,) if d in dims else () for d in table[position])
    if sharding.kind == "gemm":
        mdims = [g[0] for g in sharding.output[:-1] if g]
        first = {"linear": 0, "addmm": 1, "mm": 0, "matmul": 0, "bmm": 0}.get(sharding.op)
        if position == first and rank == len(mdims) + 1:
            return tuple((d,) for d in mdims) + (("k",),)
        if sharding.op == "embedding" and position == 1 and rank == len(mdims):
            return tuple((d,) for d in mdims)
        if sharding.op in ("conv2d", "convolution") and position == 0 and rank == 4:
            return (("b",), ("c",), (), ())
        if sharding.op == "bmm" and position == 1 and rank == 3:
            return (("d0",), ("k",), ("n",))
        if sharding.op in ("mm", "matmul") and position == 1 and rank == 2:
            return (("k",), ("n",))
    if sharding.kind == "norm" and rank == 1:
        axis = "d1" if "batch_norm" in sharding.op else (sharding.dims[-1] if sharding.dims
                                                          else "")
        return ((axis,),) if axis in dims else ((),)
    if out_shape is None or rank > len(out_shape):
        return ((),) * rank
    # Broadcast against the output, aligned from the right.
    off = len(out_shape) - rank
    res = []
    for j in range(rank):
        k = off + j
        same = shape[j] == out_shape[k] and k < len(sharding.output)
        res.append(tuple(sharding.output[k]) if same else ())
    return tuple(res)
