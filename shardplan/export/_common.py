"""What every export format shares: the result (:class:`Export`), how to export
(:class:`ExportOptions`), the format tag of the JSON files and torch's name of a schedule.
Re-exported by :mod:`shardplan.export`; the formats (:mod:`shardplan.export._frameworks`)
import them from here."""

from __future__ import annotations

from dataclasses import dataclass, field

from shardplan.errors import ShardplanError

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
