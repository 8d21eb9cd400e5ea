"""Mixture-of-experts layers of the LLM plan kind (:mod:`shardplan.runtime._llm`): expert
parallelism with torch's own collectives on Megatron-Core's folded expert grid.

The zoo's MoE decoders (:mod:`shardplan.workload.moe`) route each token to ``top_k`` of
``E`` experts held as ``(E, ...)`` weights of ``moe.experts``. Split over the devices of a
pipeline rank, a layer runs as follows.

**The expert grid** (:meth:`ParallelConfig.expert_coordinates`): inside each pipeline rank's
block of ``D = tp * cp * dp_shard * dp`` devices the expert-tensor-parallel index varies
fastest, then the expert-parallel index, then the expert data-parallel replica. It is a
second :class:`~torch.distributed.device_mesh.DeviceMesh` of every rank, dimensions
``pp, edp, ep, etp`` (row-major, so its numbering is the layout's), over the same devices as
the dense mesh. Rank ``(etp_i, ep_i, edp_i)`` holds experts ``ep_i * E / ep`` to
``(ep_i + 1) * E / ep - 1``, and of each the ``etp_i``-th slice of the hidden width: ``w1``
and ``w3`` ``(E / ep, dim, hidden / etp)``, ``w2`` ``(E / ep, hidden / etp, dim)``. They stay
parameters of the model's names, as DTensors on the ``(edp, ep, etp)`` mesh with placements
``Replicate, Shard(0), Shard(2 | 1)`` (``full_tensor`` gives the whole weight back).

**Tokens** (module docstring of :mod:`~shardplan.runtime._llm`): the ranks of one
data-parallel part hold that part's tokens, replicated over its ``tp`` ranks (under sequence
parallelism the layer first gathers the sequence). The router runs on all of them, as the
dense layers' replicated norms do; then each tensor-parallel rank keeps the ``tp_i``-th
contiguous slice of its part's tokens (forward: a slice; backward: the slices' gradients
all-gathered), so every token of the micro-batch is routed from exactly one rank, and the
ranks of a block, in rank order, hold the micro-batch's tokens in its own order.

**Capacity**: the zoo's ``capacity_factor`` gives each expert ``ceil(f * T * top_k / E)``
slots for the micro-batch's ``T`` tokens and keeps a token's choice when it is among the
first that many choices of that expert in token order (None: dropless). One all-gather of
each rank's choices per expert over the block (every layer's forward; it also gives every
rank the all-to-alls' splits) makes every rank's decision the one a single process running
the micro-batch whole makes: a choice's place is the choices of the ranks before it plus its
own place among its rank's.

**Dispatch** (Megatron-Core's ``alltoall`` dispatcher): within its ``ep * etp`` ranks of one
expert data-parallel replica, each rank sends every kept choice to the ``etp`` ranks holding
its expert (one ``all_to_all_single`` with variable splits, each ``etp``-th slice receiving a
copy), the receivers run their experts as one ``torch.bmm`` per projection over a
``(E / ep, rows, dim)`` tensor padded to the most rows one of them received, with their
slices of the weights (as the model's ``GroupedExperts`` does), and a second
``all_to_all_single`` returns the outputs (partial sums over the hidden width under
``etp > 1``), which the sender sums per choice and combines with the router's weights.
Megatron-Core sends each token to one expert-tensor-parallel rank and all-gathers it over
the others; sending the copies directly moves the same bytes in one collective. The backward
of each all-to-all is the all-to-all with the splits swapped.

**Gradients**: the router and the shared experts are dense parameters (the router
replicated, the shared experts split over ``tp`` as a dense MLP); each rank's expert
gradients hold every token the replica's ranks routed to them, so they are summed over the
``expert_dp`` replicas (one all-reduce) and divided by the ``dp * dp_shard`` data-parallel
parts (each part's loss is its mean; the step's loss the parts' mean). FSDP leaves the
experts alone (``ignored_params``).

Not run yet: GPT-OSS's attention sinks under tensor parallelism (refused in one line); the
``allgather`` dispatcher (the plan's ``moe_dispatcher`` is not read: every run is
``alltoall``, and ``train`` notes it); under FSDP the experts are replicated over
``expert_dp``, not sharded.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shardplan.errors import ShardplanError
from shardplan.runtime._reduce import all_reduce_mean

__all__ = ["EXPERT_MESH_DIMS", "ExpertGrid", "apply_expert_parallel", "build_expert_grid",
           "has_moe", "moe_block_plan", "parallelize_moe_block", "reduce_expert_gradients",
           "route"]

EXPERT_MESH_DIMS = ("pp", "edp", "ep", "etp")
#: Expert weights and the dimension ``etp`` splits (None: replicated over ``etp``).
_EXPERT_WEIGHTS = {"w1": 2, "w3": 2, "w2": 1, "b1": 2, "b3": 2, "b2": None}


# ---------------------------------------------------------------------------- grid
@dataclass(frozen=True, kw_only=True, slots=True)
class ExpertGrid:
    """This rank's place in the expert grid (module docstring) and its groups.

    Attributes
    ----------
    ep, etp, edp : int
        Expert-parallel, expert-tensor-parallel and expert data-parallel degrees.
    ep_index, etp_index : int
        This rank's coordinates.
    block_index, block_size : int
        This rank's place among its pipeline rank's devices (``rank % D``) and ``D``.
    tp, tp_index : int
        The dense layers' tensor-parallel degree and this rank's index.
    parts : int
        Data-parallel parts of a micro-batch (``dp * dp_shard``).
    mesh : DeviceMesh
        The ``(edp, ep, etp)`` mesh of this pipeline rank, the expert weights' DTensor mesh.
    block_group, dispatch_group, edp_group, tp_group : ProcessGroup
        The pipeline rank's ``D`` devices; the ``ep * etp`` ranks of this expert
        data-parallel replica (rank order = ``etp_i + etp * ep_i``); the replicas of this
        rank's experts; the dense tensor-parallel group.
    """

    ep: int
    etp: int
    edp: int
    ep_index: int
    etp_index: int
    block_index: int
    block_size: int
    tp: int
    tp_index: int
    parts: int
    mesh: Any
    block_group: Any
    dispatch_group: Any
    edp_group: Any
    tp_group: Any

    @property
    def dispatch_index(self) -> int:
        """This rank's rank in :attr:`dispatch_group`."""
        return self.etp_index + self.etp * self.ep_index


def has_moe(model: nn.Module) -> bool:
    """Whether any block of ``model`` is a mixture of experts (has ``moe.experts``)."""
    layers = getattr(model, "layers", None)
    blocks = layers.values() if isinstance(layers, nn.ModuleDict) else layers or ()
    return any(hasattr(getattr(b, "moe", None), "experts") for b in blocks)


def build_expert_grid(parallel: Any, rank: int, device_type: str, dense_mesh: Any
                      ) -> ExpertGrid:
    """The expert grid of ``parallel`` on this rank: the ``(pp, edp, ep, etp)`` DeviceMesh
    and the groups :class:`ExpertGrid` names. Collective: every rank calls it, in the same
    order as its other group creations."""
    from torch.distributed.device_mesh import init_device_mesh

    pc = parallel
    per, etp, ep, edp = pc.devices_per_rank, pc.expert_tp, pc.ep, pc.expert_dp
    mesh = init_device_mesh(device_type, (pc.pp, edp, ep, etp),
                            mesh_dim_names=EXPERT_MESH_DIMS)
    blocks = [[p * per + i for i in range(per)] for p in range(pc.pp)]
    slabs = [[p * per + r * ep * etp + j for j in range(ep * etp)]
             for p in range(pc.pp) for r in range(edp)]
    block_group = _subgroup(blocks)
    dispatch_group = _subgroup(slabs)
    coords, dense = pc.expert_coordinates(rank), pc.coordinates(rank)
    return ExpertGrid(ep=ep, etp=etp, edp=edp, ep_index=coords["ep"],
                      etp_index=coords["etp"], block_index=rank % per, block_size=per,
                      tp=pc.tp, tp_index=dense["tp"], parts=pc.data_parallel,
                      mesh=mesh["edp", "ep", "etp"], block_group=block_group,
                      dispatch_group=dispatch_group, edp_group=mesh["edp"].get_group(),
                      tp_group=dense_mesh["tp"].get_group())


def _subgroup(ranks: list[list[int]]) -> Any:
    """This rank's group among disjoint ``ranks`` lists covering the world (collective)."""
    if len(ranks) == 1:
        return dist.group.WORLD
    mine, _ = dist.new_subgroups_by_enumeration(ranks)
    return mine


# ---------------------------------------------------------------------- experts
def apply_expert_parallel(stage: nn.Module, grid: ExpertGrid) -> list[nn.Parameter]:
    """Split the routed experts of ``stage``'s MoE blocks over the grid (this rank's slice of
    each, DTensor parameters under the model's names) and route their tokens by
    :func:`route`. Returns the expert parameters (reduced by
    :func:`reduce_expert_gradients`).

    Raises
    ------
    ShardplanError
        ``ep`` not dividing the experts, ``etp`` not dividing an expert's hidden width.
    """
    out: list[nn.Parameter] = []
    for block in stage.layers.values():
        moe = getattr(block, "moe", None)
        if moe is None or not hasattr(moe, "experts"):
            continue
        out.extend(_shard_experts(moe.experts, grid))
        factor = moe.dispatch.capacity_factor
        moe.forward = functools.partial(_moe_forward, moe, grid, factor)
    return out


def _shard_experts(experts: nn.Module, grid: ExpertGrid) -> list[nn.Parameter]:
    from torch.distributed.tensor import DTensor, Replicate, Shard

    num, hidden = experts.w1.shape[0], experts.w1.shape[2]
    if num % grid.ep:
        raise ShardplanError(f"expert parallelism {grid.ep} does not divide the {num} experts")
    if hidden % grid.etp:
        raise ShardplanError(f"expert tensor parallelism {grid.etp} does not divide an "
                             f"expert's hidden width ({hidden})")
    out = []
    for name, dim in _EXPERT_WEIGHTS.items():
        full = getattr(experts, name, None)
        if full is None:
            continue
        local = full.detach().chunk(grid.ep, 0)[grid.ep_index]
        if dim is not None:
            local = local.chunk(grid.etp, dim)[grid.etp_index]
        placements = (Replicate(), Shard(0), Shard(dim) if dim is not None else Replicate())
        param = nn.Parameter(DTensor.from_local(local.clone(), grid.mesh, placements,
                                                run_check=False))
        setattr(experts, name, param)
        out.append(param)
    return out


def _local(p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A parameter's local slice (the autograd graph keeps its DTensor gradient) in the
    activations' precision."""
    from torch.distributed.tensor import DTensor

    t = p.to_local() if isinstance(p, DTensor) else p
    return t.to(dtype)


def _expert_mlp(experts: nn.Module, x: torch.Tensor, first: bool) -> torch.Tensor:
    """This rank's slice of every local expert's SwiGLU on ``x`` ``(E / ep, rows, dim)``:
    the whole output when ``etp == 1``, else a partial sum over the hidden width.
    ``first``: this rank adds the output bias (the others add a zero that still carries its
    gradient, so every replica of the bias receives the whole gradient)."""
    import torch.nn.functional as F

    w1, w2, w3 = (_local(getattr(experts, n), x.dtype) for n in ("w1", "w2", "w3"))
    gate, up = torch.bmm(x, w1), torch.bmm(x, w3)
    if experts.b1 is not None and experts.b3 is not None:
        gate, up = gate + _local(experts.b1, x.dtype), up + _local(experts.b3, x.dtype)
    if experts.limit is None:
        h = F.silu(gate) * up
    else:  # GPT-OSS's clamped SwiGLU (shardplan.workload.moe.GroupedExperts)
        gate, up = gate.clamp(max=experts.limit), up.clamp(-experts.limit, experts.limit)
        h = gate * torch.sigmoid(1.702 * gate) * (up + 1)
    out = torch.bmm(h, w2)
    if experts.b2 is not None:
        b2 = _local(experts.b2, x.dtype)
        out = out + (b2 if first else b2 - b2.detach())
    return out


# --------------------------------------------------------------------- routing
def _moe_forward(moe: nn.Module, grid: ExpertGrid, factor: float | None,
                 x: torch.Tensor) -> torch.Tensor:
    """The MoE layer on this rank (module docstring): the router on the part's tokens, this
    tensor-parallel rank's slice of them routed by :func:`route`, the slices gathered back,
    the shared experts added."""
    b, s, d = x.shape
    flat = x.reshape(b * s, d)
    weights, choice = moe.router(flat)
    if grid.tp > 1:
        if flat.shape[0] % grid.tp:
            raise ShardplanError(f"tensor parallelism {grid.tp} does not divide the "
                                 f"{flat.shape[0]} tokens of a micro-batch part (a mixture "
                                 f"of experts routes a slice of them from each rank)")
        n = flat.shape[0] // grid.tp
        mine = slice(grid.tp_index * n, (grid.tp_index + 1) * n)
        out = route(moe.experts, grid, factor, _Slice.apply(flat, grid.tp_group, mine),
                    _Slice.apply(weights, grid.tp_group, mine), choice[mine])
        out = _Gather.apply(out, grid.tp_group, mine)
    else:
        out = route(moe.experts, grid, factor, flat, weights, choice)
    if moe.shared_experts is not None:
        out = out + moe.shared_experts(flat)
    return out.view(b, s, d)


def route(experts: nn.Module, grid: ExpertGrid, factor: float | None, x: torch.Tensor,
          weights: torch.Tensor, choice: torch.Tensor) -> torch.Tensor:
    """This rank's tokens ``x`` ``(n, dim)`` through their chosen experts (``choice``,
    ``weights``: ``(n, top_k)``) across the grid, combined: ``(n, dim)``.

    Collective over the block (the choices per expert) and the dispatch group (two
    all-to-alls forward, two backward). O(n top_k log(n top_k)) local work beside the
    experts' GEMMs.
    """
    n, k = choice.shape
    num = int(experts.w1.shape[0])  # a DTensor's shape is the whole weight's
    flat = choice.reshape(-1)
    counts = torch.bincount(flat, minlength=num)
    every = _all_gather_rows(counts, grid.block_group, grid.block_size)
    kept, keep = _capacity_plan(every, grid.block_index, flat, factor, k)
    size = grid.ep * grid.etp
    start = grid.block_index - grid.dispatch_index
    rows = kept[start:start + size]  # the dispatch group's kept choices per expert
    local = num // grid.ep
    key = flat if keep is None else torch.where(keep, flat, torch.full_like(flat, num))
    order = torch.argsort(key, stable=True)[:int(rows[grid.dispatch_index].sum())]
    per_ep = rows[grid.dispatch_index].view(grid.ep, local).sum(1).tolist()
    segments = order.split(per_ep)
    idx = torch.cat([segments[g // grid.etp] for g in range(size)])
    in_splits = [per_ep[g // grid.etp] for g in range(size)]
    mine = slice(grid.ep_index * local, (grid.ep_index + 1) * local)
    recv_counts = rows[:, mine]
    out_splits = recv_counts.sum(1).tolist()
    received = _AllToAll.apply(x[idx // k], out_splits, in_splits, grid.dispatch_group)
    done = _run_local_experts(experts, received, recv_counts, grid.etp_index == 0)
    back = _AllToAll.apply(done, in_splits, out_splits, grid.dispatch_group)
    per_choice = back.new_zeros(n * k, back.shape[1]).index_add(0, idx, back)
    return (per_choice.view(n, k, -1) * weights.unsqueeze(-1)).sum(1)


def _capacity_plan(every: torch.Tensor, me: int, flat: torch.Tensor, factor: float | None,
                   k: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Choices kept per (block rank, expert) and which of this rank's choices are kept
    (None: all), as one process running the micro-batch whole decides (module docstring).
    ``every``: ``(D, E)`` choices per rank and expert, ranks in token order."""
    from shardplan.workload.moe import _capacity

    if factor is None:
        return every, None
    num = every.shape[1]
    cap = _capacity(int(every.sum()) // k, k, num, factor)
    before = every.cumsum(0) - every  # choices of the ranks before, per expert
    kept = (cap - before).clamp(min=0).minimum(every)
    onehot = torch.zeros(flat.numel(), num, dtype=torch.int64, device=flat.device)
    onehot.scatter_(1, flat.view(-1, 1), 1)
    place = (onehot.cumsum(0) - 1).gather(1, flat.view(-1, 1)).squeeze(1)
    return kept, before[me][flat] + place < cap


def _run_local_experts(experts: nn.Module, received: torch.Tensor, counts: torch.Tensor,
                       first: bool) -> torch.Tensor:
    """The received rows (source-major, each source's rows by expert; ``counts``:
    ``(sources, E / ep)``) through their experts as one padded ``bmm`` per projection, the
    outputs in the rows' order."""
    sources, local = counts.shape
    ids = torch.arange(local, device=received.device).repeat(sources)
    expert = torch.repeat_interleave(ids, counts.reshape(-1).to(received.device))
    cap = max(1, int(counts.sum(0).max()))
    onehot = torch.zeros(expert.numel(), local, dtype=torch.int64, device=received.device)
    onehot.scatter_(1, expert.view(-1, 1), 1)
    place = (onehot.cumsum(0) - 1).gather(1, expert.view(-1, 1)).squeeze(1)
    slot = expert * cap + place
    d = received.shape[1]
    padded = received.new_zeros(local * cap, d).index_add(0, slot, received)
    out = _expert_mlp(experts, padded.view(local, cap, d), first)
    return out.reshape(local * cap, d)[slot]


def _all_gather_rows(t: torch.Tensor, group: Any, size: int) -> torch.Tensor:
    """``t`` of every rank of ``group`` stacked in group rank order (no gradient)."""
    if size == 1:
        return t.unsqueeze(0)
    out = [torch.empty_like(t) for _ in range(size)]
    dist.all_gather(out, t.contiguous(), group=group)
    return torch.stack(out)


# ------------------------------------------------------------------ collectives
class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` of rows with variable splits; its backward is the same with the
    splits swapped."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, out_splits: list[int], in_splits: list[int],
                group: Any) -> torch.Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        return _all_to_all(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        out_splits, in_splits = ctx.splits
        return _all_to_all(grad, in_splits, out_splits, ctx.group), None, None, None


def _all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int],
                group: Any) -> torch.Tensor:
    if len(in_splits) == 1:
        return x.clone()
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


class _Slice(torch.autograd.Function):
    """This tensor-parallel rank's rows ``mine`` of a tensor its group holds alike; the
    backward all-gathers the slices' gradients (every rank's gradient of the whole)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, mine: slice) -> torch.Tensor:
        ctx.group = group
        return x[mine].clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        size = dist.get_world_size(ctx.group)
        return _all_gather_rows(grad, ctx.group, size).flatten(0, 1), None, None


class _Gather(torch.autograd.Function):
    """The tensor-parallel ranks' row slices concatenated; the backward keeps this rank's
    rows ``mine`` of the gradient (which the ranks hold alike)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, mine: slice) -> torch.Tensor:
        ctx.mine = mine
        return _all_gather_rows(x, group, dist.get_world_size(group)).flatten(0, 1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return grad[ctx.mine].contiguous(), None, None


# -------------------------------------------------------------------- gradients
def reduce_expert_gradients(params: Sequence[nn.Parameter], grid: ExpertGrid) -> None:
    """The expert gradients of the step (module docstring): summed over the ``expert_dp``
    replicas (one flat all-reduce, as the dense ones), divided by the data-parallel parts."""
    if params:
        all_reduce_mean(params, grid.edp_group if grid.edp > 1 else None, grid.parts)


# ------------------------------------------------------------- tensor parallelism
def parallelize_moe_block(block: nn.Module, tp_mesh: Any, tp: int, *,
                          sequence_parallel: bool = False) -> None:
    """Tensor parallelism of one block of an MoE decoder: :func:`moe_block_plan` applied by
    ``parallelize_module``, and, for DeepSeek's latent attention, the gradient of its shared
    rotary key summed over the tensor-parallel ranks (each rank's heads use the one key, so
    each rank's backward gives part of its gradient; DTensor would mark it ``Partial``, the
    attention here runs on local tensors)."""
    from torch.distributed.tensor.parallel import parallelize_module

    parallelize_module(block, tp_mesh, moe_block_plan(block, tp,
                                                      sequence_parallel=sequence_parallel))
    attention = block.attention
    if hasattr(attention, "wkv_b"):
        start, group = int(attention.kv_rank), tp_mesh.get_group()
        attention.wkv_a.register_forward_hook(
            lambda _m, _i, out: _SumGradColumns.apply(out, start, group))


class _SumGradColumns(torch.autograd.Function):
    """Identity whose backward sums the gradient's last-dimension columns from ``start`` on
    over ``group`` (the rest of the gradient each rank holds whole)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, start: int, group: Any) -> torch.Tensor:
        ctx.start, ctx.group = start, group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        grad = grad.clone()
        part = grad[..., ctx.start:].contiguous()
        dist.all_reduce(part, group=ctx.group)
        grad[..., ctx.start:] = part
        return grad, None, None


def moe_block_plan(block: nn.Module, tp: int, *, sequence_parallel: bool = False
                   ) -> dict[str, Any]:
    """The tensor-parallel plan of one block of an MoE decoder, by torchtitan's module names:
    grouped-query attention as the Llama's (:func:`shardplan.runtime._llm.
    tensor_parallel_plan`), Qwen3's per-head query and key norms on the rank's heads (their
    weights replicated, their gradients summed); DeepSeek's latent attention with its
    up-projections ``wq`` / ``wq_b`` and ``wkv_b`` column-wise, ``wo`` row-wise, its low-rank
    down-projections and their norms replicated (torchtitan's layout); a dense
    ``feed_forward`` or the ``moe.shared_experts`` as Megatron's MLP; the router replicated
    and the routed experts left to the expert grid. Under sequence parallelism the MoE
    gathers the sequence at its input and keeps its rank's sequence shard of the output.

    Raises
    ------
    ShardplanError
        Widths ``tp`` does not divide; GPT-OSS's attention sinks.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleInputOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    attention = block.attention
    if getattr(attention, "sinks", None) is not None:
        raise ShardplanError("attention sinks (GPT-OSS) under tensor parallelism are not run "
                             "yet")
    latent = hasattr(attention, "wkv_b")
    names = (["wq" if hasattr(attention, "wq") else "wq_b", "wkv_b"] if latent
             else ["wq", "wk", "wv"])
    plan: dict[str, Any] = {f"attention.{n}": ColwiseParallel() for n in names}
    if getattr(attention, "q_norm", None) is not None and not latent:
        # Qwen3's per-head norms run on this rank's heads (dimension 2): their weights'
        # gradients are summed over the ranks (torchtitan's layout)
        plan.update({f"attention.{n}": SequenceParallel(sequence_dim=2, use_local_output=True)
                     for n in ("q_norm", "k_norm")})
    plan["attention.wo"] = RowwiseParallel(output_layouts=Shard(1) if sequence_parallel
                                           else Replicate())
    mlp = "feed_forward" if hasattr(block, "feed_forward") else "moe.shared_experts"
    ffn = block.feed_forward if mlp == "feed_forward" else block.moe.shared_experts
    if ffn is not None:
        _check_divides(int(ffn.w1.weight.shape[0]), tp, "the feed-forward width")
        plan.update({f"{mlp}.w1": ColwiseParallel(), f"{mlp}.w3": ColwiseParallel(),
                     f"{mlp}.w2": RowwiseParallel(output_layouts=Shard(1)
                                                  if sequence_parallel and mlp ==
                                                  "feed_forward" else Replicate())})
    if not sequence_parallel:
        return plan
    plan.update({
        "attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel(),
        # latent attention's replicated down-projections take plain tensors
        "attention": PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                        desired_input_layouts=(Replicate(), None, None),
                                        use_local_output=latent)})
    if mlp == "feed_forward":
        plan["feed_forward"] = PrepareModuleInput(input_layouts=(Shard(1),),
                                                  desired_input_layouts=(Replicate(),))
    else:
        plan["moe"] = PrepareModuleInputOutput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
            use_local_input=True, output_layouts=(Replicate(),),
            desired_output_layouts=(Shard(1),))
    return plan


def _check_divides(n: int, tp: int, what: str) -> None:
    if n % tp:
        raise ShardplanError(f"tensor parallelism {tp} does not divide {what} ({n})")
