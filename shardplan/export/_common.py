"""What every export format shares: the result (:class:`Export`), how to export
(:class:`ExportOptions`), the format tag of the JSON files and torch's name of a schedule.
Re-exported by :mod:`shardplan.export`; the formats (:mod:`shardplan.export._frameworks`)
import them from here."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from shardplan.errors import ShardplanError
from shardplan.ir import ExecutionSettings, Graph, ParallelConfig, Plan

__all__ = ["EXPORT_FORMAT", "TORCHTITAN_VERSIONS", "Export", "ExportOptions",
           "torch_schedule_name"]

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


# ---------------------------------------------------------------- LLM plans (both exports)
_DEFAULTS: dict[str, Any] = {"precision": "fp32", "recompute": "none", "gradient_sync": "end",
                             "sequence_parallel": False, "tp_comm_overlap": False,
                             "optimizer": "adam"}
_BLOCK = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.(\d+)(?:\.|$)")


def _setting(plan: Plan, settings: ExecutionSettings, name: str) -> Any:
    """A training setting: the settings' own field when it has it (and, for ``recompute``,
    a granularity rather than a boolean), else the importer's record, else the default."""
    recorded = (plan.meta.get("imported_from") or {}).get("execution") or {}
    if hasattr(settings, name):
        v = getattr(settings, name)
        if name == "recompute" and isinstance(v, bool):
            rec = recorded.get("recompute")
            return rec if v and rec in ("selective", "op", "full") else "full" if v else "none"
        if name == "gradient_sync" and v == "end" and recorded.get(name) == "zero1":
            return "zero1"
        return v
    return recorded.get(name, _DEFAULTS[name])


def _batch(par: ParallelConfig, settings: ExecutionSettings, tool: str) -> tuple[int, int]:
    """(micro-batch per data-parallel rank, micro-batches)."""
    shared = int(settings.microbatch_size or 0)
    if shared % par.data_parallel:
        raise ShardplanError(f"{tool} gives every data-parallel rank whole samples, and the "
                             f"micro-batch of {shared} does not split over "
                             f"{par.data_parallel} ranks")
    return shared // par.data_parallel, int(settings.microbatches)


def _num_layers(plan: Plan, graph: Graph) -> int:
    par = plan.parallel
    assert par is not None
    if par.stage_layers is not None:
        return sum(par.stage_layers)
    blocks = {int(m.group(1)) for mod in graph.modules if mod
              for m in [_BLOCK.search(mod)] if m}
    if not blocks:
        raise ShardplanError("torchtitan counts pipeline stages in layers, and the graph has "
                             "no numbered block list (module paths like layers.0)")
    return max(blocks) + 1
