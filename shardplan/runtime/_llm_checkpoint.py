"""Checkpoints of LLM runs (:mod:`shardplan.runtime._llm`) with torch's distributed
checkpoint (DCP), and their resumption under any other layout: fewer or more processes,
other tensor-, pipeline- and data-parallel degrees, FSDP or HSDP or none (issue 48 item 3).

Writing (every ``checkpoint_every`` steps and after the last one, into ``checkpoint_dir``):
each rank takes the state of its stages and optimizer with
:func:`torch.distributed.checkpoint.state_dict.get_state_dict`, which names every tensor by
the model's fully qualified name (the stages keep the model's names,
``layers.3.attention.wq.weight``) and leaves it as it lives on the rank: a plain tensor,
or a DTensor sharded by tensor parallelism, FSDP2 or both (uneven FSDP shards included).
:func:`torch.distributed.checkpoint.save` then writes every tensor once as one global
tensor under ``model.<name>`` and ``optim.<name>.<state>`` (Adam's ``exp_avg``,
``exp_avg_sq`` and ``step``; SGD's ``momentum_buffer``): the keys of the other runs'
checkpoints (:mod:`shardplan.runtime._checkpoint`), so an LLM checkpoint also loads into the
unsplit model (:func:`shardplan.runtime.load_checkpoint_into`) and resumes a one-process
run of it. Replicated tensors (tensor-parallel norms, data-parallel copies) are written
by one rank (DCP's de-duplication). The step, the data position, the seed and the
optimizer's settings go to ``state.json``
(:mod:`shardplan.runtime._checkpoint_state`). The checkpoint is written into
``.tmp-step-...``; only after every rank has finished does rank 0 write ``state.json``,
rename the folder and point ``latest`` at it, so a process killed during a save leaves the
previous checkpoint the newest complete one.

Resuming (``resume``): the newest complete checkpoint is checked against the run
(:func:`~shardplan.runtime._checkpoint_state.check_resume`: the same global batch, seed and
optimizer; here also the model: DCP's metadata must hold exactly the model's tensors, of
its shapes). Each rank takes the state dicts of its new stages and optimizer (the optimizer's
state created by a step of zero gradients at learning rate 0), and
:func:`torch.distributed.checkpoint.load` fills them in place: DCP reads, for every
tensor, the region this rank's shard covers from whatever pieces the writers wrote, so
the resharding from the old layout to the new one is DCP's. A pipeline rank's state dict
names only its stages' tensors, and only those are read. Then
:func:`~torch.distributed.checkpoint.state_dict.set_state_dict` hands them to the stages
and the optimizer, and the optimizer's settings are restored from ``state.json``.

Data: step ``t``'s batch and random state are functions of ``(seed, t)``, so a run resumed
at step ``k`` trains step ``k``'s batch next; a new data-parallel degree cuts the same
global batch into other parts. The sample ids each step trained (``t x global_batch`` up
to ``(t + 1) x global_batch``, as the data-parallel ranks took them) are reported per step
(:attr:`~shardplan.runtime._config.RunResult.samples`, :func:`gather_samples`).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shardplan.errors import ShardplanError
from shardplan.runtime import _checkpoint
from shardplan.runtime._checkpoint_state import check_resume, step_name
from shardplan.runtime._config import TrainConfig
from shardplan.runtime._data import chunks

__all__ = ["gather_samples", "load", "model_shapes", "part_samples", "rank_module", "save"]

_PARTS = ("tok_embeddings", "norm", "output")


# ------------------------------------------------------------------------- the state
def model_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """The unsplit model's tensors a checkpoint must hold: name -> shape (its state dict:
    parameters and persistent buffers)."""
    return {k: tuple(int(d) for d in v.shape) for k, v in model.state_dict().items()}


def rank_module(stages: Sequence[nn.Module]) -> nn.Module:
    """One module over a rank's stages under the model's names: the stage itself, or, with
    several (interleaved) stages, a module holding their blocks together and the embedding,
    norm and head of the stages that have them."""
    if len(stages) == 1:
        return stages[0]
    root = nn.Module()
    root.layers = nn.ModuleDict({k: b for st in stages for k, b in st.layers.items()})
    for part in _PARTS:
        real = [getattr(st, part) for st in stages
                if not isinstance(getattr(st, part), nn.Identity)]
        if real:
            root.add_module(part, real[0])
    return root


def _state(stages: Sequence[nn.Module], opt: torch.optim.Optimizer
           ) -> tuple[nn.Module, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``(root, model state dict, optimizer state dict, DCP's tensors)``: the state dicts as
    :func:`get_state_dict` gives them (the live tensors, by name) and the same tensors under
    the checkpoint's keys."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    root = rank_module(stages)
    msd, osd = get_state_dict(root, opt)
    tensors: dict[str, Any] = {f"model.{k}": v for k, v in msd.items()}
    for name, entries in osd["state"].items():
        for key, v in entries.items():
            if isinstance(v, torch.Tensor):
                tensors[f"optim.{name}.{key}"] = v
            elif v is not None:
                raise ShardplanError(f"optimizer state {key!r} of {name!r} is not a tensor; "
                                     f"shardplan checkpoints hold tensors only")
    return root, msd, osd, tensors


def _state_json(cfg: TrainConfig, opt: torch.optim.Optimizer, step: int) -> str:
    data = json.loads(_checkpoint._state_json(cfg, opt, step))
    data.update(parallel=cfg.parallel.to_dict(), world_size=cfg.world_size)
    return json.dumps(data) + "\n"


# ------------------------------------------------------------------------------ save
def save(cfg: TrainConfig, stages: Sequence[nn.Module], opt: torch.optim.Optimizer,
         step: int) -> None:
    """Collective: write the checkpoint after ``step`` steps (module docstring).

    With ``cfg.fault_in_save`` and ``cfg.fault == (rank, step)``, that rank kills itself
    once its tensors are written, before the checkpoint is published (tests)."""
    from signal import SIGKILL

    import torch.distributed.checkpoint as dcp

    rank = dist.get_rank()
    directory = str(cfg.checkpoint_dir)
    tmp = os.path.join(directory, f".tmp-{step_name(step)}")
    if rank == 0:
        os.makedirs(directory, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier()
    _, _, _, tensors = _state(stages, opt)
    dcp.save(tensors, checkpoint_id=tmp)
    if cfg.fault_in_save and cfg.fault == (rank, step):
        os.kill(os.getpid(), SIGKILL)
    dist.barrier()  # every rank's part is written
    if rank == 0:
        _checkpoint._finish(directory, tmp, step, _state_json(cfg, opt, step))
    dist.barrier()


# ------------------------------------------------------------------------------ load
def load(cfg: TrainConfig, stages: Sequence[nn.Module], opt: torch.optim.Optimizer,
         shapes: dict[str, tuple[int, ...]]) -> int:
    """Collective: restore the newest complete checkpoint of ``cfg.checkpoint_dir`` into
    this rank's ``stages`` and ``opt``, resharded by DCP to their layout; returns its step.

    Parameters
    ----------
    shapes : dict
        :func:`model_shapes` of the unsplit model: the checkpoint must hold exactly these
        model tensors.

    Raises
    ------
    ShardplanError
        No complete checkpoint, one of another global batch, seed, optimizer or model, or
        damaged tensor data (one line).
    """
    from torch.distributed.checkpoint.state_dict import set_state_dict

    step, path, state = check_resume(cfg)
    _check_model(path, shapes)
    root, msd, osd, tensors = _state(stages, opt)
    _checkpoint._load_into(tensors, path, no_dist=False)
    set_state_dict(root, opt, model_state_dict=msd, optim_state_dict=osd)
    _checkpoint._restore_groups(opt, state, path)
    return step


def _check_model(path: str, shapes: dict[str, tuple[int, ...]]) -> None:
    """DCP's metadata against the model: the same tensor names, each of the same shape."""
    meta = _checkpoint._SafeReader(path).read_metadata().state_dict_metadata
    stored = {k.removeprefix("model."): tuple(int(d) for d in md.size)
              for k, md in meta.items() if k.startswith("model.")}
    another = f"checkpoint {path!r} was written for another model"
    missing = sorted(set(shapes) - set(stored))
    if missing:
        raise ShardplanError(f"{another}: it lacks {missing[0]!r}"
                             f"{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}")
    extra = sorted(set(stored) - set(shapes))
    if extra:
        raise ShardplanError(f"{another}: it holds {extra[0]!r}, which this model does not "
                             f"have{f' (and {len(extra) - 1} more)' if len(extra) > 1 else ''}")
    for name, shape in shapes.items():
        if stored[name] != shape:
            raise ShardplanError(f"{another}: {name!r} is {_dims(stored[name])} there, "
                                 f"{_dims(shape)} here")


def _dims(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape)) or "a scalar"


# --------------------------------------------------------------------------- samples
def part_samples(step: int, global_batch: int, microbatches: int, parts: int, part: int
                 ) -> list[list[list[int]]]:
    """The global sample ids one data-parallel part trains at ``step``: per micro-batch,
    the ids of its part as ``[start, stop)`` ranges (one, as :func:`~shardplan.runtime.
    _data.chunks` cuts consecutive samples), cut from the step's batch exactly as the data
    are. Sample ``t x global_batch + i`` is sample ``i`` of step ``t``'s batch."""
    ids = torch.arange(step * global_batch, (step + 1) * global_batch)
    pieces = chunks((ids,), ids, microbatches, parts)
    return [_ranges(pieces[j * parts + part][1].tolist()) for j in range(microbatches)]


def gather_samples(mine: tuple[int, list[list[list[list[int]]]]] | None, rank: int
                   ) -> list[list[list[int]]] | None:
    """Collective: on rank 0, per step, the sample ids the run trained as ``[start, stop)``
    ranges, in the order of the step's batch (micro-batch by micro-batch, part by part),
    adjacent ranges joined; None elsewhere.

    Parameters
    ----------
    mine : (int, list) or None
        A rank that feeds its data-parallel part's inputs (first pipeline stage, tensor-
        and context-parallel rank 0): ``(part, per step its part_samples)``; None for the
        other ranks.
    """
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    if rank != 0:
        return None
    parts = sorted((p for p in every if p is not None), key=lambda p: p[0])
    steps = len(parts[0][1]) if parts else 0
    out = []
    for t in range(steps):
        runs: list[list[int]] = []
        for j in range(len(parts[0][1][t])):
            for _, per in parts:
                for a, b in per[t][j]:
                    if runs and runs[-1][1] == a:
                        runs[-1][1] = b
                    else:
                        runs.append([a, b])
        out.append(runs)
    return out


def _ranges(ids: Sequence[int]) -> list[list[int]]:
    """``ids`` as consecutive ``[start, stop)`` runs, in their order."""
    out: list[list[int]] = []
    for i in ids:
        if out and out[-1][1] == i:
            out[-1][1] = i + 1
        else:
            out.append([i, i + 1])
    return out
