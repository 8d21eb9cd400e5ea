"""One rank of a strategy run (a PaSE, data-parallel or expert plan) and the pieces hybrid
pipelines share with it.

A strategy plan is one stage whose P devices split every layer as its configuration says.
Every rank exports the model, cuts the whole program as one stage, lays the devices out as a
mesh (:func:`shardplan.runtime._sharding.mesh_shape`) and runs the program on DTensors
(:class:`shardplan.runtime._dtensor.ShardedProgram`). Per step, the ``M`` micro-batches run
one after another, each whole on every rank (the devices split layers, not data: a
configuration that splits the batch makes each device compute its share of it); gradients
accumulate, are reduced to their parameters' layouts, and the optimizer steps on the shards.
What this equals: one process running the same micro-batches
(:func:`shardplan.runtime._worker.run_single` without stages), dropout included.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from shardplan.runtime import _checkpoint
from shardplan.runtime._config import RunResult, TrainConfig
from shardplan.runtime._data import chunks
from shardplan.workload._data import batch_for_step, loss_fn_for

__all__ = ["full_params", "graph_names", "program_shardings", "run_strategy",
           "sync_stage_grads"]


def program_shardings(cfg: TrainConfig, names: Mapping[str, str]) -> dict[str, Any]:
    """The config's node layouts keyed by program node name (``names``: graph -> program)."""
    return {names[s.name]: s for s in cfg.shardings if s.name in names}


def full_params(modules: Sequence[nn.Module], model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of ``modules`` as a whole tensor, under every name the unsplit model
    has for it (collective over each parameter's mesh)."""
    from torch.distributed.tensor import DTensor

    by_object: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        by_object.setdefault(id(p), []).append(n)
    aliases = {n: names for names in by_object.values() for n in names}
    out: dict[str, torch.Tensor] = {}
    for mod in modules:
        for name, p in mod.named_parameters(remove_duplicate=False):
            t = p.detach()
            t = t.full_tensor() if isinstance(t, DTensor) else t
            for alias in aliases.get(name, [name]):
                out[alias] = t.cpu().clone()
    return out


def run_strategy(cfg: TrainConfig, rank: int, world: int) -> RunResult:
    """Train a strategy plan on this rank (see the module docstring)."""
    from shardplan.runtime._dtensor import ShardedProgram, make_mesh, sync_grads
    from shardplan.runtime._worker import (
        _device,
        _maybe_fault,
        _optimizer,
        _rank_root,
        _report,
        _seed,
        _stage_programs,
        _time,
    )

    device = _device()
    names: dict[str, str] = {}
    model, programs, probes = _stage_programs(cfg, probe_batch=cfg.microbatch_size,
                                              names_out=names)
    classes = int(probes[-1][1][0].shape[-1])
    mesh = make_mesh(device.type, [list(range(world))], cfg.mesh_shape)
    prog = programs[0]
    prog.module.to(device)
    sharded = ShardedProgram(prog.module, program_shardings(cfg, names), mesh)
    holder = _rank_root(programs, [0])
    params = [p for p in holder.parameters()]
    opt = _optimizer(cfg, params)
    loss_fn = loss_fn_for(cfg.model)
    start = _checkpoint.load(cfg, holder, opt) if cfg.resume else 0
    result = RunResult(start_step=start)
    m = cfg.microbatches

    def forward(xs: Sequence[torch.Tensor]) -> torch.Tensor:
        if cfg.recompute:
            from torch.utils.checkpoint import checkpoint

            return checkpoint(sharded, *xs, use_reentrant=False)
        return sharded(*xs)

    for step in range(start, cfg.steps):
        _maybe_fault(cfg, rank, step)
        x, y = batch_for_step(probes[0][0], classes, batch_size=cfg.global_batch,
                              seed=cfg.seed, step=step)
        t0 = _time()
        total = 0.0
        for j, (xs, ys) in enumerate(chunks(x, y, m, 1)):
            _seed(cfg, step, j, 0)
            loss = loss_fn(forward(tuple(t.to(device) for t in xs)), ys.to(device))
            (loss / m).backward()
            total += float(loss.detach())
        sync_grads(params)
        opt.step()
        opt.zero_grad(set_to_none=True)
        _report(result, total / m / world, _time() - t0)
        if _checkpoint.due(cfg, step + 1):
            _checkpoint.save(cfg, holder, opt, step + 1)
    result.replicated = sorted(graph_names(sharded.replicated, names))
    result.reshards = sharded.reshards
    if cfg.return_params:
        full = {k: [v] for k, v in full_params([holder], model).items()}
        result.params = full if rank == 0 else None
    return result


def graph_names(program_names: set[str], names: Mapping[str, str]) -> list[str]:
    """Graph names of program nodes (``names``: graph -> program)."""
    back = {v: k for k, v in names.items()}
    return [back[n] for n in program_names if n in back]


def sync_stage_grads(params: Sequence[nn.Parameter], tied: Sequence[tuple[nn.Parameter, Any]],
                     scale: float) -> None:
    """A hybrid stage's gradients: each reduced to its parameter's layout on the stage's
    mesh, tied weights' summed over the stages holding them (``tied``: parameter and the
    group of the ranks at this rank's position in every holding stage; each holds the whole
    gradient once gathered), then all scaled by ``scale``."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Replicate

    from shardplan.runtime._dtensor import redistribute, sync_grads

    sync_grads(params)
    for p, group in tied:
        g = p.grad
        if isinstance(g, DTensor):
            mesh = g.device_mesh
            full = redistribute(g, mesh, [Replicate()] * mesh.ndim).to_local().clone()
            dist.all_reduce(full, group=group)
            p.grad = redistribute(DTensor.from_local(full, mesh, [Replicate()] * mesh.ndim,
                                                      run_check=False), mesh, p.placements)
        else:
            g = g.clone()
            dist.all_reduce(g, group=group)
            p.grad = g
    for p in params:
        if p.grad is not None:
            p.grad.mul_(scale)
