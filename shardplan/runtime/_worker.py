"""One rank of a run: build its part of the model, train, checkpoint, report.

Used by the local launcher (:mod:`shardplan.runtime._launch`, one spawned process per rank,
rendezvous through a ``FileStore``), by ``torchrun ... -m shardplan.runtime`` (rendezvous
from torchrun's environment) and, for ``single``, in the caller's own process.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shardplan.errors import ShardplanError
from shardplan.runtime import _checkpoint
from shardplan.runtime._config import TrainConfig
from shardplan.runtime._data import batch_for_step, build, loss_fn_for, microbatches

__all__ = ["RunResult", "init_distributed", "run_config", "run_single"]


@dataclass(slots=True)
class RunResult:
    """What a run reports (rank 0 of a distributed run, or the single process)."""

    losses: list[float] = field(default_factory=list)
    seconds_per_step: list[float] = field(default_factory=list)
    start_step: int = 0
    params: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"losses": self.losses, "seconds_per_step": self.seconds_per_step,
                "start_step": self.start_step}


def _device() -> torch.device:
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


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


def _optimizer(cfg: TrainConfig, params: Sequence[nn.Parameter]) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr)
    return torch.optim.Adam(params, lr=cfg.lr)


def _output_classes(model: nn.Module, inputs: tuple[Any, ...]) -> int:
    with torch.no_grad():
        return int(model(*inputs).shape[-1])


def _maybe_fault(cfg: TrainConfig, rank: int, step: int) -> None:
    if cfg.fault is not None and cfg.fault[0] == rank and cfg.fault[1] == step:
        os.kill(os.getpid(), signal.SIGKILL)


def _time() -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


# ------------------------------------------------------------------------------- single
def run_single(cfg: TrainConfig) -> RunResult:
    """Train in this process, no process group: the reference every run is compared with.

    The global batch is cut into ``microbatches`` chunks; each chunk's mean loss, divided by
    the chunk count, is back-propagated in order (gradient accumulation), then one optimizer
    step. This is what a pipeline with ``R`` replicas and ``M`` micro-batches computes when
    ``microbatches = R x M``.
    """
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    model, inputs, _ = build(cfg.model, batch_size=cfg.microbatch_size, seq_len=cfg.seq_len)
    model.to(device)
    classes = _output_classes(model, inputs)
    loss_fn = loss_fn_for(cfg.model)
    opt = _optimizer(cfg, list(model.parameters()))
    result = RunResult()
    start = _checkpoint.load_local(cfg, model, opt) if cfg.resume else 0
    result.start_step = start
    m = cfg.microbatches
    for step in range(start, cfg.steps):
        x, y = batch_for_step(inputs, classes, batch_size=cfg.batch_size, seed=cfg.seed,
                              step=step)
        t0 = _time()
        total = 0.0
        for xs, ys in microbatches(x, y, m):
            loss = loss_fn(model(*(t.to(device) for t in xs)), ys.to(device))
            (loss / m).backward()
            total += float(loss.detach())
        opt.step()
        opt.zero_grad(set_to_none=True)
        result.seconds_per_step.append(_time() - t0)
        result.losses.append(total / m)
        if _checkpoint.due(cfg, step + 1):
            _checkpoint.save_local(cfg, model, opt, step + 1)
    if cfg.return_params:
        result.params = {k: [v.detach().cpu().clone()]
                         for k, v in model.named_parameters(remove_duplicate=False)}
    return result


# ----------------------------------------------------------------------- data parallel
def _run_baseline(cfg: TrainConfig, rank: int, world: int) -> RunResult:
    """DDP or FSDP2 (``fully_shard``) over ``world`` processes, each on its share."""
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    device = _device()
    model, inputs, _ = build(cfg.model, batch_size=cfg.microbatch_size, seq_len=cfg.seq_len)
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
        x, y = batch_for_step(inputs, classes, batch_size=cfg.batch_size, seed=cfg.seed,
                              step=step)
        x = tuple(t.tensor_split(world)[rank] for t in x)
        y = y.tensor_split(world)[rank]
        t0 = _time()
        total = 0.0
        for i, (xs, ys) in enumerate(microbatches(x, y, m)):
            last = i == m - 1
            if cfg.kind == "ddp" and not last:
                with wrapped.no_sync():
                    loss = loss_fn(wrapped(*(t.to(device) for t in xs)), ys.to(device))
                    (loss / m).backward()
            else:
                if cfg.kind == "fsdp":
                    wrapped.set_requires_gradient_sync(last)
                loss = loss_fn(wrapped(*(t.to(device) for t in xs)), ys.to(device))
                (loss / m).backward()
            total += float(loss.detach())
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


def _report(result: RunResult, loss_part: float, elapsed: float) -> None:
    """Sum the ranks' loss shares, take the slowest rank's step time."""
    t = torch.tensor([loss_part], dtype=torch.float64)
    dist.all_reduce(t)
    s = torch.tensor([elapsed], dtype=torch.float64)
    dist.all_reduce(s, op=dist.ReduceOp.MAX)
    result.losses.append(float(t[0]))
    result.seconds_per_step.append(float(s[0]))


# ------------------------------------------------------------------------------ pipeline
@dataclass(slots=True)
class _Layout:
    """Who runs what: per rank its replica and pipeline stages, and the process groups."""

    num_stages: int
    replicas: int
    ranks_per_pipe: int
    role: dict[int, tuple[int, tuple[int, ...]]]  # rank -> (replica, stage indices)
    rank_of: dict[tuple[int, int], int]  # (stage, replica) -> rank


def _layout(cfg: TrainConfig, order: Sequence[int]) -> _Layout:
    """Rank of each (pipeline stage, replica).

    Rank ``g`` runs on device ``g`` of the topology when the plan uses devices
    ``0..W-1`` (a measured topology numbers its devices like ranks); otherwise the plan's
    devices are numbered in increasing order. Interleaved 1F1B runs pipeline stages ``p``
    and ``p + S/2`` on the rank of stage ``p``.
    """
    num = len(order)
    reps = len(cfg.devices[0])
    devices = sorted(d for devs in cfg.devices for d in devs)
    index = {d: i for i, d in enumerate(devices)}
    per_pipe = num // 2 if cfg.schedule == "interleaved-1f1b" else num
    rank_of: dict[tuple[int, int], int] = {}
    for k in range(num):
        for r in range(reps):
            owner = k % per_pipe
            rank_of[(k, r)] = index[cfg.devices[order[owner]][r]]
    if cfg.schedule == "interleaved-1f1b":  # compress to the ranks actually used
        used = sorted(set(rank_of.values()))
        comp = {g: i for i, g in enumerate(used)}
        rank_of = {key: comp[g] for key, g in rank_of.items()}
    role: dict[int, tuple[int, tuple[int, ...]]] = {}
    for (k, r), g in sorted(rank_of.items()):
        prev = role.get(g, (r, ()))
        role[g] = (r, (*prev[1], k))
    return _Layout(num, reps, per_pipe, role, rank_of)


def _run_pipeline(cfg: TrainConfig, rank: int, world: int) -> RunResult:
    """Train the plan's pipeline on this rank.

    Every rank exports the whole model at the micro-batch size and splits it (cheap, and it
    keeps ranks independent of each other's files), then keeps its own stages. Per step: the
    schedule runs ``M`` micro-batches of this replica's share (losses are per-micro-batch
    means; torch scales gradients by ``1/M``), gradients are averaged over the ``R`` replicas
    of each stage and tied weights' gradients summed over the stages holding them, then
    Adam/SGD steps. What this equals: single-process training with ``R x M`` micro-batches
    of gradient accumulation (:func:`run_single`), up to float32 summation order.
    """
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    from shardplan.capture._export import export_model
    from shardplan.runtime._split import (
        example_tensor,
        probe_requires_grad,
        split_program,
        tied_groups,
    )

    device = _device()
    model, inputs, name = build(cfg.model, batch_size=cfg.microbatch_size, seq_len=cfg.seq_len)
    classes = _output_classes(model, inputs)
    ep = export_model(model, inputs, name=name)
    programs = split_program(model, ep, cfg.stages)
    order = [p.plan_stage for p in programs]
    needs_grad = probe_requires_grad(programs, inputs)
    lay = _layout(cfg, order)
    if world != len(lay.role):
        raise ShardplanError(f"the plan needs {len(lay.role)} processes, the run has {world}")

    # Every rank creates every group, in the same order (new_group is collective).
    pipe_groups = [dist.new_group(sorted({lay.rank_of[(k, r)] for k in range(lay.num_stages)}))
                   for r in range(lay.replicas)]
    stage_groups = [dist.new_group(sorted({lay.rank_of[(k, r)] for r in range(lay.replicas)}))
                    for k in range(lay.num_stages)]
    ties = tied_groups(programs, model)
    tie_groups = []
    for names in ties:
        holders = sorted({lay.rank_of[(p.index, r)] for p in programs for r in range(lay.replicas)
                          if set(names) & set(p.param_names)})
        tie_groups.append((names, dist.new_group(holders), holders))

    replica, mine = lay.role[rank]
    pipe_ranks = sorted({lay.rank_of[(k, replica)] for k in range(lay.num_stages)})
    to_group_rank = {k: pipe_ranks.index(lay.rank_of[(k, replica)])
                     for k in range(lay.num_stages)}
    stages = []
    for k in mine:
        prog = programs[k]
        prog.module.to(device)
        out_grad = needs_grad[k + 1] if k + 1 < lay.num_stages else (True,)
        stage = PipelineStage(
            prog.module, k, lay.num_stages, device,
            input_args=tuple(example_tensor(v, device, g)
                             for v, g in zip(prog.input_meta, needs_grad[k], strict=True)),
            output_args=tuple(example_tensor(v, device, g)
                              for v, g in zip(prog.output_meta, out_grad, strict=True)),
            group=pipe_groups[replica])
        stage.stage_index_to_group_rank = dict(to_group_rank)
        stages.append(stage)
    loss_fn = loss_fn_for(cfg.model)
    m = cfg.microbatches
    if cfg.schedule == "interleaved-1f1b":
        sched: Any = ScheduleInterleaved1F1B(stages, n_microbatches=m, loss_fn=loss_fn)
    else:
        cls = ScheduleGPipe if cfg.schedule == "gpipe" else Schedule1F1B
        sched = cls(stages[0], n_microbatches=m, loss_fn=loss_fn)
    for st in stages:
        st.stage_index_to_group_rank = dict(to_group_rank)

    modules = nn.ModuleDict({f"s{p.index}": programs[p.index].module
                             for p in (programs[k] for k in mine)})
    holder = _rank_root(programs, mine)
    if not any(True for _ in holder.parameters()):  # a stage without weights (a softmax)
        holder.register_parameter("_shardplan_empty", nn.Parameter(torch.zeros(0)))
    opt = _optimizer(cfg, list(holder.parameters()))
    start = _checkpoint.load(cfg, holder, opt) if cfg.resume else 0
    result = RunResult(start_step=start)
    first, last = 0 in mine, lay.num_stages - 1 in mine
    share = cfg.batch_size // lay.replicas
    tied_names = {n for names, _, _ in tie_groups for n in names}
    own = [(n, p) for k in mine for n, p in programs[k].module.named_parameters()
           if n not in tied_names]
    my_stage_groups = [stage_groups[k] for k in mine]
    for step in range(start, cfg.steps):
        _maybe_fault(cfg, rank, step)
        x, y = batch_for_step(inputs, classes, batch_size=cfg.batch_size, seed=cfg.seed,
                              step=step)
        x = tuple(t[replica * share:(replica + 1) * share].to(device) for t in x)
        y = y[replica * share:(replica + 1) * share].to(device)
        t0 = _time()
        losses: list[torch.Tensor] = []
        if first and last:
            sched.step(*x, target=y, losses=losses)
        elif first:
            sched.step(*x)
        elif last:
            sched.step(target=y, losses=losses)
        else:
            sched.step()
        _sync_grads(own, my_stage_groups, lay.replicas, tie_groups, modules)
        opt.step()
        opt.zero_grad(set_to_none=True)
        elapsed = _time() - t0
        part = sum(float(v.detach()) for v in losses) / (m * lay.replicas)
        _report(result, part, elapsed)
        if _checkpoint.due(cfg, step + 1):
            _checkpoint.save(cfg, holder, opt, step + 1)
    if cfg.return_params:
        result.params = _gather_params(programs, mine, replica, rank, model)
    return result


def _rank_root(programs: Sequence[Any], mine: Sequence[int]) -> nn.Module:
    """One module holding this rank's parameters and persistent buffers under the unsplit
    model's names (the same tensor objects as the stage modules): what checkpoints store."""
    from shardplan.runtime._split import _set_attr

    root = nn.Module()
    for k in mine:
        mod = programs[k].module
        persistent = set(mod.state_dict())
        for name, p in mod.named_parameters():
            if not _has(root, name):
                _set_attr(root, name, p, param=True, persistent=True)
        for name, b in mod.named_buffers():
            if name in persistent and not _has(root, name):
                _set_attr(root, name, b, param=False, persistent=True)
    return root


def _has(root: nn.Module, fqn: str) -> bool:
    obj: Any = root
    for part in fqn.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def _sync_grads(own: Sequence[tuple[str, nn.Parameter]], stage_groups: Sequence[Any],
                replicas: int, tie_groups: Sequence[tuple[tuple[str, ...], Any, list[int]]],
                modules: nn.Module) -> None:
    """Average gradients over replicas (one flat all-reduce per stage group) and sum tied
    weights' gradients over the stages holding them (then average over replicas)."""
    if replicas > 1 and own:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for _, p in own]
        flat = torch.cat([g.reshape(-1) for g in grads])
        group = stage_groups[0]  # interleaved: a rank's stages share one replica group
        dist.all_reduce(flat, group=group)
        flat /= replicas
        offset = 0
        for (_, p), g in zip(own, grads, strict=True):
            n = g.numel()
            p.grad = flat[offset:offset + n].view_as(p).clone()
            offset += n
    named = dict(modules.named_parameters(remove_duplicate=False))
    by_name = {n.split(".", 1)[1]: p for n, p in named.items()}
    for names, group, _ in tie_groups:
        local = [by_name[n] for n in names if n in by_name]
        if not local:
            continue
        p = local[0]
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        for q in local[1:]:
            if q is not p and q.grad is not None:
                g = g + q.grad
        g = g.clone()
        dist.all_reduce(g, group=group)
        g /= replicas
        for q in local:
            q.grad = g.clone()


def _gather_params(programs: Sequence[Any], mine: Sequence[int], replica: int,
                   rank: int, model: nn.Module) -> dict[str, Any] | None:
    """Every replica's parameters on rank 0, under every name the unsplit model has for them
    (tied weights: each name), as ``{name: [tensor per holder]}``; callers check that the
    copies agree."""
    aliases: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(n)
    local: dict[str, Any] = {}
    for k in mine:
        for _, p in programs[k].module.named_parameters():
            for n in aliases[id(p)]:
                local[n] = p.detach().cpu().clone()
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    if rank != 0:
        return None
    out: dict[str, list[Any]] = {}
    for part in gathered:
        for n, t in part.items():
            out.setdefault(n, []).append(t)
    return out


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
    return _run_baseline(cfg, rank, world)
