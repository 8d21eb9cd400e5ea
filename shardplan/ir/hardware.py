"""What precision a topology's devices have the hardware for (issue 46): fp8 needs fp8 tensor
cores (a device declaring ``fp8_flops``: H100), bf16 needs bf16 units (not V100, whose tensor
cores do fp16 only). ``import``, ``plan`` and ``simulate`` check it alike, before any work,
with the same one line."""

from __future__ import annotations

from typing import Any

from shardplan.errors import ShardplanError

__all__ = ["NO_BF16", "check_precision"]

#: Device types without bf16 arithmetic (Volta's tensor cores do fp16 only).
NO_BF16 = frozenset({"v100", "p100", "t4"})


def check_precision(topology: Any, precision: str) -> None:
    """Raise one line when a device of ``topology`` cannot train in ``precision``."""
    for d in topology.devices:
        kind = d.extra.get("type")
        name = f"{d.name!r}{f' ({kind})' if kind else ''}"
        if precision == "fp8" and not float(d.extra.get("fp8_flops") or 0) > 0:
            raise ShardplanError(f"precision fp8 needs fp8 tensor cores (H100), and device "
                                 f"{name} has none: use bf16")
        if precision == "bf16" and kind in NO_BF16:
            raise ShardplanError(f"precision bf16 needs bf16 units, and device {name} has "
                                 f"none (its tensor cores do fp16 only): use fp16")
