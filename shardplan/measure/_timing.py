"""What every measurement of a rank shares: its sizes and counts, and how a set of timings
becomes one number (:func:`typical_seconds`, :func:`median_seconds`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["median_seconds", "typical_seconds"]

#: Tiny layer blocks per timed run, and graph operators per block (the per-operator
#: overheads).
BLOCKS = 4
BLOCK_OPS = 7
#: FSDP units of the per-gather overhead's model.
UNITS = 4
#: Features of the wide FSDP units (1 MiB of parameters each), for the per-byte cost (at
#: 256 KiB the cost per byte was lost in the noise: 0 to 1.9 ns across four measurements).
FSDP_WIDE = 512
#: Micro-batches of the pipelining per-action overhead's schedule.
PIPE_MICROBATCHES = 8
#: Collective calls timed one after another per measurement (see :func:`_collectives`).
BACK_TO_BACK = 4
#: Timed measurements of a message or collective at least (whatever ``repeats`` says):
#: enough for :func:`typical_seconds` to drop the slowest and the fastest.
COMM_SAMPLES = 10
#: Share of the timings :func:`typical_seconds` drops at each end.
TRIM = 0.1
#: Forward and backward passes of the larger blocks per busy-slowdown kernel, and rounds.
BUSY_STEPS = 2
BUSY_ROUNDS = 15
#: ``(samples, positions, features)`` of the two programs of :func:`_dtensor_program`.
DT_SIZES = ((4, 4, 16), (8, 32, 128))
#: Messages per round, and their bytes, of the CPU share of transfers.
CPU_GROUPS = 8
CPU_MESSAGE = 1 << 20
#: Computations per run, rounds and the all-gather's bytes of :func:`_host_sync`.
SYNC_PIECES = 4
SYNC_ROUNDS = 10
SYNC_BYTES = 1 << 16


def typical_seconds(times: Any) -> float:
    """What a transfer or collective typically costs inside a training step: the mean of
    ``times`` without the :data:`TRIM` share of the slowest and of the fastest
    (``scipy.stats.trim_mean``; all of them below 10). A step adds up many of them, so the
    mean is what it pays, not the median: gloo's all-reduce of 64 KiB takes 0.3 ms in
    most calls here and about 1.8 ms in a quarter of them (the median of five read 0.34 ms
    in one measurement and 1.9 ms in the next), and the median hides the slow quarter;
    trimming keeps one preempted call from setting the figure. O(n log n).

    Examples
    --------
    >>> round(typical_seconds([0.3, 0.3, 0.3, 1.8]), 3)  # the median would say 0.3
    0.675
    >>> round(typical_seconds([1.0] * 9 + [50.0]), 3)  # one preempted call of ten dropped
    1.0
    """
    from scipy.stats import trim_mean

    values = np.asarray(times, dtype=np.float64).reshape(-1)
    if values.size == 0:
        raise ValueError("no timings")
    return float(trim_mean(values, TRIM))


def median_seconds(fn: Callable[[], Any], sync: Callable[[], None], repeats: int,
                    warmup: int, dist: Any, active: bool = True) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls after ``warmup``, every rank
    starting each call together (a barrier first); ranks with ``active`` False only join
    the barriers (0.0)."""
    import statistics

    times = []
    for it in range(warmup + repeats):
        dist.barrier()
        if not active:
            continue
        t0 = time.perf_counter()
        fn()
        sync()
        if it >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) if times else 0.0
