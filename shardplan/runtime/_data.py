"""How a run cuts a step's batch: micro-batches and their parts. The model, its data and its
loss are the workload's (:mod:`shardplan.workload`)."""

from __future__ import annotations

import torch

__all__ = ["chunks", "resize_batch"]


def chunks(inputs: tuple[torch.Tensor, ...], target: torch.Tensor, microbatches: int,
           parts: int) -> list[tuple[tuple[torch.Tensor, ...], torch.Tensor]]:
    """Cut a step's batch into ``microbatches`` consecutive micro-batches and each of those
    into ``parts`` consecutive parts: chunk ``j * parts + p`` is part ``p`` of micro-batch
    ``j`` (the order every run uses; replica or process ``p`` runs part ``p``). Parts of
    uneven micro-batches differ by at most one sample."""
    xs = [t.tensor_split(microbatches) for t in inputs]
    ys = target.tensor_split(microbatches)
    out = []
    for j in range(microbatches):
        px = [x[j].tensor_split(parts) for x in xs]
        py = ys[j].tensor_split(parts)
        out.extend((tuple(x[p] for x in px), py[p]) for p in range(parts))
    return out


def resize_batch(t: torch.Tensor, size: int) -> torch.Tensor:
    """``t`` with ``size`` samples: its first ones, repeated as needed."""
    reps = -(-size // t.shape[0])
    return t.repeat(reps, *([1] * (t.dim() - 1)))[:size].contiguous()
