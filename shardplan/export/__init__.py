"""A plan in the forms the tools users already run can read (``shardplan export``).

Torch-free: every format is text (JSON or TOML) that the other tool, or the user's script
around it, reads.

- ``torch``: split points by module path for ``torch.distributed.pipelining.pipeline(module,
  mb_args, split_spec=...)`` (each pipeline stage after the first starts at a module,
  ``SplitPoint.BEGINNING``), the schedule as torch's CSV and its stage-to-rank placement.
- ``torchtitan``: a recipe module for torchtitan 0.3.0 (``--module M --config
  shardplan_plan``: the user's base recipe with the plan's ``module_fqns_per_model_part``,
  schedule, degrees and batch; LLM plans: :mod:`shardplan.export._torchtitan`),
  the same as ``--section.option`` flags, and the schedule CSV beside it; or, for torchtitan
  0.2.x (``ExportOptions(torchtitan_version="0.2")``), the ``[parallelism]`` TOML.
- an LLM plan (one with ``parallel``) to ``megatron`` or ``torchtitan``: its parallel
  configuration, batch and training settings as the arguments / options those tools start a
  run with (:mod:`shardplan.export._parallel`), what ``shardplan import`` reads back.
- ``megatron``: ``--pipeline-model-parallel-layout`` (``E`` embedding, ``t`` transformer
  layer, ``L`` head and loss, ``|`` between stages) and the TP/PP/DP sizes, as arguments.
- ``deepspeed``: the layer list, the layer boundaries of every stage and the
  ``partition_method`` that gives them (``uniform``; other splits are refused: DeepSpeed
  takes no explicit boundaries), with the batch settings of its config.
- ``chrome-trace``: the simulated iteration as Trace Event JSON (Perfetto,
  ``chrome://tracing``): one complete event per stage action on the device's compute track,
  messages on a send track and collectives on their own track.

A stage starting where a format cannot split (inside a module for torch, a layer for the
others) starts at the nearest place it can, and :attr:`Export.notes` names the nodes moved
(``ExportOptions(exact=True)`` refuses instead). A plan a format cannot express (a strategy
plan to a pipeline format, stages that are not consecutive pieces of the program, unequal
replica counts) raises one-line :class:`ShardplanError`.
"""

from __future__ import annotations

import json
from typing import Any

from shardplan.errors import ShardplanError
from shardplan.export._common import (
    EXPORT_FORMAT as EXPORT_FORMAT,  # the format tag, as before the split
)
from shardplan.export._common import (
    TORCHTITAN_VERSIONS,
    Export,
    ExportOptions,
    torch_schedule_name,
)
from shardplan.ir import ExecutionSettings, Graph, Plan, Topology

__all__ = ["FORMATS", "TORCHTITAN_VERSIONS", "Export", "ExportOptions", "export",
           "torch_schedule_name"]

FORMATS = ("torch", "torchtitan", "megatron", "deepspeed", "chrome-trace")


def export(plan: Plan, graph: Graph, topology: Topology, fmt: str, *,
           settings: ExecutionSettings | None = None, schedule: Any = None,
           options: ExportOptions | None = None, schedule_csv: str | None = None) -> Export:
    """``plan`` in format ``fmt`` (one of :data:`FORMATS`), with ``settings`` (default: the
    plan's) and optionally a :class:`~shardplan.simulate.Schedule` to run instead of the
    settings' one; ``options`` (:class:`ExportOptions`) say how (``schedule_csv``, kept for
    older callers, overrides ``options.schedule_csv``). O(n + m) plus, for the trace, one
    simulation."""
    from dataclasses import replace

    if fmt not in FORMATS:
        raise ShardplanError(f"unknown export format {fmt!r} (choose from {', '.join(FORMATS)})")
    opts = ExportOptions() if options is None else options
    if schedule_csv is not None:
        opts = replace(opts, schedule_csv=schedule_csv)
    plan.validate(graph, topology)
    settings = (plan.settings if settings is None else settings).resolve(graph)
    if fmt == "chrome-trace":
        from shardplan.export._trace import chrome_trace

        trace = chrome_trace(plan, graph, topology, settings, schedule)
        if plan.parallel is not None:  # the degrees and settings the trace was simulated at
            from shardplan.export._moe import moe_record
            from shardplan.export._parallel import llm_record

            trace["otherData"].update(parallel=plan.parallel.to_dict(),
                                      **llm_record(plan, settings, "chrome-trace"),
                                      **moe_record(plan, graph))
        return Export(fmt, json.dumps(trace, separators=(",", ":")) + "\n")
    if plan.parallel is not None:
        from shardplan.export._parallel import PARALLEL_EXPORTERS

        return PARALLEL_EXPORTERS[fmt](plan, graph, topology, settings, schedule, opts)
    from shardplan.export import _frameworks

    return _frameworks.EXPORTERS[fmt](plan, graph, topology, settings, schedule, opts)
