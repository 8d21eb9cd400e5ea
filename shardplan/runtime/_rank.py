"""What every rank of a run does, whatever it trains: its device, its optimizer, its random
state before each forward (:func:`seed_random`), its stage programs (the model exported and
cut into the plan's stages), the module its checkpoints hold (:func:`_rank_root`), a fault
injected on request, its clock and the report of each step's loss and time.

Shared by the pipeline and baseline runs (:mod:`shardplan.runtime._worker`) and the strategy
runs (:mod:`shardplan.runtime._tensor_parallel`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shardplan.errors import ShardplanError
from shardplan.runtime._config import RunResult, TrainConfig, mix_seed
from shardplan.runtime._data import resize_batch
from shardplan.workload._data import build

__all__ = ["make_optimizer", "seed_random"]


def _device() -> torch.device:
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def make_optimizer(name: str, params: Sequence[nn.Parameter], lr: float
                   ) -> torch.optim.Optimizer:
    """The torch optimizer a run steps with for the settings' ``optimizer`` name (torch's
    defaults otherwise; ``topology measure`` times the same ones)."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name in ("sgd-momentum", "momentum"):
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    return torch.optim.Adam(params, lr=lr)


def _optimizer(cfg: TrainConfig, params: Sequence[nn.Parameter]) -> torch.optim.Optimizer:
    return make_optimizer(cfg.optimizer, params, cfg.lr)


def _build(cfg: TrainConfig, batch: int) -> tuple[nn.Module, tuple[Any, ...], str]:
    return build(cfg.model, batch_size=batch, seq_len=cfg.seq_len, image_size=cfg.image_size,
                 input_shapes=cfg.input_shapes)


def _maybe_fault(cfg: TrainConfig, rank: int, step: int) -> None:
    if cfg.fault is not None and cfg.fault[0] == rank and cfg.fault[1] == step \
            and not cfg.fault_in_save:
        os.kill(os.getpid(), signal.SIGKILL)


def _time() -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def seed_random(seed: int) -> None:
    """Set the random state of every device, as :func:`torch.manual_seed` does, in about a
    microsecond where no accelerator is present.

    Without an initialised CUDA, ``torch.manual_seed`` also queues the seed for CUDA's lazy
    initialisation, formatting the caller's stack to do so: 0.06 ms from a shallow stack and
    0.25-0.45 ms from inside a pipelining schedule on this CPU (timed around the call in a
    2-stage mlp run), paid by every forward of every stage: a sixth to a third of the
    mlp's stage forwards there, which the simulator did not know of. Without an accelerator
    the CPU's generator is the only one there is, and seeding it alone leaves the same
    random state; with one, ``torch.manual_seed`` runs (cheap once CUDA is initialised,
    as it is by the time a stage runs on it)."""
    if torch.accelerator.is_available():
        torch.manual_seed(seed)
    else:
        torch.default_generator.manual_seed(seed)


def _seed(cfg: TrainConfig, step: int, chunk: int, stage: int) -> None:
    seed_random(mix_seed(cfg.seed, step, chunk, stage))


def _stage_programs(cfg: TrainConfig, *, probe_batch: int,
                    names_out: dict[str, str] | None = None
                    ) -> tuple[nn.Module, list[Any], Any]:
    """Export the model with a dynamic batch dimension, match the graph against the program
    and cut it into the plan's stages, in the pipeline order; then probe the stages at
    ``probe_batch`` samples. Returns ``(model, programs, probes)``; ``names_out`` receives
    the match (graph name -> program name)."""
    from shardplan.runtime._split import match_graph, probe, split_program
    from shardplan.workload._common import OutputSelector
    from shardplan.workload.program import graph_ops

    batch = max(2, cfg.export_batch)  # torch specialises batch sizes 0 and 1
    model, inputs, name = _build(cfg, batch)
    ep = _export(model, inputs, name, probe_batch)
    prefix = OutputSelector.prefix if isinstance(model, OutputSelector) else ""
    names = match_graph(cfg.graph_nodes, graph_ops(ep, module_prefix=prefix),
                        model=repr(cfg.model))
    if names_out is not None:
        names_out.update(names)
    stage_nodes = [[names[n] for n in st if n in names] for st in cfg.stages]
    programs = split_program(model, ep, stage_nodes, cfg.order, batch=probe_batch)
    example = tuple(resize_batch(t, probe_batch) for t in inputs)
    return model, programs, probe(programs, example, model)


def _export(model: nn.Module, inputs: tuple[Any, ...], name: str, run_batch: int) -> Any:
    """The program with a dynamic batch dimension; where torch had to specialise it (a model
    branching on its batch size), a static program exported at ``run_batch`` instead."""
    from shardplan.workload.program import export_model

    ep = None
    with contextlib.suppress(ShardplanError):
        ep = export_model(model, inputs, name=name, dynamic_batch=True)
    if ep is not None:
        user = set(ep.graph_signature.user_inputs)
        batch_dims = [n.meta["val"].shape[0] for n in ep.graph_module.graph.nodes
                      if n.op == "placeholder" and n.name in user
                      and isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].dim()]
        if all(not isinstance(d, int) for d in batch_dims) or \
                all(int(d) == run_batch for d in batch_dims):
            return ep
    return export_model(model, tuple(resize_batch(t, run_batch) for t in inputs), name=name)


def _report(result: RunResult, loss_part: float, elapsed: float) -> None:
    """Sum the ranks' loss shares, take the slowest rank's step time."""
    t = torch.tensor([loss_part], dtype=torch.float64)
    dist.all_reduce(t)
    s = torch.tensor([elapsed], dtype=torch.float64)
    dist.all_reduce(s, op=dist.ReduceOp.MAX)
    result.losses.append(float(t[0]))
    result.seconds_per_step.append(float(s[0]))


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


def _gather_to_rank0(local: dict[str, Any], rank: int) -> dict[str, list[Any]] | None:
    """Every rank's ``{name: tensor}`` gathered; on rank 0, each name's tensors from every
    rank that holds it, in rank order (None elsewhere)."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    if rank != 0:
        return None
    out: dict[str, list[Any]] = {}
    for part in gathered:
        for n, t in part.items():
            out.setdefault(n, []).append(t)
    return out

