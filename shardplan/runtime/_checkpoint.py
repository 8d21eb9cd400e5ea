"""Checkpoints with ``torch.distributed.checkpoint`` (DCP), written atomically, read safely.

Layout of ``--checkpoint-dir D``: ``D/step-00000012/`` (one complete checkpoint) and
``D/latest`` (the name of the newest complete one). A checkpoint holds tensors only, in DCP's
format: ``model.<name>`` for every parameter and persistent buffer under the unsplit model's
names, ``optim.<name>.<key>`` for every optimizer state tensor (Adam's ``exp_avg``, ``step``,
SGD's ``momentum_buffer``), so a pipeline, its replicas and every baseline store the same
keys and a checkpoint loads into the unsplit model; beside them ``state.json`` (plain JSON:
the step, the run's kind and optimizer, the optimizer's hyper-parameters).

Writing: into ``D/.tmp-step-...``; after every rank has finished, rank 0 writes
``state.json``, renames the directory and then replaces ``latest`` (``os.replace``). A run
killed at any moment leaves ``latest`` naming a complete checkpoint; the previous one is kept
until the new one is complete.

Reading cannot run code: ``latest`` must name a ``step-NNNNNNNN`` folder; ``state.json`` is
JSON, checked field by field; DCP's ``.metadata`` (a pickle) is read with an unpickler that
admits DCP's own metadata classes and nothing else, and must describe tensors only; tensor
data is read by DCP with ``torch.load(weights_only=True)``. Anything else is refused in one
line. Loading fills the run's own tensors in place (a template of the keys it expects), so
missing or misshapen entries are refused too.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader

from shardplan.errors import ShardplanError
from shardplan.ir.io import write_atomic
from shardplan.runtime._checkpoint_state import (
    FORMAT,
    STEP_NAME,
    latest,
    plain,
    read_state,
    step_name,
)
from shardplan.runtime._config import TrainConfig

__all__ = ["due", "latest", "load", "load_local", "load_model", "save", "save_local"]

_KEEP = 2
_NAME = STEP_NAME
_name = step_name


def due(cfg: TrainConfig, steps_done: int) -> bool:
    """Whether to save after ``steps_done`` steps."""
    if not cfg.checkpoint_dir:
        return False
    if steps_done == cfg.steps:
        return True
    return cfg.checkpoint_every > 0 and steps_done % cfg.checkpoint_every == 0


# ------------------------------------------------------------------- safe reading
_ALLOWED = {
    ("torch.distributed.checkpoint.metadata", n) for n in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")
} | {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
     ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
     ("pathlib", "WindowsPath"), ("collections", "OrderedDict")}


class _MetadataUnpickler(pickle.Unpickler):
    """Admits DCP's metadata classes, ``torch.Size`` and torch dtypes; nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise ShardplanError(f"refusing checkpoint metadata that names {module}.{name} "
                             f"(only DCP's own metadata classes are read)")


class _SafeReader(FileSystemReader):
    """DCP's file reader with a metadata unpickler that cannot run code, and a check that
    the checkpoint holds tensors only (DCP reads non-tensor entries with full unpickling)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata as Tsm

        path = self._get_metadata_path(kwargs.get("rank"))
        try:
            with self.fs.create_stream(path, "rb") as fh:
                metadata = _MetadataUnpickler(fh).load()
        except ShardplanError:
            raise
        except Exception as exc:  # noqa: BLE001 - any malformed file is refused
            raise ShardplanError(f"unreadable checkpoint metadata {str(path)!r}: "
                                 f"{type(exc).__name__}") from None
        if not isinstance(metadata, Metadata):
            raise ShardplanError(f"checkpoint metadata {str(path)!r} is not DCP metadata")
        for key, md in metadata.state_dict_metadata.items():
            if not isinstance(md, Tsm):
                raise ShardplanError(f"refusing checkpoint entry {key!r}: not a tensor "
                                     f"(shardplan checkpoints hold tensors only)")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


_read_state = read_state
_plain = plain


# ------------------------------------------------------------------- the state
def _param_names(model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """Each parameter object once, under its first name (DDP's ``module.`` prefix off)."""
    for name, p in model.named_parameters():
        yield name.removeprefix("module."), p


def _init_optimizer(opt: torch.optim.Optimizer) -> None:
    """Create the optimizer's state tensors (a step with zero gradients and learning rate 0)
    so that a checkpoint can be loaded into them in place. Parameters do not change."""
    if opt.state:
        return
    params = [p for g in opt.param_groups for p in g["params"] if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    lrs = [g["lr"] for g in opt.param_groups]
    for g in opt.param_groups:
        g["lr"] = 0.0
    opt.step()
    for g, lr in zip(opt.param_groups, lrs, strict=True):
        g["lr"] = lr
    opt.zero_grad(set_to_none=True)


def _tensors(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors of this rank: the live parameter, buffer and optimizer state
    tensors themselves (DCP saves them, and loads into them in place)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        out[f"model.{name.removeprefix('module.')}"] = t.detach() if t.requires_grad else t
    for name, p in _param_names(model):
        for key, v in opt.state.get(p, {}).items():
            if isinstance(v, torch.Tensor):
                out[f"optim.{name}.{key}"] = v
            elif v is not None:
                raise ShardplanError(f"optimizer state {key!r} of {name!r} is not a tensor; "
                                     f"shardplan checkpoints hold tensors only")
    return {k: v for k, v in out.items() if "_shardplan_empty" not in k}


def _state_json(cfg: TrainConfig, opt: torch.optim.Optimizer, step: int) -> str:
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()
               if k != "params" and _plain(list(v) if isinstance(v, tuple) else v)}
              for g in opt.param_groups]
    return json.dumps({"format": FORMAT, "step": step, "kind": cfg.kind,
                       "optimizer": cfg.optimizer, "param_groups": groups,
                       "global_batch": cfg.global_batch, "seed": cfg.seed,
                       "next_sample": step * cfg.global_batch, "model": cfg.model}) + "\n"


def _restore_groups(opt: torch.optim.Optimizer, data: dict[str, Any], path: str) -> None:
    groups = data["param_groups"]
    if len(groups) != len(opt.param_groups):
        raise ShardplanError(f"checkpoint {path!r} has {len(groups)} optimizer parameter "
                             f"groups, this run {len(opt.param_groups)}")
    for mine, saved in zip(opt.param_groups, groups, strict=True):
        for k, v in saved.items():
            if k in mine and k != "params":
                old = mine[k]
                mine[k] = tuple(v) if isinstance(old, tuple) and isinstance(v, list) else v


def _load_into(tensors: dict[str, torch.Tensor], path: str, *, no_dist: bool) -> None:
    from torch.distributed.checkpoint.api import CheckpointException

    _SafeReader(path).read_metadata()  # refuses here, in one line, what DCP would refuse
    try:
        dcp.load(tensors, storage_reader=_SafeReader(path), no_dist=no_dist)
    except ShardplanError:
        raise
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - one line for any
        raise ShardplanError(_load_failure(path, exc)) from None


def _load_failure(path: str, exc: BaseException) -> str:
    """One line for a DCP load that failed: a checkpoint of another model or plan (a key it
    lacks, a tensor of another size), or one whose tensor data are damaged (truncated or
    altered files: the first error of a rank, never torch's traceback text)."""
    text = " ".join(str(exc).split())
    missing = re.search(r"Missing key in checkpoint state_dict: ([\w.]+)", text)
    if missing:
        return (f"checkpoint {path!r} does not fit this run (it lacks "
                f"{missing.group(1)!r}); was it written by another model or plan?")
    if re.search(r"size mismatch|shape mismatch|does not match|doesn't match", text):
        return (f"checkpoint {path!r} does not fit this run (a tensor of another size); was "
                f"it written by another model or plan?")
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        inner = first[0] if isinstance(first, tuple) and first else first
        if isinstance(inner, BaseException):
            exc = inner
    detail = (str(exc).strip().splitlines() or [""])[0][:120]
    why = f"{type(exc).__name__}{': ' + detail if detail else ''}"
    return (f"checkpoint {path!r} is damaged: its tensor data cannot be read ({why}); "
            f"resume from an intact checkpoint or start again")


def _finish(directory: str, tmp: str, step: int, state: str) -> None:
    write_atomic(os.path.join(tmp, "state.json"), state)
    final = os.path.join(directory, _name(step))
    if os.path.exists(final):
        shutil.rmtree(final)
    os.replace(tmp, final)
    write_atomic(os.path.join(directory, "latest"), _name(step) + "\n")
    done = sorted(n for n in os.listdir(directory) if _NAME.match(n))
    for old in done[:-_KEEP]:
        shutil.rmtree(os.path.join(directory, old), ignore_errors=True)


# ------------------------------------------------------------------- public
def save(cfg: TrainConfig, model: nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    """Collective: every rank writes its part; rank 0 publishes the checkpoint."""
    directory = str(cfg.checkpoint_dir)
    tmp = os.path.join(directory, f".tmp-{_name(step)}")
    if dist.get_rank() == 0:
        os.makedirs(directory, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier()
    dcp.save(_tensors(model, opt), checkpoint_id=tmp)
    dist.barrier()
    if dist.get_rank() == 0:
        _finish(directory, tmp, step, _state_json(cfg, opt, step))
    dist.barrier()


def load(cfg: TrainConfig, model: nn.Module, opt: torch.optim.Optimizer) -> int:
    """Collective: restore the newest checkpoint in place; returns its step."""
    return _load(cfg, model, opt, no_dist=False)


def save_local(cfg: TrainConfig, model: nn.Module, opt: torch.optim.Optimizer,
               step: int) -> None:
    """One process, no process group (``single``)."""
    directory = str(cfg.checkpoint_dir)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".tmp-{_name(step)}")
    shutil.rmtree(tmp, ignore_errors=True)
    dcp.save(_tensors(model, opt), checkpoint_id=tmp, no_dist=True)
    _finish(directory, tmp, step, _state_json(cfg, opt, step))


def load_local(cfg: TrainConfig, model: nn.Module, opt: torch.optim.Optimizer) -> int:
    """One process, no process group (``single``)."""
    return _load(cfg, model, opt, no_dist=True)


def _load(cfg: TrainConfig, model: nn.Module, opt: torch.optim.Optimizer, *,
          no_dist: bool) -> int:
    found = latest(str(cfg.checkpoint_dir))
    if found is None:
        raise ShardplanError(f"--resume: {cfg.checkpoint_dir!r} holds no complete checkpoint")
    step, path = found
    data = _read_state(path, step)
    if data.get("optimizer") != cfg.optimizer:
        raise ShardplanError(f"checkpoint {path!r} was written with optimizer "
                             f"{data.get('optimizer')!r}, this run uses {cfg.optimizer!r}")
    _init_optimizer(opt)
    _load_into(_tensors(model, opt), path, no_dist=no_dist)
    _restore_groups(opt, data, path)
    return step


def load_model(directory: str, model: nn.Module) -> int:
    """Load the newest checkpoint's parameters and buffers into an unsplit ``model`` (one
    process); returns its step.

    Tied parameters are one object under several names; the checkpoint has at least one of
    them (the one each stage used).
    """
    found = latest(directory)
    if found is None:
        raise ShardplanError(f"no checkpoint in {directory!r}")
    step, path = found
    _read_state(path, step)
    stored = set(_SafeReader(path).read_metadata().state_dict_metadata)
    groups: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    for names in groups.values():
        if not any(f"model.{n}" in stored for n in names):
            raise ShardplanError(f"checkpoint {path!r} lacks parameter {names[0]!r}")
    want: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        if f"model.{name}" in stored:
            want[f"model.{name}"] = t.detach() if t.requires_grad else t
    _load_into(want, path, no_dist=True)
    return step
