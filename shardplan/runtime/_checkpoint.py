"""Checkpoints with ``torch.distributed.checkpoint``, written atomically.

Layout of ``--checkpoint-dir D``: ``D/step-00000012/`` (one complete DCP checkpoint: model
parameters under the unsplit model's names, optimizer state keyed the same way) and
``D/latest`` (the name of the newest complete one). A checkpoint is written into
``D/.tmp-step-...``; after every rank has finished writing, rank 0 renames the directory and
then replaces ``latest`` (``os.replace``). A run killed at any moment leaves ``latest``
naming a complete checkpoint. The previous checkpoint is kept until the new one is complete.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from shardplan.errors import ShardplanError
from shardplan.ir.io import write_atomic
from shardplan.runtime._config import TrainConfig

__all__ = ["due", "latest", "load", "load_local", "load_model", "save", "save_local"]

_KEEP = 2


def due(cfg: TrainConfig, steps_done: int) -> bool:
    """Whether to save after ``steps_done`` steps."""
    if not cfg.checkpoint_dir:
        return False
    if steps_done == cfg.steps:
        return True
    return cfg.checkpoint_every > 0 and steps_done % cfg.checkpoint_every == 0


def _name(step: int) -> str:
    return f"step-{step:08d}"


def latest(directory: str) -> tuple[int, str] | None:
    """``(step, path)`` of the newest complete checkpoint in ``directory``, or None."""
    try:
        with open(os.path.join(directory, "latest"), encoding="utf-8") as fh:
            name = fh.read().strip()
    except OSError:
        return None
    path = os.path.join(directory, name)
    if not name.startswith("step-") or not os.path.isdir(path):
        raise ShardplanError(f"checkpoint directory {directory!r} names {name!r} as the latest "
                             f"checkpoint, which is missing")
    return int(name.removeprefix("step-")), path


def _state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


def _finish(directory: str, tmp: str, step: int) -> None:
    final = os.path.join(directory, _name(step))
    if os.path.exists(final):
        shutil.rmtree(final)
    os.replace(tmp, final)
    write_atomic(os.path.join(directory, "latest"), _name(step) + "\n")
    done = sorted(n for n in os.listdir(directory) if n.startswith("step-"))
    for old in done[:-_KEEP]:
        shutil.rmtree(os.path.join(directory, old), ignore_errors=True)


def save(cfg: TrainConfig, model: nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    """Collective: every rank writes its part; rank 0 publishes the checkpoint."""
    directory = str(cfg.checkpoint_dir)
    tmp = os.path.join(directory, f".tmp-{_name(step)}")
    if dist.get_rank() == 0:
        os.makedirs(directory, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier()
    dcp.save(_state(model, opt), checkpoint_id=tmp)
    dist.barrier()
    if dist.get_rank() == 0:
        _finish(directory, tmp, step)
    dist.barrier()


def load(cfg: TrainConfig, model: nn.Module, opt: torch.optim.Optimizer) -> int:
    """Collective: restore the newest checkpoint; returns its step (0 if there is none)."""
    found = latest(str(cfg.checkpoint_dir))
    if found is None:
        return 0
    step, path = found
    state = _state(model, opt)
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    return step


def save_local(cfg: TrainConfig, model: nn.Module, opt: torch.optim.Optimizer,
               step: int) -> None:
    """One process, no process group (``single``)."""
    directory = str(cfg.checkpoint_dir)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".tmp-{_name(step)}")
    shutil.rmtree(tmp, ignore_errors=True)
    dcp.save(_state(model, opt), checkpoint_id=tmp, no_dist=True)
    _finish(directory, tmp, step)


def load_local(cfg: TrainConfig, model: nn.Module, opt: torch.optim.Optimizer) -> int:
    found = latest(str(cfg.checkpoint_dir))
    if found is None:
        return 0
    step, path = found
    state = _state(model, opt)
    dcp.load(state, checkpoint_id=path, no_dist=True)
    set_state_dict(model, opt, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    return step


def load_model(directory: str, model: nn.Module) -> int:
    """Load the newest checkpoint's parameters into an unsplit ``model`` (one process).

    Tied parameters are stored once, under the name the exported program uses; every name of
    a tied parameter that the checkpoint lacks is filled from one it has.
    """
    found = latest(directory)
    if found is None:
        raise ShardplanError(f"no checkpoint in {directory!r}")
    step, path = found
    from torch.distributed.checkpoint import FileSystemReader

    stored = set(FileSystemReader(path).read_metadata().state_dict_metadata)
    groups: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    want: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        if f"model.{name}" in stored:
            want[f"model.{name}"] = t
    dcp.load(want, checkpoint_id=path, no_dist=True)
    for names in groups.values():
        have = [n for n in names if f"model.{n}" in want]
        if not have:
            raise ShardplanError(f"checkpoint {path!r} lacks parameter {names[0]!r}")
    return step
