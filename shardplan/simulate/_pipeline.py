"""One pipeline view of a plan: stage order, stage graph, ranks and the schedule they run.

Computed once by :meth:`PipelineView.build` and read by the simulator, the report and the
runtime, so that what is simulated, drawn and run is the same pipeline: the same order of
stages, the same devices per rank and the same per-rank action lists (``2F0`` ...).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardplan.errors import ShardplanError
from shardplan.ir import ExecutionSettings, Graph, Plan
from shardplan.ir.schedule import Schedule, make_schedule

__all__ = ["PipelineView", "stage_order"]


def stage_order(graph: Graph, plan: Plan) -> tuple[int, ...]:
    """The plan's stages in pipeline order (:meth:`Graph.stage_order`). O(n + m + k^2)."""
    return graph.stage_order(plan.assignment(graph.num_nodes), plan.num_stages)


@dataclass(frozen=True, eq=False)
class PipelineView:
    """A plan as a pipeline.

    Attributes
    ----------
    order : tuple of int
        Plan stage ids in pipeline order (:func:`stage_order`); pipeline position p runs
        plan stage ``order[p]``.
    adjacency : ndarray of bool, shape (S, S)
        In pipeline positions: ``adjacency[p, q]`` when position p sends a tensor to q.
    schedule : Schedule
        Per pipeline rank, its actions; its stages are pipeline positions.
    rank_devices : tuple of tuple of int
        Per pipeline rank, its device per replica: the devices of the plan stage at the
        rank's pipeline position (under interleaved 1F1B, ranks run ``v`` positions each
        and the devices of positions ``>= S / v`` stay idle).
    """

    order: tuple[int, ...]
    adjacency: np.ndarray
    schedule: Schedule
    rank_devices: tuple[tuple[int, ...], ...]

    @classmethod
    def build(cls, plan: Plan, graph: Graph, settings: ExecutionSettings | None = None, *,
              schedule: Schedule | None = None) -> PipelineView:
        """The pipeline of ``plan`` under ``settings`` (default: the plan's), or running the
        given ``schedule`` (whose stage count must be the plan's). O(n + m + S^2 + S M)."""
        settings = plan.settings if settings is None else settings
        order = stage_order(graph, plan)
        k = plan.num_stages
        pos = np.empty(k, dtype=np.int64)
        pos[list(order)] = np.arange(k)
        adj = graph.stage_adjacency(pos[plan.assignment(graph.num_nodes)], k)
        if schedule is None:
            schedule = make_schedule(settings.schedule, k, settings.microbatches,
                                     virtual_stages=settings.virtual_stages)
        elif schedule.num_stages != k:
            raise ShardplanError(f"the schedule has {schedule.num_stages} stages, the plan {k}")
        ranks = tuple(tuple(int(d) for d in plan.stages[order[p]].devices)
                      for p in range(schedule.num_ranks))
        return cls(order=order, adjacency=adj, schedule=schedule, rank_devices=ranks)

    @property
    def num_stages(self) -> int:
        return len(self.order)

    def stage_devices(self, position: int) -> tuple[int, ...]:
        """Devices (one per replica) that run pipeline position ``position``."""
        return self.rank_devices[self.schedule.stage_rank[position]]

    def position_of(self, plan_stage: int) -> int:
        """Pipeline position of plan stage ``plan_stage``."""
        return self.order.index(plan_stage)
