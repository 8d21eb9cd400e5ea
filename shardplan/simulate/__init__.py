"""Simulate a plan's training iteration: schedules as data and a discrete-event simulator.

- :mod:`~shardplan.simulate.schedule`: :class:`Schedule` (per rank, the ordered
  :class:`Action` list; text form ``2F0`` like torch.distributed.pipelining) and the
  generators :func:`gpipe`, :func:`one_f_one_b`, :func:`interleaved_1f1b`;
- :func:`simulate`: one iteration of a plan on its topology (compute from the shared cost
  model, messages over routed, shared links, ring all-reduce, optimizer step, memory over
  time), returning a :class:`SimulationResult`.

NumPy only; no torch.
"""

from shardplan.simulate._engine import OPTIMIZER_FLOPS, simulate
from shardplan.simulate._pipeline import PipelineView, stage_order
from shardplan.simulate.result import Interval, SimulationResult
from shardplan.simulate.schedule import (
    SCHEDULES,
    Action,
    Schedule,
    gpipe,
    interleaved_1f1b,
    make_schedule,
    one_f_one_b,
)

__all__ = ["OPTIMIZER_FLOPS", "SCHEDULES", "Action", "Interval", "PipelineView", "Schedule",
           "SimulationResult",
           "gpipe", "interleaved_1f1b", "make_schedule", "one_f_one_b", "simulate",
           "stage_order"]
