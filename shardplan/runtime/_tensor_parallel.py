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

__all__ = ["boundary_specs", "full_params", "graph_names", "program_shardings", "run_strategy",
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
    from torch.distributed.tensor import DTensor

    from shardplan.runtime._dtensor import GradBuckets, ShardedProgram, make_mesh
    from shardplan.runtime._rank import (
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
    sharded.batch_outputs = True
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
        buckets = GradBuckets(cfg.bucket_bytes if cfg.gradient_sync == "bucketed" else None)
        hooks = []
        for j, (xs, ys) in enumerate(chunks(x, y, m, 1)):
            _seed(cfg, step, j, 0)
            if j == m - 1 and cfg.gradient_sync == "bucketed":
                # DDP's overlap: each bucket is reduced once the last backward filled it
                hooks = [p.register_post_accumulate_grad_hook(buckets.add) for p in params
                         if isinstance(p, DTensor)]
            loss, share = loss_on_shards(loss_fn, forward(tuple(t.to(device) for t in xs)),
                                         ys.to(device))
            (loss * share / m).backward()
            total += float(loss.detach())
        for h in hooks:
            h.remove()
        for p in params:  # what the hooks did not see (no gradient), and "end"'s all
            buckets.add(p)
        buckets.finish()
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


def loss_on_shards(loss_fn: Any, out: Any, target: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The loss of a strategy program's output and the weight its backward takes: an output
    split only by its batch (:func:`~shardplan.runtime._dtensor.batch_split`) gives each
    device the loss of its part of the batch against its part of ``target`` (no gather of
    the output; the weight is the part's share of the samples, so the gradients' partial
    sums add up to the whole batch's mean loss, as data parallelism's do); a whole output
    gives the whole loss, weight 1. Every device of a batch part reports its part's loss:
    their mean over the ranks is the batch's, the parts being equal."""
    from torch.distributed.tensor import DTensor, Replicate

    from shardplan.runtime._dtensor import _map, _tensors, batch_split

    split = [t for t in _tensors(out) if isinstance(t, DTensor)]
    if not split or not all(batch_split(t) and tuple(t.placements) == tuple(split[0].placements)
                            for t in split):
        return loss_fn(_map(out, lambda t: t.full_tensor() if isinstance(t, DTensor) else t),
                       target), 1.0
    mesh, pl = split[0].device_mesh, split[0].placements
    y = DTensor.from_local(target, mesh, [Replicate()] * mesh.ndim, run_check=False)
    y_local = y.redistribute(mesh, pl).to_local()  # a slice: no communication
    local = _map(out, lambda t: t.to_local() if isinstance(t, DTensor) else t)
    return loss_fn(local, y_local), y_local.shape[0] / float(target.shape[0])


def boundary_specs(programs: Sequence[Any], shardings: Mapping[str, Any],
                   probes: Sequence[Any], mesh: Sequence[int]) -> dict[str, tuple[int, ...]]:
    """A hybrid's stage boundaries that travel in batch shards: per value crossing one (its
    program name), the layout of its shards
    (:func:`~shardplan.runtime._sharding.boundary_spec` of its producer's layout;
    ``shardings`` by program name, ``probes`` the stages' example values, ``mesh`` the
    stages' mesh shape); the model's output so laid out too (each device computes the
    loss of its shard). Values without such a layout travel whole and are not listed.
    Every rank computes the same from the same programs."""
    import operator

    from shardplan.runtime._sharding import boundary_spec

    out: dict[str, tuple[int, ...]] = {}
    for prog, (_, outs) in zip(programs, probes, strict=True):
        made = {n.name: n for n in prog.module.graph.nodes if n.op == "call_function"}
        for name, value in zip(prog.outputs, outs, strict=True):
            node = made.get(name)  # None: received from an earlier stage, listed there
            if node is not None and node.target is operator.getitem:
                node = node.args[0] if node.args[1] == 0 else None  # a tuple's first
            if node is None or not isinstance(value, torch.Tensor):
                continue
            spec = boundary_spec(shardings.get(node.name), tuple(value.shape), mesh)
            if spec is not None:
                out[name] = spec
    return out


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
