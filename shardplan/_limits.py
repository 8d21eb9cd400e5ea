"""The largest size of each kind a user can give, and why (issue 46: sizes bounded before
work).

Every size a user writes (a model's layers, hidden width, heads, vocabulary and sequence; a
batch, micro-batch and micro-batch count; devices, memory, bandwidth and FLOP/s) is checked
once, where it is read and before any capture, import or search, by :func:`check_size`,
which names the flag or key the user wrote and says why the limit is where it is. The
limits are far above any published training run; what they keep out are sizes the planner
cannot represent (float64 byte counts are exact below 2^53) or that would take this
machine's memory or minutes of work before the first line of output (capture traces every
layer; the simulator runs every micro-batch of every stage).
"""

from __future__ import annotations

import math
from typing import Any

from shardplan.errors import ShardplanError

__all__ = ["LIMITS", "check_size", "parse_count"]

#: kind -> (largest value, why). Sizes are counts (ints) except memory, bandwidth, flops.
LIMITS: dict[str, tuple[float, str]] = {
    "layers": (1024, "capture traces every layer (about 20 operators, 0.15 s and 14 MB of "
                     "this machine's memory each); the deepest published models have under "
                     "200"),
    "width": (2**20, "a weight matrix of that width has 2^40 elements; the widest published "
                     "models use 25,600"),
    "heads": (2**16, "the widest published models use 128 attention heads"),
    "vocab": (2**24, "the largest published vocabularies have about 256,000 tokens"),
    "sequence": (2**24, "16M tokens per sample; the longest published contexts are 1-10M"),
    "batch": (2**24, "16M samples per iteration; published runs use at most a few thousand"),
    "tokens": (2**40, "a trillion tokens per step; published runs use tens of millions"),
    "microbatches": (2**16, "the simulator runs every micro-batch of every stage: "
                            "65,536 of them on 4 stages take 20 s per simulation, and plan "
                            "simulates hundreds"),
    "devices": (32768, "plan and simulate price every pipeline rank and collective group "
                       "of the cluster"),
    "degree": (32768, "a degree of parallelism is at most the devices plan searches"),
    "memory": (2.0**53, "byte counts above 2^53 (8 PiB) are not exact in the float64 the "
                        "planner computes in"),
    "bandwidth": (1e15, "1 PB/s per link, about 500 times the fastest link built"),
    "flops": (1e18, "1 EFLOP/s per device, about 500 times the fastest accelerator built"),
}


#: What a size of each kind counts, for the message.
_UNIT = {"layers": "layers", "width": "wide", "heads": "heads", "vocab": "tokens",
         "sequence": "tokens", "batch": "samples", "tokens": "tokens",
         "microbatches": "micro-batches", "devices": "devices", "degree": "ranks",
         "memory": "bytes", "bandwidth": "bytes/s", "flops": "FLOP/s"}


def _show(value: float) -> str:
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:.4g}"


def check_size(name: str, value: Any, kind: str) -> Any:
    """``value`` when it is at most the limit of ``kind`` (:data:`LIMITS`), else one line
    naming ``name`` (the flag or key the user wrote: ``--num-layers``, ``layers=``; empty
    where argparse names the flag), the limit and why.

    Examples
    --------
    >>> check_size("--num-layers", 96, "layers")
    96
    >>> check_size("--num-layers", 10**9, "layers")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    shardplan.errors.ShardplanError: --num-layers 1,000,000,000 is above the 1,024 layers ...
    """
    limit, why = LIMITS[kind]
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        v = math.inf
    if not v <= limit:  # NaN too
        shown = _show(v) if math.isfinite(v) else str(value)
        what = f"{name}{shown}" if not name or name.endswith("=") else f"{name} {shown}"
        raise ShardplanError(f"{what} is above the {_show(limit)} {_UNIT[kind]} shardplan "
                             f"plans for: {why}")
    return value


def parse_count(name: str, text: Any, kind: str, minimum: int = 1) -> int:
    """An integer a user wrote (``24``, ``1e3`` is refused as not an integer), at least
    ``minimum`` and within :data:`LIMITS` for ``kind``; one line naming ``name`` otherwise."""
    try:
        v = int(str(text).strip())
    except ValueError:
        raise ShardplanError(f"{name} takes an integer, got {text!r}") from None
    if v < minimum:
        raise ShardplanError(f"{name} must be >= {minimum}, got {v}")
    return int(check_size(name, v, kind))
