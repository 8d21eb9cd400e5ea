"""The pipeline timeline: a Gantt chart of every device's compute and messages."""

from __future__ import annotations

import os
from typing import Any

from shardplan.ir import Topology
from shardplan.report._png import format_bytes
from shardplan.simulate import SimulationResult

__all__ = ["COLORS", "timeline_figure", "timeline_png"]

COLORS = {
    "F": "#4C72B0",  # forward: blue
    "B": "#DD8452",  # backward: orange
    "I": "#E6A26E",  # input gradient (split backward): light orange
    "W": "#55A868",  # weight gradient (split backward): green
    "OPT": "#8C8C8C",  # optimizer step: grey
    "activation": "#64B5CD",  # sending activations: light blue
    "gradient": "#F3B183",  # sending gradients: light orange
    "allreduce": "#C44E52",  # ring all-reduce: red
}
_LABELS = {"F": "forward", "B": "backward", "I": "input gradient", "W": "weight gradient",
           "OPT": "optimizer step",
           "activation": "send activations", "gradient": "send gradients",
           "allreduce": "all-reduce"}


def _scale(seconds: float) -> tuple[float, str]:
    if seconds >= 1.0:
        return 1.0, "s"
    if seconds >= 1e-3:
        return 1e3, "ms"
    return 1e6, "us"


def timeline_figure(result: SimulationResult, *, topology: Topology | None = None,
                    title: str | None = None) -> Any:
    """A matplotlib Figure: one row per device used, compute bars on top (forward,
    backward, optimizer; micro-batch numbers inside when they fit) and the messages it
    sends below (activations, gradients, all-reduce chunks), time in s/ms/us."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    devs = result.devices
    row = {d: i for i, d in enumerate(devs)}
    end = max(result.iteration_seconds, 1e-30)
    mult, unit = _scale(end)
    height = 1.2 + 0.42 * len(devs)
    fig, ax = plt.subplots(figsize=(13, min(height, 40)), dpi=110)
    stage_of: dict[int, list[str]] = {d: [] for d in devs}
    r = result.num_replicas
    for iv in result.intervals:
        if iv.kind in ("F", "B", "I", "W") and f"s{iv.stage}" not in stage_of[iv.device]:
            stage_of[iv.device].append(f"s{iv.stage}")
    bars: dict[str, list[tuple[float, float, float]]] = {}
    texts: list[tuple[float, float, str]] = []
    min_text = end * mult / 70
    for iv in result.intervals:
        y = row[iv.device]
        x0, w = iv.start * mult, (iv.end - iv.start) * mult
        if iv.kind in ("F", "B", "I", "W", "OPT"):
            bars.setdefault(iv.kind, []).append((x0, w, y - 0.38))
            if iv.microbatch is not None and w >= min_text:
                label = str(iv.microbatch) if len(stage_of[iv.device]) == 1 \
                    else f"{iv.stage}.{iv.microbatch}"
                texts.append((x0 + w / 2, y - 0.18, label))
        else:
            bars.setdefault(iv.kind, []).append((x0, w, y + 0.06))
    for kind, items in bars.items():
        h = 0.4 if kind in ("F", "B", "I", "W", "OPT") else 0.3
        for x, w, y0 in items:
            ax.add_patch(plt.Rectangle((x, y0), max(w, end * mult * 1e-4), h,
                                       facecolor=COLORS[kind], edgecolor="white",
                                       linewidth=0.4))
    for x, y, t in texts:
        ax.text(x, y, t, ha="center", va="center", fontsize=7, color="white")
    names = []
    for d in devs:
        dev_name = topology.devices[d].name if topology is not None else f"device {d}"
        stages = ",".join(stage_of[d]) or "-"
        names.append(f"{dev_name} [{stages}]  ")
    ax.set_yticks(range(len(devs)), names, fontsize=8)
    ax.set_ylim(len(devs) - 0.5, -0.6)
    ax.set_xlim(0, end * mult * 1.01)
    ax.set_xlabel(f"time ({unit})")
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    for i in range(len(devs)):
        ax.text(end * mult * 1.005, i - 0.18, format_bytes(result.peak_memory_bytes[i]),
                fontsize=6.5,
                va="center", ha="left", color="#555555", clip_on=False)
    head = title or "pipeline timeline"
    ax.set_title(f"{head}\n{result.schedule.name}, {result.num_microbatches} micro-batches, "
                 f"{result.schedule.num_stages} stages x {r} replicas: "
                 f"{result.iteration_seconds * mult:.3g} {unit}/iteration, bubble "
                 f"{result.bubble_fraction:.0%}", fontsize=10)
    kinds = [k for k in COLORS if k in bars]
    ax.legend(handles=[Patch(color=COLORS[k], label=_LABELS[k]) for k in kinds],
              loc="upper center", bbox_to_anchor=(0.5, -0.5 / height - 0.06), ncol=len(kinds),
              fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def timeline_png(result: SimulationResult, path: str | os.PathLike[str], *,
                 topology: Topology | None = None, title: str | None = None) -> None:
    """Write :func:`timeline_figure` as a PNG, atomically."""
    from shardplan.report._png import save_png

    save_png(timeline_figure(result, topology=topology, title=title), path)
