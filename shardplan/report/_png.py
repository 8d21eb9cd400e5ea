"""Figures to PNG bytes and files (Agg backend, atomic writes)."""

from __future__ import annotations

import io
import os
from typing import Any

from shardplan.ir import write_atomic

__all__ = ["png_bytes", "save_png"]


def png_bytes(fig: Any) -> bytes:
    """Render ``fig`` as PNG and close it."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def save_png(fig: Any, path: str | os.PathLike[str]) -> None:
    """Write ``fig`` as a PNG file atomically."""
    write_atomic(path, png_bytes(fig))


def plan_label(plan: Any) -> str:
    """``parmesan + optimal map`` for a mapped plan (``meta["mapped_from"]``), else the
    plan's algorithm."""
    src = plan.meta.get("mapped_from") if isinstance(plan.meta, dict) else None
    if isinstance(src, dict) and src.get("algorithm"):
        return f"{src['algorithm']} + {plan.algorithm} map"
    return str(plan.algorithm)


def format_bytes(v: float) -> str:
    """Bytes in GiB, MiB or KiB, three significant digits."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{v:.0f} B"
