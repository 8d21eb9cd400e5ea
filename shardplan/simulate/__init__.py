"""Simulate a plan's training iteration: schedules as data and a discrete-event simulator.

- :mod:`shardplan.ir.schedule` (re-exported here): :class:`Schedule` (per rank, the ordered
  :class:`Action` list; text form ``2F0`` like torch.distributed.pipelining) and the
  generators :func:`gpipe`, :func:`one_f_one_b`, :func:`interleaved_1f1b`;
- :func:`simulate`: one iteration of a plan on its topology (compute from the shared cost
  model, messages over routed, shared links, ring all-reduce, optimizer step, memory over
  time), returning a :class:`SimulationResult`.

NumPy only; no torch.
"""

from shardplan.cost import OPTIMIZER_FLOPS
from shardplan.ir.schedule import (
    SCHEDULES,
    Action,
    Schedule,
    gpipe,
    interleaved_1f1b,
    load_schedule,
    make_schedule,
    one_f_one_b,
    save_schedule,
)
from shardplan.simulate._engine import simulate
from shardplan.simulate._pipeline import PipelineView, stage_order
from shardplan.simulate.result import Interval, SimulationResult

__all__ = ["OPTIMIZER_FLOPS", "SCHEDULES", "Action", "Interval", "PipelineView", "Schedule",
           "SimulationResult",
           "gpipe", "interleaved_1f1b", "load_schedule", "make_schedule", "one_f_one_b",
           "save_schedule", "simulate", "stage_order"]
