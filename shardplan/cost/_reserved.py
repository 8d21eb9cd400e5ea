"""Memory as a run reports it: allocated, reserved by the caching allocator, held on the device.

What a training process's tensors hold at their peak (the LLM cost model's ``total``,
:func:`shardplan.cost.llm_costs`) is what ``torch.cuda.max_memory_allocated`` reports and what
the CPU runtime's MemTracker measures. Two larger figures are what runs publish and what runs
out of memory:

- **reserved** (``torch.cuda.max_memory_reserved``, what torchtitan logs, Megatron's
  "max reserved"): the caching allocator's segments. Without expandable segments a segment is
  a fixed ``cudaMalloc`` block; a request that fits no free block of an existing segment opens
  a new segment of its own size (rounded to :data:`ALLOCATOR_ROUND`), and the holes freed
  between live tensors are reused only by requests that fit them. At the peak the allocator
  therefore holds, beside the live tensors, at least one hole the size of the largest tensor
  the step allocates and frees (the recompute working set of a block, the logits' fp32 copy):
  it was carved when that tensor was made and cannot serve the tensors that outlive it. With
  ``expandable_segments:True`` (``PYTORCH_CUDA_ALLOC_CONF``) segments grow in 2 MiB pages and
  freed pages are remapped, so the slack is the rounding alone.
- **device** (``nvidia-smi``): reserved, plus what is allocated outside the caching
  allocator -- the CUDA context with torch's kernels (:data:`CUDA_CONTEXT_BYTES`) and NCCL's
  communicator buffers (:data:`NCCL_BUFFSIZE` per channel and peer connection, for every
  communicator the layout creates: :func:`communicators`).

A layout runs out of memory when its reserved bytes (plus the context and NCCL buffers, which
share the device) exceed the device's memory; :func:`device_bytes` is that figure.
"""

from __future__ import annotations

import numpy as np

from shardplan.ir import ParallelConfig

__all__ = ["ALLOCATOR_ROUND", "CUDA_CONTEXT_BYTES", "NCCL_BUFFSIZE", "NCCL_CHANNELS",
           "communicators", "device_bytes", "reserved_bytes"]

#: The caching allocator rounds a large request (over 1 MiB) up to a multiple of 2 MiB
#: (``kRoundLarge`` in c10/cuda/CUDACachingAllocator.cpp); an expandable segment maps 2 MiB
#: pages.
ALLOCATOR_ROUND = 2 * 2**20
#: Device memory of a process's CUDA context with torch's kernels, measured by PyTorch PR
#: #86509 (torch 1.13): 666,632,192 bytes with every module loaded at start (CUDA before
#: 11.7, torch before 1.13: ``eager``), 287,047,680 with ``CUDA_MODULE_LOADING=LAZY``, which
#: torch sets since 1.13 (``lazy``).
CUDA_CONTEXT_BYTES = {"eager": 666_632_192, "lazy": 287_047_680}
#: NCCL's buffer per channel and peer connection for its Simple protocol (``NCCL_BUFFSIZE``,
#: default 4 MiB, NCCL's environment-variable documentation).
NCCL_BUFFSIZE = 4 * 2**20
#: Channels per communicator and connections per channel: **assumed** 16 channels (NCCL picks
#: 2 to 32 by topology and message sizes) with a ring and a tree connection each.
NCCL_CHANNELS = 16
_CONNECTIONS = 2


def communicators(parallel: ParallelConfig) -> int:
    """NCCL communicators one device of the layout joins: its tensor-, context- and
    data-parallel groups (the data-parallel one with the context ranks, and the replicas'
    group apart from the shards' under HSDP), the pipeline's point-to-point pair, and the
    embedding group tying the first and last stage. O(1).

    Examples
    --------
    >>> communicators(ParallelConfig(tp=8, pp=12, dp=8))
    4
    >>> communicators(ParallelConfig())
    0
    """
    groups = [parallel.tp > 1, parallel.cp > 1,
              parallel.data_parallel > 1,  # with the context ranks when cp > 1
              parallel.dp > 1 and parallel.dp_shard > 1, parallel.pp > 1, parallel.pp > 1]
    return int(sum(groups))


def reserved_bytes(allocated: np.ndarray, largest_transient: np.ndarray, *,
                   expandable_segments: bool = False) -> np.ndarray:
    """What the caching allocator reserves at the peak (module docstring): the allocated
    bytes rounded to :data:`ALLOCATOR_ROUND`, plus, without expandable segments, one hole the
    size of the largest tensor the step allocates and frees. O(len(allocated))."""
    alloc = np.ceil(np.asarray(allocated, dtype=np.float64) / ALLOCATOR_ROUND) * ALLOCATOR_ROUND
    if expandable_segments:
        return alloc
    hole = np.ceil(np.asarray(largest_transient, dtype=np.float64) / ALLOCATOR_ROUND)
    return alloc + hole * ALLOCATOR_ROUND


def device_bytes(reserved: np.ndarray, parallel: ParallelConfig, *,
                 lazy_loading: bool = True) -> np.ndarray:
    """What the device holds (``nvidia-smi``): reserved plus the CUDA context and NCCL's
    communicator buffers. O(len(reserved))."""
    context = CUDA_CONTEXT_BYTES["lazy" if lazy_loading else "eager"]
    nccl = communicators(parallel) * NCCL_CHANNELS * _CONNECTIONS * NCCL_BUFFSIZE
    return np.asarray(reserved, dtype=np.float64) + context + nccl
