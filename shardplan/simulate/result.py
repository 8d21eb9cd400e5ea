"""What a simulation returns: the iteration's numbers and its timeline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardplan.ir.schedule import Schedule

__all__ = ["COMPUTE_KINDS", "TRANSFER_KINDS", "Interval", "SimulationResult"]

COMPUTE_KINDS = ("F", "B", "OPT")
TRANSFER_KINDS = ("activation", "gradient", "allreduce")


@dataclass(frozen=True, slots=True)
class Interval:
    """One busy interval of a device: a computation (``F``, ``B``, ``OPT``) or a message it
    sends (``activation``, ``gradient``, ``allreduce``: from ``device`` to ``peer``).

    ``stage`` is the pipeline position (see :attr:`SimulationResult.stage_order`),
    ``microbatch`` None for the all-reduce and the optimizer step.
    """

    device: int
    start: float
    end: float
    kind: str
    stage: int
    microbatch: int | None = None
    peer: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "start": self.start, "end": self.end,
                "kind": self.kind, "stage": self.stage, "microbatch": self.microbatch,
                "peer": self.peer}


@dataclass(frozen=True)
class SimulationResult:
    """One simulated training iteration of a plan.

    Attributes
    ----------
    schedule : Schedule
        The schedule run (its stage s is the plan's stage ``stage_order[s]``).
    stage_order : tuple of int
        Plan stage id of every pipeline position (a topological order of the stage graph).
    num_microbatches, num_replicas : int
    samples_per_iteration : int
        ``M * graph.batch_size`` (the graph is captured at the micro-batch size; the R
        replicas of a stage each take ``1/R`` of every micro-batch).
    iteration_seconds : float
        Until the last device finishes its optimizer step.
    pipeline_seconds : float
        Until the last backward ends (before the all-reduces' tails and the optimizer).
    throughput : float
        ``samples_per_iteration / iteration_seconds``, samples/s.
    bubble_fraction : float
        Idle share of the devices' compute during the pipeline phase:
        ``1 - sum(busy) / (devices * pipeline_seconds)``; ``(S-1)/(M+S-1)`` for equal stages.
    devices : tuple of int
        The devices used, ascending; the per-device tuples below follow this order.
    busy_seconds : tuple of float
        Forward and backward compute per device.
    peak_memory_bytes, memory_capacity_bytes : tuple of float
        What the tensors hold at their peak (``torch.cuda.max_memory_allocated``), and the
        device's memory.
    reserved_memory_bytes, device_memory_bytes : tuple of float
        LLM plans: what the caching allocator reserves at the peak
        (``torch.cuda.max_memory_reserved``) and what the device holds with the CUDA context
        and NCCL's buffers (``nvidia-smi``), ``shardplan/cost/_reserved.py``; empty for other
        plan kinds. :attr:`fits_memory` reads the device figure when there is one.
    allreduce_seconds : tuple of float
        Per pipeline stage, from its all-reduce's start to its end (0 for one replica).
    optimizer_seconds : float
        The longest optimizer step.
    ideal_seconds : float
        ``M`` times the slowest stage replica's forward + backward: the iteration time of a
        pipeline without bubbles, transfers or all-reduce, a lower bound on
        ``iteration_seconds``.
    intervals : tuple of Interval
        Everything every device did, for timelines.
    memory_timeline : tuple of tuple of (float, float)
        Per device, ``(time, bytes)`` after every change.
    options : dict
        The simulation's options (schedule, recompute, optimizer, ...).
    """

    schedule: Schedule
    stage_order: tuple[int, ...]
    num_microbatches: int
    num_replicas: int
    samples_per_iteration: int
    iteration_seconds: float
    pipeline_seconds: float
    throughput: float
    bubble_fraction: float
    devices: tuple[int, ...]
    busy_seconds: tuple[float, ...]
    peak_memory_bytes: tuple[float, ...]
    memory_capacity_bytes: tuple[float, ...]
    allreduce_seconds: tuple[float, ...]
    optimizer_seconds: float
    ideal_seconds: float
    intervals: tuple[Interval, ...] = ()
    memory_timeline: tuple[tuple[tuple[float, float], ...], ...] = ()
    options: dict[str, Any] | None = None
    reserved_memory_bytes: tuple[float, ...] = ()
    device_memory_bytes: tuple[float, ...] = ()

    @property
    def fits_memory(self) -> bool:
        """Whether every device's peak memory is within its capacity: the memory the device
        holds (tensors, allocator's reserve, CUDA context, NCCL buffers) where the plan kind
        prices it, else the tensors' peak."""
        held = self.device_memory_bytes or self.peak_memory_bytes
        return all(p <= c for p, c in zip(held, self.memory_capacity_bytes, strict=True))

    def to_dict(self, *, timeline: bool = False) -> dict[str, Any]:
        """The numbers as a JSON-able dict (with the intervals when ``timeline``)."""
        out: dict[str, Any] = {
            "iteration_seconds": self.iteration_seconds,
            "throughput": self.throughput,
            "bubble_fraction": self.bubble_fraction,
            "peak_memory_bytes": list(self.peak_memory_bytes),
            "memory_capacity_bytes": list(self.memory_capacity_bytes),
            "fits_memory": self.fits_memory,
            **({"reserved_memory_bytes": list(self.reserved_memory_bytes),
                "device_memory_bytes": list(self.device_memory_bytes)}
               if self.device_memory_bytes else {}),
            "devices": list(self.devices),
            "busy_seconds": list(self.busy_seconds),
            "pipeline_seconds": self.pipeline_seconds,
            "allreduce_seconds": list(self.allreduce_seconds),
            "optimizer_seconds": self.optimizer_seconds,
            "ideal_seconds": self.ideal_seconds,
            "samples_per_iteration": self.samples_per_iteration,
            "num_microbatches": self.num_microbatches,
            "num_stages": self.schedule.num_stages,
            "num_replicas": self.num_replicas,
            "schedule": self.schedule.name,
            "stage_order": list(self.stage_order),
            "options": dict(self.options or {}),
        }
        if timeline:
            out["intervals"] = [iv.to_dict() for iv in self.intervals]
        return out
