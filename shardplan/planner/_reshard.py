"""Moving an LLM plan's training state from one layout to another (issue 48, item 1): what
each device must receive, over which links, and how long it takes.

**What moves.** The state a change of layout must carry over is the optimizer's: the fp32
master weights and the optimizer's moments (in fp32 training, the weights and the moments):
``master + 4 x OPTIMIZER_STATE`` bytes per parameter (12 for Adam, ZeRO's accounting,
Rajbhandari et al. 2020). The half-precision working weights are not moved -- a device casts
them from its master copy, or, under ZeRO-1, gathers them in the parameter all-gather every
step makes -- nor are the gradients (a step starts them at zero), nor activations (the
interrupted step is run again).

**Where a layout keeps it** (the rank order of :mod:`shardplan.ir.parallel`). A pipeline rank
holds the parameters of its virtual stages' blocks, the embedding with the first stage and the
head with the last (the plan's stages). Tensor-parallel rank ``t`` of ``tp`` holds the
``t``-th of ``tp`` equal slices of each of them (Megatron splits every matrix of a block and
the vocabulary; the norms it replicates are under 0.01 % of a block and are counted as split
too; a mixture of experts' routed experts, which live on the expert grid of ``ep x etp``
(issue 47), are counted as split like the dense layers: for an expert-parallel layout the
reshard is that approximation). The slice is split again into ``S`` equal shards over the
ranks that shard the optimizer: ``S = dp x cp`` under ZeRO-1 and under FSDP of the whole
data-parallel group, ``dp_shard x cp`` under FSDP / HSDP with ``dp_shard > 1`` (replicated
over ``dp``), 1 under DDP (the group that reduces the gradients,
``shardplan.cost._llm_layout._groups``). So a device holds, of every parameter of its
pipeline rank, one interval of the unit line::

    [(t + k / S) / tp, (t + (k + 1) / S) / tp)

``k`` its index among the ``S`` sharding ranks (context fastest, then the shard, then the
replica). The state two devices share is the parameters both pipeline ranks hold times the
overlap of their intervals. Two devices of one layout with the same (pipeline rank, tensor
rank, shard) *triple* hold the same state (replicas); different triples hold disjoint state.

**What a device receives.** The new layout's share of the state, less what the device held in
the old layout (it keeps that), from the cheapest source: a surviving device of its own node
that held it (NVLink; the union over the node's distinct triples is exact, they are
disjoint), else a surviving device of another node (the network), else -- no surviving device
holds it: an old triple whose every holder was removed -- the last checkpoint (read over the
device's NIC from storage; the plan's other devices roll back to that checkpoint too, which
:mod:`shardplan.simulate._failures` charges).

**Time.** Every device receives at once: a device's time is its NVLink bytes over its NVLink
bandwidth plus its network and checkpoint bytes over its share of the node's NICs, both at
NCCL's efficiency on a GPU (``shardplan.cost._gpu``); the reshard takes the busiest device's
time, and at least the checkpoint's bytes over the storage's aggregate bandwidth when one is
given. Senders are taken to spread their load over a triple's replicas (a sender is never
busier than its receivers); latencies (microseconds) are left out of transfers of gigabytes.

Everything is NumPy over the devices: O(W g + W x lost triples) for W devices, nodes of g.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from shardplan.cost._formulas import OPTIMIZER_STATE
from shardplan.cost._llm import block_layout, precision_bytes
from shardplan.errors import ShardplanError
from shardplan.ir import ExecutionSettings, Graph, ParallelConfig, Topology

__all__ = ["Fabric", "Placement", "Reshard", "assign_nodes", "block_moves",
           "device_state_bytes", "fabric_of", "reshard", "shard_count",
           "state_bytes_per_param"]


@dataclass(frozen=True, eq=False)
class Placement:
    """A layout on physical devices.

    Attributes
    ----------
    parallel, settings
        The layout and how it trains (precision, optimizer, gradient sync).
    devices : ndarray of int, shape (world_size,)
        The physical device of each rank, in the shared numbering of a :class:`Fabric`;
        ``-1``: the rank's device is gone.
    """

    parallel: ParallelConfig
    settings: ExecutionSettings
    devices: np.ndarray


@dataclass(frozen=True, eq=False)
class Fabric:
    """The physical devices both layouts run on, and the links between them.

    Attributes
    ----------
    node : ndarray of int
        The node of every physical device.
    alive : ndarray of bool
        Whether it survives.
    intra_bandwidth, inter_bandwidth : float
        Effective bytes/s of a transfer inside a node (NVLink) and of a device's share of its
        node's NICs (the network and storage reads).
    storage_bandwidth : float or None
        Aggregate bytes/s the checkpoint's storage serves (None: not a limit).
    """

    node: np.ndarray
    alive: np.ndarray
    intra_bandwidth: float
    inter_bandwidth: float
    storage_bandwidth: float | None = None


@dataclass(frozen=True, eq=False)
class Reshard:
    """What :func:`reshard` found. Bytes are totals over the new layout's devices; the
    ``per_rank`` arrays are per new rank (``kept``, ``nvlink``, ``network``,
    ``checkpoint``, ``seconds``)."""

    state_bytes: float
    kept_bytes: float
    nvlink_bytes: float
    network_bytes: float
    checkpoint_bytes: float
    max_receive_bytes: float
    busiest_rank: int
    seconds: float
    per_rank: dict[str, np.ndarray]

    @property
    def moved_bytes(self) -> float:
        """Bytes received over any link (NVLink, network, checkpoint reads)."""
        return self.nvlink_bytes + self.network_bytes + self.checkpoint_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"state_bytes": self.state_bytes, "kept_bytes": self.kept_bytes,
                "moved_bytes": self.moved_bytes,
                "bytes_by_link": {"nvlink": self.nvlink_bytes, "network": self.network_bytes,
                                  "checkpoint": self.checkpoint_bytes},
                "max_receive_bytes": self.max_receive_bytes,
                "busiest_rank": self.busiest_rank, "seconds": self.seconds}


def state_bytes_per_param(settings: ExecutionSettings) -> float:
    """Bytes per parameter of the state a reshard moves (module docstring): the master
    weights (the weights themselves in fp32) and the optimizer's state. O(1).

    Examples
    --------
    >>> state_bytes_per_param(ExecutionSettings(precision="bf16", optimizer="adam"))
    12.0
    >>> state_bytes_per_param(ExecutionSettings(precision="fp32", optimizer="sgd"))
    4.0
    """
    w, _, master = precision_bytes(settings.precision)
    return float(master if master else w) + 4.0 * OPTIMIZER_STATE[settings.optimizer]


def shard_count(parallel: ParallelConfig, settings: ExecutionSettings) -> int:
    """``S``: the ranks one tensor-parallel slice of the optimizer state is split over
    (module docstring). O(1).

    Examples
    --------
    >>> shard_count(ParallelConfig(dp=4, cp=2), ExecutionSettings(gradient_sync="zero1"))
    8
    >>> shard_count(ParallelConfig(dp=2, dp_shard=4), ExecutionSettings())
    4
    >>> shard_count(ParallelConfig(dp=4), ExecutionSettings(gradient_sync="bucketed"))
    1
    """
    if parallel.dp_shard > 1:
        return parallel.dp_shard * parallel.cp
    if settings.gradient_sync in ("sharded", "zero1"):
        return parallel.data_parallel * parallel.cp
    return 1


def device_state_bytes(graph: Graph, parallel: ParallelConfig,
                       settings: ExecutionSettings) -> float:
    """The most state one device of the layout holds (module docstring): what it writes
    to a checkpoint when every distinct shard is written once, in parallel. O(n).

    """
    params, blocks = _units(graph)
    ranks = _unit_ranks(blocks, len(blocks) - 2, parallel)
    per_rank = np.bincount(ranks, weights=params, minlength=parallel.pp)
    return float(per_rank.max() * state_bytes_per_param(settings)
                 / (parallel.tp * shard_count(parallel, settings)))


@dataclass(frozen=True, eq=False)
class _Holdings:
    """Per rank of a layout: its pipeline rank, its interval, its triple's id."""

    pp: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    triple: np.ndarray
    num_triples: int


def _holdings(parallel: ParallelConfig, settings: ExecutionSettings) -> _Holdings:
    """Every rank's share of the state (module docstring). O(world_size)."""
    r = np.arange(parallel.world_size, dtype=np.int64)
    tp = parallel.tp
    s = shard_count(parallel, settings)
    t = r % tp
    k = ((r % parallel.devices_per_rank) // tp) % s
    pp = r // parallel.devices_per_rank
    lo = (t + k / s) / tp
    hi = (t + (k + 1) / s) / tp
    return _Holdings(pp, lo, hi, (pp * tp + t) * s + k, parallel.pp * tp * s)


def _units(graph: Graph) -> tuple[np.ndarray, np.ndarray]:
    """The parameters of every unit (the embedding, each block, the head) and the block
    index of each unit (-1 the embedding, ``num_blocks`` the head). O(n)."""
    layout = block_layout(graph)
    dtype = float(graph.meta.get("dtype_bytes", 4)) if isinstance(graph.meta, dict) else 4.0
    key = np.clip(layout.block, -1, layout.num_blocks) + 1
    params = np.bincount(key, weights=graph.param_bytes.astype(np.float64) / dtype,
                         minlength=layout.num_blocks + 2)
    return params, np.arange(-1, layout.num_blocks + 1)


def _unit_ranks(blocks: np.ndarray, num_blocks: int, parallel: ParallelConfig) -> np.ndarray:
    """The pipeline rank holding each unit: a block's virtual stage mod pp, the embedding
    on rank 0, the head on the last virtual stage's rank (the plan's stages). O(units)."""
    per = parallel.layers_per_stage(num_blocks)
    bounds = np.concatenate(([0], np.cumsum(per)))
    inner = np.clip(blocks, 0, num_blocks - 1)
    stage = np.searchsorted(bounds, inner, side="right") - 1
    stage = np.where(blocks < 0, 0, np.where(blocks >= num_blocks, parallel.num_stages - 1,
                                             stage))
    return stage % parallel.pp


def _layer_overlap(graph: Graph, old: ParallelConfig, new: ParallelConfig
                   ) -> tuple[np.ndarray, np.ndarray]:
    """``(shared, held)``: parameters held by both new pipeline rank a and old rank b
    (``shared[a, b]``), and by each new rank. O(units + pp_new pp_old)."""
    params, blocks = _units(graph)
    num_blocks = len(blocks) - 2
    ro = _unit_ranks(blocks, num_blocks, old)
    rn = _unit_ranks(blocks, num_blocks, new)
    shared = np.zeros((new.pp, old.pp))
    np.add.at(shared, (rn, ro), params)
    return shared, shared.sum(axis=1)


def _overlap(shared: np.ndarray, hn: _Holdings, a: np.ndarray, ho: _Holdings,
             b: np.ndarray) -> np.ndarray:
    """Parameters new ranks ``a`` and old ranks ``b`` (``-1``: none) both hold,
    elementwise (broadcasting). O(size)."""
    bb = np.maximum(b, 0)
    width = np.minimum(hn.hi[a], ho.hi[bb]) - np.maximum(hn.lo[a], ho.lo[bb])
    return np.where(b >= 0, shared[hn.pp[a], ho.pp[bb]] * np.maximum(width, 0.0), 0.0)


def _old_rank_of(old: Placement, fabric: Fabric) -> np.ndarray:
    """The old rank each physical device held, ``-1`` for none or a removed device."""
    out = np.full(fabric.node.size, -1, dtype=np.int64)
    dev = np.asarray(old.devices, dtype=np.int64)
    ok = dev >= 0
    out[dev[ok]] = np.flatnonzero(ok)
    out[~fabric.alive] = -1
    return out


def _members(node: np.ndarray) -> np.ndarray:
    """``members[n, slot]``: the physical devices of node n (``-1`` pads). O(devices)."""
    order = np.argsort(node, kind="stable")
    counts = np.bincount(node)
    width = int(counts.max()) if counts.size else 1
    out = np.full((counts.size, width), -1, dtype=np.int64)
    start = np.concatenate(([0], np.cumsum(counts)[:-1]))
    slot = np.arange(order.size) - np.repeat(start, counts)
    out[node[order], slot] = order
    return out


def reshard(graph: Graph, old: Placement, new: Placement, fabric: Fabric) -> Reshard:
    """The bytes each device of ``new`` receives to hold its share of the state that
    ``old`` held, by link, and the time it takes (module docstring).
    O(W g + W x lost triples).

    Raises
    ------
    ShardplanError
        A rank of ``new`` on a removed or unknown device.
    """
    dev = np.asarray(new.devices, dtype=np.int64)
    if dev.size != new.parallel.world_size or (dev < 0).any() or \
            not fabric.alive[dev].all():
        raise ShardplanError("the new layout must run on surviving devices, one per rank")
    x = state_bytes_per_param(new.settings)
    shared, held = _layer_overlap(graph, old.parallel, new.parallel)
    ho, hn = _holdings(old.parallel, old.settings), _holdings(new.parallel, new.settings)
    a = np.arange(dev.size)
    need = held[hn.pp] * (hn.hi - hn.lo)
    old_rank = _old_rank_of(old, fabric)
    b_self = old_rank[dev]
    kept = _overlap(shared, hn, a, ho, b_self)
    self_t = np.where(b_self >= 0, ho.triple[np.maximum(b_self, 0)], -1)
    nvlink = _node_mates(shared, hn, ho, dev, old_rank, self_t, fabric)
    lost = _lost(shared, hn, ho, old, fabric)
    network = np.maximum(need - kept - nvlink - lost, 0.0)
    kept, nvlink, network, lost = (v * x for v in (kept, nvlink, network, lost))
    secs = nvlink / fabric.intra_bandwidth + (network + lost) / fabric.inter_bandwidth
    total = secs.max(initial=0.0)
    if fabric.storage_bandwidth:
        total = max(total, float(lost.sum()) / fabric.storage_bandwidth)
    received = nvlink + network + lost
    busiest = int(np.argmax(secs)) if secs.size else 0
    return Reshard(state_bytes=float(need.sum() * x), kept_bytes=float(kept.sum()),
                   nvlink_bytes=float(nvlink.sum()), network_bytes=float(network.sum()),
                   checkpoint_bytes=float(lost.sum()),
                   max_receive_bytes=float(received.max(initial=0.0)), busiest_rank=busiest,
                   seconds=float(total),
                   per_rank={"kept": kept, "nvlink": nvlink, "network": network,
                             "checkpoint": lost, "seconds": secs})


def _node_mates(shared: np.ndarray, hn: _Holdings, ho: _Holdings, dev: np.ndarray,
                old_rank: np.ndarray, self_t: np.ndarray, fabric: Fabric) -> np.ndarray:
    """What the other surviving devices of each new rank's node held of its share: the
    sum over their distinct triples (other than its own). O(W g^2)."""
    members = _members(fabric.node)
    rows = members[fabric.node[dev]]
    a = np.arange(dev.size)
    out = np.zeros(dev.size)
    seen: list[np.ndarray] = [self_t]
    for o in range(members.shape[1]):
        m = rows[:, o]
        b = np.where(m >= 0, old_rank[np.maximum(m, 0)], -1)
        t = np.where(b >= 0, ho.triple[np.maximum(b, 0)], -1)
        fresh = (b >= 0) & (m != dev)
        for prior in seen:
            fresh &= t != prior
        out += np.where(fresh, _overlap(shared, hn, a, ho, np.where(fresh, b, -1)), 0.0)
        seen.append(np.where(fresh, t, -2))
    return out


def _lost(shared: np.ndarray, hn: _Holdings, ho: _Holdings, old: Placement,
          fabric: Fabric) -> np.ndarray:
    """Per new rank, its share of the old triples no surviving device holds (from the
    checkpoint). O(W x lost triples), in chunks."""
    dev = np.asarray(old.devices, dtype=np.int64)
    alive = (dev >= 0) & fabric.alive[np.maximum(dev, 0)]
    count = np.bincount(ho.triple[alive], minlength=ho.num_triples)
    rep = np.full(ho.num_triples, -1, dtype=np.int64)
    rep[ho.triple[::-1]] = np.arange(ho.triple.size)[::-1]
    lost = rep[(count == 0) & (rep >= 0)]
    w = hn.pp.size
    out = np.zeros(w)
    a = np.arange(w)[:, None]
    for lo in range(0, lost.size, 256):
        b = lost[None, lo:lo + 256]
        out += _overlap(shared, hn, a, ho, b).sum(axis=1)
    return out


def fabric_of(topology: Topology, alive: np.ndarray | None = None, *,
              storage_bandwidth: float | None = None) -> Fabric:
    """The :class:`Fabric` of a topology: nodes from its innermost level (every device its
    own node without levels), NVLink the bandwidth between two devices of the first node
    with two, the network a GPU's share of its node's NICs (the cluster preset's
    ``inter_bandwidth``, else the bandwidth between the first two nodes), both at NCCL's
    efficiency on a known GPU (:func:`shardplan.cost.gpu_model`). O(devices)."""
    from shardplan.cost._gpu import gpu_model, node_ids

    node = node_ids(topology)
    n = topology.num_devices
    alive = np.ones(n, dtype=bool) if alive is None else np.asarray(alive, dtype=bool)
    members = _members(node)
    pair = next((row[:2] for row in members if (row >= 0).sum() >= 2), None)
    intra = float(topology.bandwidth[int(pair[0]), int(pair[1])]) if pair is not None else 0.0
    gen = topology.meta.get("generator") if isinstance(topology.meta, dict) else None
    opts = gen.get("options") if isinstance(gen, dict) else None
    inter = float(opts.get("inter_bandwidth") or 0.0) if isinstance(opts, dict) else 0.0
    if not inter and members.shape[0] > 1:
        inter = float(topology.bandwidth[int(members[0, 0]), int(members[1, 0])])
    inter = inter or intra or 1.0
    intra = intra or inter
    model = gpu_model(topology)
    eff = model.nccl_efficiency if model is not None else 1.0
    return Fabric(node=node, alive=alive, intra_bandwidth=eff * intra,
                  inter_bandwidth=eff * inter, storage_bandwidth=storage_bandwidth)


def assign_nodes(graph: Graph, old: Placement, parallel: ParallelConfig,
                 settings: ExecutionSettings, fabric: Fabric, nodes: np.ndarray
                 ) -> np.ndarray:
    """The physical devices of the new layout's ranks: the new ranks fill whole nodes in
    rank order, and each group of ``g`` ranks (a *slot*) goes to the candidate node (a row
    of ``nodes``, its devices in slot order) where its devices already hold the most of
    their new state: an assignment problem over the state kept in place, solved exactly.
    Slots (and nodes) that hold the same state form a class; between classes it is a
    transportation problem (``scipy.optimize.linprog``, whose vertices are integral), and
    when the classes are hardly fewer than the slots an assignment
    (``scipy.optimize.linear_sum_assignment``). A class takes its nodes, and fills its
    slots, in their order. A layout smaller than a node takes the first ``world_size``
    devices of its best node. O(C_new C_old g) for the class scores, plus the solver.

    Raises
    ------
    ShardplanError
        Fewer candidate devices than the layout needs.
    """
    nodes = np.asarray(nodes, dtype=np.int64)
    g = nodes.shape[1]
    w = parallel.world_size
    if w > nodes.size:
        raise ShardplanError(f"{parallel.label()} needs {w} devices, {nodes.size} survive")
    shared, _ = _layer_overlap(graph, old.parallel, parallel)
    ho, hn = _holdings(old.parallel, old.settings), _holdings(parallel, settings)
    old_rank = _old_rank_of(old, fabric)
    if w < g or w % g:
        width = min(w, g) if w <= g else w
        a = np.arange(width)
        scores = [_overlap(shared, hn, a, ho, old_rank[row[:width]]).sum() for row in nodes]
        return nodes[int(np.argmax(scores))][:w] if w <= g else nodes.reshape(-1)[:w]
    slots = np.arange(w).reshape(-1, g)
    held = old_rank[nodes]
    hb = np.maximum(held, 0)
    sig_new = np.concatenate([hn.pp[slots], hn.lo[slots], hn.hi[slots]], axis=1)
    sig_old = np.where(np.tile(held >= 0, 3), np.concatenate(
        [ho.pp[hb], ho.lo[hb], ho.hi[hb]], axis=1), -1.0)
    _, first_n, cls_n = np.unique(sig_new, axis=0, return_index=True, return_inverse=True)
    _, first_o, cls_o = np.unique(sig_old, axis=0, return_index=True, return_inverse=True)
    cls_n, cls_o = cls_n.reshape(-1), cls_o.reshape(-1)
    score = np.zeros((first_n.size, first_o.size))
    for i in range(g):
        score += _overlap(shared, hn, slots[first_n, i][:, None], ho,
                          held[first_o, i][None, :])
    pick = _transport(score, cls_n, cls_o)
    return nodes[pick].reshape(-1)


def _transport(score: np.ndarray, cls_n: np.ndarray, cls_o: np.ndarray) -> np.ndarray:
    """The node of each slot maximising the summed ``score[class of slot, class of node]``
    (:func:`assign_nodes`), each node used once. O(LP) or O(K^2 N)."""
    from scipy.optimize import linear_sum_assignment, linprog
    from scipy.sparse import coo_matrix

    cn, co = score.shape
    count_n = np.bincount(cls_n, minlength=cn)
    count_o = np.bincount(cls_o, minlength=co)
    k, n = cls_n.size, cls_o.size
    if cn * co > 200_000 or (cn > k // 2 and co > n // 2):
        full = score[cls_n][:, cls_o].astype(np.float32)
        top = float(full.max(initial=0.0)) or 1.0
        pos = np.abs(np.arange(k)[:, None] / k - np.arange(n)[None, :] / n)
        _, cols = linear_sum_assignment(full - np.float32(1e-4 * top) * pos, maximize=True)
        return cols
    var = np.arange(cn * co)
    rows_eq = coo_matrix((np.ones(var.size), (var // co, var)), shape=(cn, var.size))
    rows_ub = coo_matrix((np.ones(var.size), (var % co, var)), shape=(co, var.size))
    res = linprog(-score.reshape(-1), A_ub=rows_ub, b_ub=count_o, A_eq=rows_eq,
                  b_eq=count_n, bounds=(0, None), method="highs")
    flow = np.rint(res.x).astype(np.int64).reshape(cn, co) if res.status == 0 else None
    if flow is None or (flow.sum(axis=1) != count_n).any() or \
            (flow.sum(axis=0) > count_o).any():
        raise ShardplanError("the assignment of slots to nodes failed")  # pragma: no cover
    nodes_of = [list(np.flatnonzero(cls_o == o)) for o in range(co)]
    out = np.empty(k, dtype=np.int64)
    for c in range(cn):
        take = [x for o in range(co) for x in nodes_of[o][:flow[c, o]] ]
        for o in range(co):
            del nodes_of[o][:flow[c, o]]
        out[np.flatnonzero(cls_n == c)] = sorted(take)
    return out


def block_moves(graph: Graph, old: ParallelConfig, new: ParallelConfig
                ) -> list[dict[str, Any]]:
    """Per new pipeline rank, the blocks it holds (as ranges of block indices, first and
    last) and, per old pipeline rank they come from, which:
    ``[{"pp": 0, "blocks": [[0, 7]], "from": {"0": [[0, 6]], "1": [[7, 7]]}}]`` (the
    embedding and the head stay with the first and last rank). O(blocks).

    Examples
    --------
    >>> _ranges(np.array([0, 1, 2, 5, 6, 9]))
    [[0, 2], [5, 6], [9, 9]]
    """
    _, blocks = _units(graph)
    nb = len(blocks) - 2
    inner = blocks[1:-1]
    ro = _unit_ranks(inner, nb, old)
    rn = _unit_ranks(inner, nb, new)
    out = []
    for p in range(new.pp):
        src = {str(int(q)): _ranges(inner[(rn == p) & (ro == q)])
               for q in np.unique(ro[rn == p])}
        out.append({"pp": p, "blocks": _ranges(inner[rn == p]), "from": src})
    return out


def _ranges(ids: np.ndarray) -> list[list[int]]:
    """Sorted integers as ``[first, last]`` runs."""
    if ids.size == 0:
        return []
    cut = np.flatnonzero(np.diff(ids) != 1) + 1
    return [[int(r[0]), int(r[-1])] for r in np.split(ids, cut)]
