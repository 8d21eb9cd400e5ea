"""The flat gradient all-reduce of DDP-style replicas, shared by the LLM runtime's dense
layers (:mod:`shardplan.runtime._llm`) and a mixture's experts
(:mod:`shardplan.runtime._llm_moe`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["all_reduce_mean"]


def all_reduce_mean(params: Sequence[nn.Parameter], group: Any, size: int) -> None:
    """DDP's gradient sum over the replicas, one flat all-reduce, then divided by ``size``
    (split layers: their local shards, which replicas hold alike); ``group`` None: one
    replica, divided only."""
    from torch.distributed.tensor import DTensor

    grads = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        g = p.grad
        grads.append(g.to_local() if isinstance(g, DTensor) else g)
    flat = torch.cat([g.reshape(-1) for g in grads])
    if group is not None:
        dist.all_reduce(flat, group=group)
    flat.div_(size)
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset:offset + n].view_as(g))
        offset += n
