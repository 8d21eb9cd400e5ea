"""Run plans for real with torch.distributed (issue #8), and the baselines they compete with.

A plan's stages are node sets of an operator-level graph whose node names are the fx names of
``torch.export``'s program. :func:`config_for_plan` (and the command line, through the
torch-free :mod:`shardplan.runtime._args`) turns (plan, graph, settings) into a
:class:`TrainConfig`: the plan's execution settings and the
:class:`~shardplan.simulate.PipelineView` the simulator uses (stage order, per-rank action
lists, devices per rank). :func:`train` runs it, on local processes it spawns itself (gloo on
CPU with one thread each, NCCL with CUDA) or, under ``torchrun ... -m shardplan.runtime``, on
the processes torchrun started. Each rank exports the model with a dynamic batch dimension,
matches the graph against that program, cuts it at the plan's boundaries
(:mod:`shardplan.runtime._split`), wraps its stages in
``torch.distributed.pipelining.PipelineStage`` and runs its action list with torch's
action-list runtime; replicas of a stage sum their gradients with one all-reduce per step,
tied weights (GPT-2's embedding and head) sum theirs over the ranks holding them, and every
forward sets the random state from (seed, step, chunk, stage). ``--baseline
fsdp|ddp|single`` trains the same model on the same data with FSDP2, DDP or one process.

Plans with a ``strategy`` (PaSE, data-parallel, expert; paper 004) run with
``torch.distributed.tensor``: :mod:`shardplan.runtime._sharding` (torch-free) lays every
layer's configuration out on a device mesh of its stage's devices, and
:class:`shardplan.runtime._dtensor.ShardedProgram` runs the stage program on DTensors,
redistributing each operator's inputs as its configuration says. A one-stage strategy plan
is a ``strategy`` run (:mod:`shardplan.runtime._tensor_parallel`); a pipeline plan with a
strategy is a hybrid, whose pipeline stages are such sharded programs.

Plans with a ``parallel`` layout (the LLM plan kind, :class:`shardplan.ir.ParallelConfig`)
run with torch's own pieces as torchtitan composes them (:mod:`shardplan.runtime._llm`): a
DeviceMesh in the layout's rank order, the model split into pipeline stages by whole blocks,
tensor parallelism by module names (``parallelize_module``), FSDP2 / HSDP (``fully_shard``),
``torch.distributed.pipelining`` schedules, a mixture of experts' routed experts on the
layout's expert grid with ``all_to_all_single`` (:mod:`shardplan.runtime._llm_moe`);
:func:`llm_memory` reports each rank's peak
memory of a step by category as torch's ``MemTracker`` counts it. Their checkpoints are
torch's distributed checkpoints of global tensors by name
(:mod:`shardplan.runtime._llm_checkpoint`), resumed under any other layout and process
count (after losing or gaining a process), resharded by DCP.

Paper 000, sections 3-4: its pipeline is GPipe over stages placed on GPUs, compared with FSDP
on an MLP (our ``benchmarks/paper000_table1.py``).

Only the ranks import torch: configs, the launcher and the results are torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardplan.errors import ShardplanError
from shardplan.runtime._args import config_for_plan
from shardplan.runtime._config import KINDS, OPTIMIZERS, SCHEDULES, RunResult, TrainConfig

__all__ = ["KINDS", "OPTIMIZERS", "SCHEDULES", "RunResult", "TrainConfig", "config_for_plan",
           "contiguous_plan", "llm_memory", "load_checkpoint_into", "train", "train_many"]


def contiguous_plan(graph: Any, num_stages: int, replicas: int = 1) -> Any:
    """A plan cutting the graph's topological order into ``num_stages`` contiguous pieces of
    near-equal operator count, ``replicas`` devices each (stage ``s``, replica ``r`` on device
    ``r * num_stages + s``). For tests and benchmarks; the planners make real plans."""
    from shardplan.ir import Objective, Plan, Stage

    order = [int(v) for v in graph.topological_order]
    n = len(order)
    if not 1 <= num_stages <= n:
        raise ShardplanError(f"cannot cut {n} operators into {num_stages} stages")
    stages = []
    for s in range(num_stages):
        nodes = tuple(sorted(order[s * n // num_stages:(s + 1) * n // num_stages]))
        stages.append(Stage(nodes, tuple(r * num_stages + s for r in range(replicas))))
    return Plan(graph=graph.name, topology="", algorithm="contiguous", stages=tuple(stages),
                objective=Objective("none", 0.0))


def train(config: TrainConfig, *, time_limit: float | None = None) -> Any:
    """Run one config on local processes (or in this process for ``single``).

    Returns the :class:`~shardplan.runtime._worker.RunResult` of rank 0.
    """
    return train_many([config], time_limit=time_limit)[0]


def train_many(configs: Sequence[TrainConfig], *, time_limit: float | None = None) -> list[Any]:
    """Run several configs of the same process count one after another, on one set of
    processes (process start-up costs seconds; tests and benchmarks share it).

    ``single`` configs run on rank 0 while the others wait; alone, they run in this process.
    """
    if not configs:
        return []
    sizes = {c.world_size for c in configs if c.kind != "single"}
    if len(sizes) > 1:
        raise ShardplanError(f"configs of one launch need the same process count, got "
                             f"{sorted(sizes)}")
    if not sizes:
        from shardplan.runtime._worker import run_single

        return [run_single(c) for c in configs]
    from shardplan.runtime._launch import launch

    return launch(list(configs), sizes.pop(), time_limit=time_limit)


def llm_memory(config: TrainConfig, *, time_limit: float | None = None
               ) -> list[dict[str, int]]:
    """Peak memory of one training step of an LLM plan, by category, on every rank, as
    torch's own accounting (``MemTracker``) counts it: what the cost model's prediction is
    checked against.

    Runs ``config`` (kind ``llm``, from :func:`config_for_plan`) for two steps on its
    processes and tracks the second (the optimizer state exists from the first).

    Returns
    -------
    list of dict
        Per rank (:meth:`ParallelConfig.rank` order), peak bytes of ``parameters`` (under
        FSDP the gathered ones alive at the peak too), ``buffers``, ``gradients``,
        ``optimizer`` (optimizer state), ``activations`` (activations and temporaries),
        ``other`` and ``total``
        (:func:`shardplan.runtime._llm_memory.peak_by_category`).

    Raises
    ------
    ShardplanError
        Not an LLM run, or the run failed.
    """
    from dataclasses import replace

    if config.kind != "llm":
        raise ShardplanError("memory is measured for LLM plans (a plan with 'parallel')")
    cfg = replace(config, steps=2, measure_memory=True, return_params=False)
    memory = train(cfg, time_limit=time_limit).memory
    assert memory is not None
    return list(memory)


def load_checkpoint_into(directory: str, model: Any) -> int:
    """Load the newest checkpoint of ``directory`` into an unsplit model; returns its step."""
    from shardplan.runtime._checkpoint import load_model

    return load_model(directory, model)
