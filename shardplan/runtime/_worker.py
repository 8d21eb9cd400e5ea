"""One rank of a run: build its part of the model, train, checkpoint, report.

Used by the local launcher (:mod:`shardplan.runtime._launch`, one spawned process per rank,
rendezvous through a ``FileStore``), by ``torchrun ... -m shardplan.runtime`` (rendezvous
from torchrun's environment) and, for ``single``, in the caller's own process.

Every run draws the same data (:func:`~shardplan.workload.batch_for_step`), cuts it into
the same chunks (:func:`~shardplan.runtime._data.chunks`) and sets the random state before
every forward from ``(seed, step, chunk, stage)`` (:func:`~shardplan.runtime._config.mix_seed`),
so a pipeline equals one process running the same stage modules one after another, dropout
included, and the same seed repeats a run exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shardplan.errors import ShardplanError
from shardplan.runtime import _checkpoint
from shardplan.runtime._config import RunResult, TrainConfig, mix_seed
from shardplan.runtime._data import chunks
from shardplan.runtime._rank import (
    _build,
    _device,
    _gather_to_rank0,
    _maybe_fault,
    _optimizer,
    _rank_root,
    _report,
    _seed,
    _stage_programs,
    _time,
    seed_random,
)
from shardplan.workload._data import batch_for_step, loss_fn_for

__all__ = ["RunResult", "init_distributed", "run_config", "run_single"]


def init_distributed(rank: int | None = None, world: int | None = None,
                     store_path: str | None = None, timeout: float = 300.0) -> None:
    """Join the process group: through a ``FileStore`` (local launcher) or torchrun's
    environment. NCCL when CUDA is present, gloo otherwise."""
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    td = timedelta(seconds=timeout)
    if store_path is not None:
        store = dist.FileStore(store_path, int(world))
        dist.init_process_group(backend, store=store, rank=int(rank), world_size=int(world),
                                timeout=td)
    else:
        dist.init_process_group(backend, timeout=td)


def _output_classes(model: nn.Module, inputs: tuple[Any, ...]) -> int:
    """The output's last dimension, from one forward in eval mode (no buffer updates)."""
    model.eval()
    try:
        with torch.no_grad():
            return int(model(*inputs).shape[-1])
    finally:
        model.train()


class _StageModule(nn.Module):
    """A stage program that sets the random state before each forward: the ``i``-th call of
    a step runs chunk ``chunk_of_call[i]`` of stage ``position``; optionally recomputes its
    forward during the backward (activation checkpointing, the random state preserved)."""

    def __init__(self, inner: nn.Module, position: int, seed: int,
                 chunk_of_call: Sequence[int], recompute: bool) -> None:
        super().__init__()
        self.inner = inner
        self.position = position
        self.seed = seed
        self.chunk_of_call = list(chunk_of_call)
        self.recompute = recompute
        self.step = 0
        self.calls = 0

    def start(self, step: int) -> None:
        self.step = step
        self.calls = 0

    def forward(self, *args: Any) -> Any:
        chunk = self.chunk_of_call[self.calls % len(self.chunk_of_call)]
        self.calls += 1
        seed_random(mix_seed(self.seed, self.step, chunk, self.position))
        if self.recompute and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint

            return checkpoint(self.inner, *args, use_reentrant=False)
        return self.inner(*args)


# ------------------------------------------------------------------------------- single
def run_single(cfg: TrainConfig) -> RunResult:
    """Train in this process, no process group: the reference every run is compared with.

    Per step, the ``microbatches x replicas`` chunks run one after another; each chunk's mean
    loss, divided by the chunk count, is back-propagated (gradient accumulation), then one
    optimizer step: what the pipeline computes with ``replicas`` replicas per stage. With the
    plan's ``stages``, the chunks run through the same stage modules the pipeline runs (the
    random state set per step, chunk and stage as there); without, through the model itself.
    """
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    n_chunks = cfg.microbatches * cfg.parts
    if cfg.stages:
        model, programs, probes = _stage_programs(cfg, probe_batch=cfg.chunk_size)
        classes = int(probes[-1][1][0].shape[-1])
        mods = [p.module for p in programs]

        def forward(xs: tuple[torch.Tensor, ...], step: int, c: int) -> torch.Tensor:
            values = xs
            for k, mod in enumerate(mods):
                _seed(cfg, step, c, k)
                out = mod(*values)
                values = out if isinstance(out, tuple) else (out,)
            return values[0]

        inputs = tuple(p for p in probes[0][0])
    else:
        model, inputs, _ = _build(cfg, cfg.chunk_size)
        classes = _output_classes(model, inputs)

        def forward(xs: tuple[torch.Tensor, ...], step: int, c: int) -> torch.Tensor:
            _seed(cfg, step, c, 0)
            return model(*xs)

    model.to(device)
    loss_fn = loss_fn_for(cfg.model)
    opt = _optimizer(cfg, list(model.parameters()))
    result = RunResult()
    start = _checkpoint.load_local(cfg, model, opt) if cfg.resume else 0
    result.start_step = start
    for step in range(start, cfg.steps):
        x, y = batch_for_step(inputs, classes, batch_size=cfg.global_batch, seed=cfg.seed,
                              step=step)
        t0 = _time()
        total = 0.0
        for c, (xs, ys) in enumerate(chunks(x, y, cfg.microbatches, cfg.parts)):
            loss = loss_fn(forward(tuple(t.to(device) for t in xs), step, c), ys.to(device))
            (loss / n_chunks).backward()
            total += float(loss.detach())
        opt.step()
        opt.zero_grad(set_to_none=True)
        result.seconds_per_step.append(_time() - t0)
        result.losses.append(total / n_chunks)
        if _checkpoint.due(cfg, step + 1):
            _checkpoint.save_local(cfg, model, opt, step + 1)
    if cfg.return_params:
        result.params = {k: [v.detach().cpu().clone()]
                         for k, v in model.named_parameters(remove_duplicate=False)}
    return result


# ----------------------------------------------------------------------- data parallel
def _run_baseline(cfg: TrainConfig, rank: int, world: int) -> RunResult:
    """DDP or FSDP2 (``fully_shard``) over ``world`` processes: process ``p`` runs part ``p``
    of every micro-batch, accumulating gradients over the micro-batches. Parts differ by one
    sample when the processes do not divide the micro-batch: each part's loss is weighted by
    its share of the samples (DDP and FSDP average over the processes), so that the step is
    the micro-batch's mean, as one process would take it."""
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    device = _device()
    model, inputs, _ = _build(cfg, cfg.chunk_size)
    classes = _output_classes(model, inputs)
    model.to(device)
    if cfg.kind == "ddp":
        wrapped: nn.Module = DDP(model, device_ids=None if device.type == "cpu" else [device])
    else:
        for child in _shard_units(model):
            fully_shard(child)
        fully_shard(model)
        wrapped = model
    loss_fn = loss_fn_for(cfg.model)
    opt = _optimizer(cfg, list(wrapped.parameters()))
    result = RunResult()
    start = _checkpoint.load(cfg, wrapped, opt) if cfg.resume else 0
    result.start_step = start
    m = cfg.microbatches
    for step in range(start, cfg.steps):
        _maybe_fault(cfg, rank, step)
        x, y = batch_for_step(inputs, classes, batch_size=cfg.global_batch, seed=cfg.seed,
                              step=step)
        parts = chunks(x, y, m, world)
        t0 = _time()
        total = 0.0
        for j in range(m):
            xs, ys = parts[j * world + rank]
            share = len(ys) * world / sum(len(parts[j * world + p][1]) for p in range(world))
            last = j == m - 1
            _seed(cfg, step, j * world + rank, 0)
            if cfg.kind == "ddp" and not last:
                with wrapped.no_sync():
                    loss = loss_fn(wrapped(*(t.to(device) for t in xs)), ys.to(device))
                    (loss * share / m).backward()
            else:
                if cfg.kind == "fsdp":
                    wrapped.set_requires_gradient_sync(last)
                loss = loss_fn(wrapped(*(t.to(device) for t in xs)), ys.to(device))
                (loss * share / m).backward()
            total += float(loss.detach()) * share
        opt.step()
        opt.zero_grad(set_to_none=True)
        elapsed = _time() - t0
        _report(result, total / m / world, elapsed)
        if _checkpoint.due(cfg, step + 1):
            _checkpoint.save(cfg, wrapped, opt, step + 1)
    if cfg.return_params:
        full = _full_params(wrapped, cfg.kind)
        result.params = full if rank == 0 else None
    return result


def _shard_units(model: nn.Module) -> list[nn.Module]:
    """FSDP units: the repeated blocks of a transformer, or every child with parameters."""
    for mod in model.modules():
        if isinstance(mod, nn.ModuleList) and len(mod) > 1:
            return list(mod)
    return [c for c in model.children() if any(True for _ in c.parameters())]


def _full_params(model: nn.Module, kind: str) -> dict[str, list[torch.Tensor]]:
    out = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        t = p.detach()
        if kind == "fsdp":
            t = t.full_tensor()
        out[name.removeprefix("module.")] = [t.cpu().clone()]
    return out


# ------------------------------------------------------------------------------ pipeline
@dataclass(frozen=True, slots=True)
class _Layout:
    """Who runs what. Pipeline rank ``p``, replica ``r`` runs on device
    ``rank_devices[p][r]``; global rank ``g`` is the ``g``-th of the devices used, in
    increasing order (a measured topology numbers its devices like ranks)."""

    num_ranks: int
    replicas: int
    grank: dict[tuple[int, int], int]  # (pipeline rank, replica) -> global rank

    @classmethod
    def of(cls, cfg: TrainConfig) -> _Layout:
        devices = sorted(d for devs in cfg.rank_devices for d in devs)
        index = {d: i for i, d in enumerate(devices)}
        grank = {(p, r): index[d] for p, devs in enumerate(cfg.rank_devices)
                 for r, d in enumerate(devs)}
        return cls(len(cfg.rank_devices), cfg.replicas, grank)

    def role(self, rank: int) -> tuple[int, int]:
        return next(key for key, g in self.grank.items() if g == rank)


def _run_pipeline(cfg: TrainConfig, rank: int, world: int) -> RunResult:
    """Train the plan's pipeline on this rank, running the simulator's action lists.

    Every rank exports the whole model and splits it (cheap, and it keeps ranks independent
    of each other's files), then keeps its own stages and runs its action list with
    torch.distributed.pipelining's action-list runtime (``_PipelineScheduleRuntime``, which
    adds the sends and receives). Per step: replica ``r`` runs part ``r`` of each of the
    ``M`` micro-batches; gradients are summed over the replicas of each stage and over the
    stages holding a tied weight, scaled by ``1 / (M R)`` (every loss is a chunk's mean), and
    Adam/SGD steps. What this equals: :func:`run_single` with ``R x M`` chunks, up to float32
    summation order.

    A hybrid plan (``cfg.shardings``: every stage's nodes carry a configuration over the
    stage's devices) runs each stage as a :class:`~shardplan.runtime._dtensor.ShardedProgram`
    on the mesh of its stage's devices instead: those devices run every micro-batch together,
    each splitting the layers as configured. At the stage boundaries each device sends to
    its counterpart in the next stage (the pipeline groups are the same as for replicas):
    an activation its producer's layout splits by the batch alone, its own batch shard,
    which the next stage reads in that layout and re-shards only where its own layout
    differs (:func:`~shardplan.runtime._tensor_parallel.boundary_specs`); any other
    activation whole. A model output so split stays split: each device computes the loss
    of its shard against its rows of the target (scaled so that the gradients add up to
    the chunk's mean loss, as data parallelism's do). Gradients are reduced to their
    parameters' layouts, tied weights summed over their holding stages, and the result
    equals :func:`run_single` with the plan's stages and ``M`` chunks.
    """
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import (
        FORWARD,
        _Action,
        _PipelineScheduleRuntime,
    )

    from shardplan.runtime._split import tied_groups

    lay = _Layout.of(cfg)
    if world != len(lay.grank):
        raise ShardplanError(f"the plan needs {len(lay.grank)} processes, the run has {world}")
    device = _device()
    graph_to_program: dict[str, str] = {}
    model, programs, probes = _stage_programs(cfg, probe_batch=cfg.chunk_size,
                                              names_out=graph_to_program)
    classes = int(probes[-1][1][0].shape[-1])
    num = len(programs)
    tp = cfg.tensor_parallel

    # Every rank creates every group, in the same order (new_group is collective).
    pipe_groups = [dist.new_group(sorted(lay.grank[(p, r)] for p in range(lay.num_ranks)))
                   for r in range(lay.replicas)]
    replica_groups = [dist.new_group(sorted(lay.grank[(p, r)] for r in range(lay.replicas)))
                      for p in range(lay.num_ranks)]
    me, replica = lay.role(rank)
    ties = []
    for names in tied_groups(programs, model):
        stages_holding = [p for p in programs if set(names) & set(p.param_names)]
        # Replicas: every holder; a hybrid: the holders of one position in their stage group
        # (each holds the whole gradient after its stage's reduction).
        per = [[r] for r in range(lay.replicas)] if tp else [list(range(lay.replicas))]
        for rs in per:
            holders = sorted({lay.grank[(cfg.stage_rank[p.index], r)] for p in stages_holding
                              for r in rs})
            group = dist.new_group(holders)
            if replica in rs:
                ties.append((names, group))
    mesh = None
    if tp:
        from shardplan.runtime._dtensor import make_mesh

        mesh = make_mesh(device.type, [[lay.grank[(p, r)] for r in range(lay.replicas)]
                                       for p in range(lay.num_ranks)], cfg.mesh_shape)
    specs: dict[str, tuple[int, ...]] = {}
    if tp:  # boundaries a stage's layout splits by the batch alone travel in shards
        from shardplan.runtime._tensor_parallel import boundary_specs, program_shardings

        specs = boundary_specs(programs, program_shardings(cfg, graph_to_program), probes,
                               cfg.mesh_shape)
    parts = cfg.parts
    my_part = replica if parts > 1 else 0

    mine = [k for k in range(num) if cfg.stage_rank[k] == me]
    pipe_ranks = sorted(lay.grank[(p, replica)] for p in range(lay.num_ranks))
    group_rank = {p: pipe_ranks.index(lay.grank[(p, replica)]) for p in range(lay.num_ranks)}
    # torch adds each stage's REDUCE_GRAD after its last backward itself, where ours is.
    actions = {group_rank[p]: [a for a in map(_Action.from_str, acts) if a.is_compute_op]
               for p, acts in enumerate(cfg.actions)}
    stages, wrappers, sharded = [], [], []
    memo: dict[int, nn.Parameter] = {}
    for k in mine:
        prog = programs[k]
        prog.module.to(device)
        calls = [a.microbatch_index * parts + my_part for a in actions[group_rank[me]]
                 if a.stage_index == k and a.computation_type == FORWARD]
        inner: nn.Module = prog.module
        if tp:
            from shardplan.runtime._dtensor import ShardedProgram
            from shardplan.runtime._tensor_parallel import program_shardings

            inner = ShardedProgram(prog.module, program_shardings(cfg, graph_to_program), mesh,
                                   params=memo)
            inner.input_specs = [specs.get(n) for n in prog.inputs]
            inner.output_specs = [specs.get(n) for n in prog.outputs]
            sharded.append(inner)
        mod = _StageModule(inner, k, cfg.seed, calls, cfg.recompute)
        ins, outs = probes[k]
        stage = PipelineStage(
            mod, k, num, device,
            input_args=tuple(_example(v, specs.get(n), cfg.mesh_shape, device)
                             for n, v in zip(prog.inputs, ins, strict=True)),
            output_args=tuple(_example(v, specs.get(n), cfg.mesh_shape, device)
                              for n, v in zip(prog.outputs, outs, strict=True)),
            group=pipe_groups[replica])
        stages.append(stage)
        wrappers.append(mod)
    loss_fn = loss_fn_for(cfg.model)
    m = cfg.microbatches
    sched = _PipelineScheduleRuntime(stages, n_microbatches=m, loss_fn=loss_fn,
                                     scale_grads=False)
    sched._prepare_schedule_with_comms(actions)

    holder = _rank_root(programs, mine)
    if not any(True for _ in holder.parameters()):  # a stage without weights (a softmax)
        holder.register_parameter("_shardplan_empty", nn.Parameter(torch.zeros(0)))
    opt = _optimizer(cfg, list(holder.parameters()))
    start = _checkpoint.load(cfg, holder, opt) if cfg.resume else 0
    result = RunResult(start_step=start)
    first, last = 0 in mine, num - 1 in mine
    tied_names = {n for names, _ in ties for n in names}
    params = _unique_params(programs, mine)
    own = [p for n, p in params if n not in tied_names]
    tied = [(p, group) for names, group in ties for n, p in params if n in names]
    scale = 1.0 / (m * parts)
    # a hybrid whose model output leaves the last stage in q batch shards: each device's
    # loss is its shard's mean, and the gradients' sum over the shards is q times the chunk's
    loss_spec = specs.get(programs[-1].outputs[0]) if len(programs[-1].outputs) == 1 else None
    shard_scale = 1.0 / math.prod(int(cfg.mesh_shape[a]) for a, j in enumerate(loss_spec or ())
                                  if j == 0)
    for step in range(start, cfg.steps):
        _maybe_fault(cfg, rank, step)
        for w in wrappers:
            w.start(step)
        kw: dict[str, Any] = {}
        if first or last:
            x, y = batch_for_step(probes[0][0], classes, batch_size=cfg.global_batch,
                                  seed=cfg.seed, step=step)
            pieces = chunks(x, y, m, parts)
            mine_chunks = [pieces[j * parts + my_part] for j in range(m)]
            if first:
                kw["arg_mbs"] = [tuple(t.to(device) for t in xs) for xs, _ in mine_chunks]
            if last:
                kw["target_mbs"] = [_target(ys.to(device), loss_spec, mesh)
                                    for _, ys in mine_chunks]
        t0 = _time()
        losses: list[torch.Tensor] = []
        sched.step(losses=losses, return_outputs=False, **kw)
        if tp:
            from shardplan.runtime._tensor_parallel import sync_stage_grads

            sync_stage_grads([p for _, p in params], tied, scale * shard_scale)
        else:
            _sync_grads(own, tied, replica_groups[me], lay.replicas, scale)
        opt.step()
        opt.zero_grad(set_to_none=True)
        elapsed = _time() - t0
        # Every device of a hybrid's last stage holds the whole loss, or its batch shard's
        # (equal shards): their mean over the stage's devices is the chunk's.
        part = sum(float(v.detach()) for v in losses) * scale / (lay.replicas if tp else 1)
        _report(result, part, elapsed)
        if _checkpoint.due(cfg, step + 1):
            _checkpoint.save(cfg, holder, opt, step + 1)
    if tp:
        from shardplan.runtime._tensor_parallel import graph_names

        mine_rep = graph_names(set().union(*(m_.replicated for m_ in sharded)),
                               graph_to_program) if sharded else []
        every: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(every, (mine_rep, sum(m_.reshards for m_ in sharded), replica))
        result.replicated = sorted({n for names, _, _ in every for n in names})
        result.boundaries = sorted(graph_names(set(specs), graph_to_program))
        result.reshards = sum(count for _, count, r in every if r == 0)
    if cfg.return_params:
        result.params = _gather_params(programs, mine, rank, model)
    return result


def _example(value: Any, spec: tuple[int, ...] | None, mesh: Sequence[int],
             device: torch.device) -> torch.Tensor:
    """What one device of a stage sends or receives for ``value``: the whole tensor, or
    with ``spec`` (:func:`~shardplan.runtime._sharding.boundary_spec`) its batch shard."""
    from shardplan.runtime._split import example_tensor

    t = example_tensor(value, device)
    if spec is None:
        return t
    parts = math.prod(int(mesh[a]) for a, j in enumerate(spec) if j == 0)
    shard = t.new_zeros((t.shape[0] // parts, *t.shape[1:]))
    return shard.requires_grad_(t.requires_grad)


def _target(target: torch.Tensor, spec: tuple[int, ...] | None, mesh: Any) -> torch.Tensor:
    """The rows of a chunk's target this device's loss reads: all of them, or with
    ``spec`` those of its batch shard of the model's output (a slice, no communication)."""
    if spec is None:
        return target
    from torch.distributed.tensor import DTensor, Replicate

    from shardplan.runtime._dtensor import to_placements

    whole = DTensor.from_local(target, mesh, [Replicate()] * mesh.ndim, run_check=False)
    return whole.redistribute(mesh, to_placements(spec)).to_local()


def _unique_params(programs: Sequence[Any], mine: Sequence[int]
                   ) -> list[tuple[str, nn.Parameter]]:
    """This rank's parameters, each object once (stages on one rank share tied weights),
    under its first name."""
    seen: set[int] = set()
    out = []
    for k in mine:
        for n, p in programs[k].module.named_parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out.append((n, p))
    return out


def _sync_grads(own: Sequence[nn.Parameter], tied: Sequence[tuple[nn.Parameter, Any]],
                replica_group: Any, replicas: int, scale: float) -> None:
    """Sum gradients over the replicas of this rank's stages (one flat all-reduce) and tied
    weights' gradients over every rank holding them (all replicas of all holding stages),
    then scale all of them by ``scale``. Each parameter object is handled once, so stages of
    one rank sharing a tied weight (interleaved schedules) are not counted twice."""
    if own:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in own]
        if replicas > 1:
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=replica_group)
            offset = 0
            for p, g in zip(own, grads, strict=True):
                n = g.numel()
                p.grad = flat[offset:offset + n].view_as(p).clone()
                offset += n
        else:
            for p, g in zip(own, grads, strict=True):
                p.grad = g
        for p in own:
            p.grad.mul_(scale)
    for p, group in tied:
        g = (p.grad if p.grad is not None else torch.zeros_like(p)).clone()
        dist.all_reduce(g, group=group)
        p.grad = g.mul_(scale)


def _gather_params(programs: Sequence[Any], mine: Sequence[int], rank: int,
                   model: nn.Module) -> dict[str, Any] | None:
    """Every replica's parameters on rank 0, under every name the unsplit model has for them
    (tied weights: each name), as ``{name: [tensor per holder]}``; callers check that the
    copies agree."""
    aliases: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(n)
    from torch.distributed.tensor import DTensor

    originals = {n: p for n, p in model.named_parameters(remove_duplicate=False)}
    local: dict[str, Any] = {}
    for k in mine:
        for name, p in programs[k].module.named_parameters():
            t = p.detach()
            t = t.full_tensor() if isinstance(t, DTensor) else t  # collective in the stage
            for n in aliases[id(originals[name])]:
                local[n] = t.cpu().clone()
    return _gather_to_rank0(local, rank)


# --------------------------------------------------------------------------------- entry
def run_config(cfg: TrainConfig, rank: int, world: int) -> RunResult:
    """Run ``cfg`` on this rank of an initialised process group."""
    if cfg.kind == "single":
        if rank == 0:
            return run_single(cfg)
        return RunResult()
    if world != cfg.world_size:
        raise ShardplanError(f"this run needs {cfg.world_size} processes, got {world}")
    if cfg.kind == "pipeline":
        return _run_pipeline(cfg, rank, world)
    if cfg.kind == "strategy":
        from shardplan.runtime._tensor_parallel import run_strategy

        return run_strategy(cfg, rank, world)
    if cfg.kind == "llm":
        from shardplan.runtime._llm import run_llm

        return run_llm(cfg, rank, world)
    return _run_baseline(cfg, rank, world)
