"""Peak memory of one training step by category, as torch's own accounting counts it
(:class:`torch.distributed._tools.mem_tracker.MemTracker`): what the cost model's memory
prediction of an LLM plan is checked against.

:func:`start_tracking` enters a tracker around one step and :func:`stop_tracking` leaves it
(the LLM runtime tracks the last step of a run with ``measure_memory``, so that the optimizer
state exists from the step before);
:func:`peak_by_category` reads the tracker's snapshot at the step's peak. MemTracker counts
the tensors alive on each device (through a dispatch mode and weak references), labelled by
what they are to the tracked modules and optimizer: parameters, buffers, gradients,
optimizer state, activations (saved for the backward inside a module), temporaries and
others. Split layers count their local shards (DTensors are unwrapped). On CPU the numbers
are the tensors' sizes, not the allocator's: no caching or fragmentation is included.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["CATEGORIES", "peak_by_category", "start_tracking", "stop_tracking"]

CATEGORIES = ("parameters", "buffers", "gradients", "optimizer", "activations", "other",
              "total")


def _step_tracker() -> Any:
    """A MemTracker that lets a step run several micro-batches through the same stage.

    torch 2.14's MemTracker raises ``NotImplementedError`` ("multiple iterative calls") on a
    root module's second forward while tracking, taking it for the next iteration. A step of
    ``M`` micro-batches is exactly that, and pipeline schedules interleave the forwards and
    backwards of different micro-batches. Here a repeated forward outside the backward
    starts the module's statistics afresh (its per-module statistics, which are not read
    here, keep only the last micro-batch); the device totals and their peak, which
    :func:`peak_by_category` reads, count every tensor alive as before."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class _StepTracker(MemTracker):
        def _pre_fw_hook(self, module: nn.Module, inputs: Any) -> None:
            if module in self.memory_tracking and not self._mod_tracker.is_bw:
                del self.memory_tracking[module]
            super()._pre_fw_hook(module, inputs)

    return _StepTracker()


def start_tracking(modules: Sequence[nn.Module], optimizer: torch.optim.Optimizer) -> Any:
    """A MemTracker already entered, tracking ``modules`` and ``optimizer``; the caller
    leaves it with :func:`stop_tracking` once the step is done.

    Python's cyclic garbage collector is paused while the step is tracked (after one full
    collection): a collection runs when the interpreter's allocation counts cross a
    threshold, which depends on everything each process did before, so tensors held in
    reference cycles would be freed at different points of the step on different ranks,
    and ranks running the same code would report different peaks. Paused, every tensor is
    freed where its last reference goes, at the same point of the program on every rank.
    """
    import gc

    tracker = _step_tracker()
    tracker.track_external(*modules, optimizer)
    gc.collect()
    gc.disable()
    tracker.__enter__()
    return tracker


def stop_tracking(tracker: Any) -> None:
    """Leave a tracker of :func:`start_tracking` and resume garbage collection."""
    import gc

    try:
        tracker.__exit__(None, None, None)
    finally:
        gc.enable()


def peak_by_category(tracker: Any) -> dict[str, int]:
    """Bytes of each category at the tracked step's peak, summed over devices.

    Returns
    -------
    dict of str to int
        ``parameters``, ``buffers`` (the model's, such as rotary tables), ``gradients``,
        ``optimizer`` (optimizer state), ``activations`` (activations and temporaries),
        ``other`` (tensors MemTracker cannot attribute) and ``total`` (their sum,
        MemTracker's own peak).
    """
    from torch.distributed._tools.mem_tracker import _MemRefType as Ref

    groups = {"parameters": (Ref.PARAM,), "buffers": (Ref.BUFFER,), "gradients": (Ref.GRAD,),
              "optimizer": (Ref.OPT,), "activations": (Ref.ACT, Ref.TEMP),
              "other": (Ref.OTH,)}
    out = dict.fromkeys(CATEGORIES, 0)
    for snap in tracker.get_tracker_snapshot("peak").values():
        for cat, refs in groups.items():
            out[cat] += sum(int(snap.get(r, 0)) for r in refs)
        out["total"] += int(snap.get("Total", 0))
    return out
