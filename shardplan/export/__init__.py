"""A plan in the forms the tools users already run can read (``shardplan export``).

Torch-free: every format is text (JSON or TOML) that the other tool, or the user's script
around it, reads.

- ``torch``: split points by module path for ``torch.distributed.pipelining.pipeline(module,
  mb_args, split_spec=...)`` (each pipeline stage after the first starts at a module,
  ``SplitPoint.BEGINNING``), the schedule as torch's CSV and its stage-to-rank placement.
- ``torchtitan``: a recipe module for current torchtitan (``--module M --config
  shardplan_plan``: the user's base recipe with the plan's
  ``pipeline_parallel_module_fqns_per_model_part``, schedule, degrees and batch in tokens),
  the same as ``--section.option`` flags, and the schedule CSV beside it; or, for torchtitan
  0.2.x (``ExportOptions(torchtitan_version="0.2")``), the ``[parallelism]`` TOML.
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
from dataclasses import dataclass, field
from typing import Any

from shardplan.errors import ShardplanError
from shardplan.ir import ExecutionSettings, Graph, Plan, Topology

__all__ = ["FORMATS", "TORCHTITAN_VERSIONS", "Export", "ExportOptions", "export",
           "torch_schedule_name"]

FORMATS = ("torch", "torchtitan", "megatron", "deepspeed", "chrome-trace")
TORCHTITAN_VERSIONS = ("current", "0.2")
EXPORT_FORMAT = "shardplan.export/1"
_TORCH_SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}


@dataclass(frozen=True)
class Export:
    """An exported plan: ``text`` for the output file, ``beside``: suffix -> text of the
    files written next to it (``.schedule.csv``)."""

    format: str
    text: str
    beside: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class ExportOptions:
    """How to export.

    Attributes
    ----------
    exact : bool
        Refuse a plan whose stage starts where the format cannot split (inside a module
        for torch, inside a layer for the others) instead of moving the start to the
        nearest place it can (:attr:`Export.notes` names the nodes moved).
    torchtitan_version : {"current", "0.2"}
        ``current``: a recipe module with one config function (``--module M --config
        shardplan_plan``) and the ``--section.option`` flags beside it; ``0.2``: the
        ``[parallelism]`` TOML torchtitan 0.2.x and older read.
    torchtitan_base : str
        ``module:function`` of the user's model recipe the torchtitan recipe starts from.
    schedule_csv : str
        The path the torchtitan flags and TOML give the schedule CSV (the recipe finds it
        beside itself).
    output_name : str
        The output file's name (the recipe names the files beside it by it).
    """

    exact: bool = False
    torchtitan_version: str = "current"
    torchtitan_base: str = "MODULE:FUNCTION"
    schedule_csv: str = "schedule.csv"
    output_name: str = "export"

    def __post_init__(self) -> None:
        if self.torchtitan_version not in TORCHTITAN_VERSIONS:
            raise ShardplanError(f"unknown torchtitan version {self.torchtitan_version!r} "
                                 f"(choose from {', '.join(TORCHTITAN_VERSIONS)})")


def torch_schedule_name(name: str, stages_per_rank: int) -> str:
    """torch's ``get_schedule_class`` name of our schedule ``name`` (a custom schedule: the
    class torch uses for a CSV of that many stages per rank)."""
    if name in _TORCH_SCHEDULES:
        return _TORCH_SCHEDULES[name]
    return "Interleaved1F1B" if stages_per_rank > 1 else "1F1B"


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

        return Export(fmt, json.dumps(chrome_trace(plan, graph, topology, settings, schedule),
                                      separators=(",", ":")) + "\n")
    from shardplan.export import _frameworks

    return _frameworks.EXPORTERS[fmt](plan, graph, topology, settings, schedule, opts)
