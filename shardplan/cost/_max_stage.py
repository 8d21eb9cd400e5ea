"""The ``max-stage`` objective: the largest stage time of a pipeline plan.

Which formula depends on the plan's recorded objective name:

- ``max_stage_seconds`` (a partition, Parmesan section 4, equations 1-3):
  :func:`partition_max_stage`, the cost model's :meth:`CostModel.stage_seconds` with the
  cost-model settings the partitioner recorded in ``plan.options``, infinite when a stage
  does not fit in memory;
- ``max_stage_seconds_p2p`` / ``max_stage_seconds_allreduce`` (a mapping, Parmesan section 5,
  equations 6-7): :mod:`shardplan.cost._mapping` (issue #5).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardplan.cost._memory import SCHEDULES, in_flight_microbatches, optimizer_state_factor
from shardplan.cost._model import CostModel, plan_arrays
from shardplan.errors import ShardplanError
from shardplan.ir import Graph, Plan, Topology
from shardplan.objectives import Evaluation, objective

__all__ = ["PipelineSettings", "partition_max_stage", "pipeline_stage_seconds"]

MAPPING_OBJECTIVES = ("max_stage_seconds_p2p", "max_stage_seconds_allreduce")


@dataclass(frozen=True, slots=True)
class PipelineSettings:
    """The cost-model settings of a pipeline partition, as plans record them in ``options``.

    Attributes
    ----------
    efficiency : float
        Fraction of peak FLOP/s reached (default 1.0).
    optimizer : str
        Optimizer whose state the memory model counts (default ``adam``).
    microbatches : int
        Micro-batches per iteration (default 8); with ``schedule`` it fixes the activations
        each stage keeps in flight (:func:`~shardplan.cost.in_flight_microbatches`).
    schedule : {"1f1b", "gpipe"}
        Default ``1f1b``.
    """

    efficiency: float = 1.0
    optimizer: str = "adam"
    microbatches: int = 8
    schedule: str = "1f1b"

    KEYS = ("efficiency", "optimizer", "microbatches", "schedule")

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> PipelineSettings:
        """Read the settings from a plan's (or a command line's) options; others ignored."""
        kw = {k: options[k] for k in cls.KEYS if options.get(k) is not None}
        s = cls(**kw)
        if isinstance(s.efficiency, bool) or not isinstance(s.efficiency, (int, float)) \
                or not 0 < s.efficiency <= 1:
            raise ShardplanError(f"efficiency must be in (0, 1], got {s.efficiency!r}")
        optimizer_state_factor(s.optimizer)
        if isinstance(s.microbatches, bool) or not isinstance(s.microbatches, (int, np.integer)) \
                or s.microbatches < 1:
            raise ShardplanError(f"microbatches must be a positive integer, got "
                                 f"{s.microbatches!r}")
        if s.schedule not in SCHEDULES:
            raise ShardplanError(f"unknown schedule {s.schedule!r} (choose from "
                                 f"{', '.join(SCHEDULES)})")
        return s

    def to_options(self) -> dict[str, Any]:
        return {"efficiency": float(self.efficiency), "optimizer": self.optimizer,
                "microbatches": int(self.microbatches), "schedule": self.schedule}

    def model(self, graph: Graph, topology: Topology) -> CostModel:
        return CostModel(graph, topology, optimizer=self.optimizer,
                         efficiency=float(self.efficiency))


def pipeline_stage_seconds(model: CostModel, assignment: np.ndarray, stage_devices: np.ndarray,
                           settings: PipelineSettings) -> tuple[np.ndarray, np.ndarray,
                                                                np.ndarray]:
    """Stage times of a partition: equation 3, ``inf`` for a stage that does not fit.

    Returns ``(seconds, memory_bytes, fits)``, each of shape (k,): the cost model's
    :meth:`~CostModel.stage_seconds` (per micro-batch, replicas sharing it), the memory per
    device of each stage with the micro-batches its position in the pipeline keeps in flight,
    and whether that fits the smallest memory among the stage's devices. O(n + m log m + r k^2).
    """
    k = stage_devices.shape[0]
    seconds = model.stage_seconds(assignment, stage_devices, k)
    flight = in_flight_microbatches(k, int(settings.microbatches), settings.schedule)
    mem = model.partition_memory_bytes(assignment, k, in_flight=flight,
                                       replicas=stage_devices.shape[1])
    have = model.topology.device_memory[stage_devices].min(axis=1)
    fits = mem <= have
    return np.where(fits, seconds, np.inf), mem, fits


def partition_max_stage(plan: Plan, graph: Graph, topology: Topology,
                        options: Mapping[str, Any]) -> Evaluation:
    """``max_stage_seconds`` of a partition plan (Parmesan equation 1).

    The cost-model settings are the plan's recorded ``options`` (see
    :class:`PipelineSettings`), overridden by ``options`` (``shardplan cost --option``).
    Stages are numbered in plan order, which is their pipeline order (stage 0 keeps the most
    micro-batches in flight under 1F1B).
    """
    merged = dict(plan.options)
    merged.update(options)
    settings = PipelineSettings.from_options(merged)
    assignment, devices = plan_arrays(plan, graph)
    model = settings.model(graph, topology)
    seconds, mem, fits = pipeline_stage_seconds(model, assignment, devices, settings)
    value = float(seconds.max()) if seconds.size else 0.0
    details = {
        "stage_seconds": [None if not math.isfinite(x) else float(x) for x in seconds],
        "stage_memory_bytes": [float(x) for x in mem],
        "fits_memory": [bool(x) for x in fits],
        "settings": settings.to_options(),
    }
    return "max_stage_seconds", value, details


@objective("max-stage")
def max_stage(plan: Plan, graph: Graph, topology: Topology, *, model: str | None = None,
              **options: Any) -> Evaluation:
    """Evaluate the plan's max-stage objective; ``model`` (``p2p``/``allreduce``) forces the
    mapping formulas of section 5 whatever the plan recorded."""
    name = plan.objective.name
    if model is not None:
        if model not in ("p2p", "allreduce"):
            raise ShardplanError(f"model must be p2p or allreduce, got {model!r}")
        name = f"max_stage_seconds_{model}"
    if name in MAPPING_OBJECTIVES:
        from shardplan.cost._mapping import mapped_max_stage

        return mapped_max_stage(plan, graph, topology, name.rsplit("_", 1)[1], options)
    return partition_max_stage(plan, graph, topology, options)
