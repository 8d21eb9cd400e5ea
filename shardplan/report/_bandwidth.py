"""The topology's bandwidth matrix as a heat map, with a plan's mapping drawn on it."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from shardplan.ir import Graph, Plan, Topology
from shardplan.report._png import plan_label

__all__ = ["bandwidth_figure", "bandwidth_png"]


def bandwidth_figure(topology: Topology, plan: Plan | None = None,
                     graph: Graph | None = None) -> Any:
    """A matplotlib Figure: ``bandwidth[i, j]`` in GB/s on a log colour scale, devices on
    both axes. With a plan, the stage (and replica) of every used device is written on the
    diagonal, the device pairs that carry activations between stages are outlined in black
    (each replica talks to the same replica of the next stage) and the pairs of each
    stage's all-reduce ring in white dashes; with the graph too, only the stage pairs that
    exchange tensors are outlined, else consecutive stages."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    d = topology.num_devices
    bw = np.array(topology.bandwidth, dtype=np.float64) / 1e9
    np.fill_diagonal(bw, np.nan)
    shown = np.where(bw > 0, bw, np.nan)
    size = min(4.0 + 0.32 * d, 16.0)
    fig, ax = plt.subplots(figsize=(size + 1.6, size), dpi=110)
    pos = shown[np.isfinite(shown)]
    norm = LogNorm(vmin=pos.min(), vmax=pos.max()) if pos.size and pos.min() < pos.max() \
        else None
    im = ax.imshow(shown, cmap="viridis", norm=norm, interpolation="nearest")
    cbar = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
    cbar.set_label("bandwidth (GB/s)")
    levels = np.unique(np.round(pos, 6)) if pos.size else np.array([])
    if 1 <= levels.size <= 10:
        cbar.set_ticks(levels.tolist(), labels=[f"{v:.4g}" for v in levels])
        cbar.minorticks_off()
    names = [dev.name for dev in topology.devices]
    fs = 8 if d <= 24 else 6 if d <= 48 else 4
    step = 1 if d <= 64 else int(np.ceil(d / 64))
    ax.set_xticks(range(0, d, step), [names[i] for i in range(0, d, step)], rotation=90,
                  fontsize=fs)
    ax.set_yticks(range(0, d, step), [names[i] for i in range(0, d, step)], fontsize=fs)
    ax.set_xlabel("to device")
    ax.set_ylabel("from device")
    handles = []
    if plan is not None:
        if graph is not None:
            from shardplan.simulate import stage_order

            order = stage_order(graph, plan)
            adj = graph.stage_adjacency(plan.assignment(graph.num_nodes), plan.num_stages)
            pairs = {(int(x), int(y)) for x, y in zip(*np.nonzero(adj), strict=True)}
        else:
            order = tuple(range(plan.num_stages))
            pairs = {(order[i], order[i + 1]) for i in range(len(order) - 1)}
        rank = {s: i for i, s in enumerate(order)}
        for s, st in enumerate(plan.stages):
            for i, dev in enumerate(st.devices):
                label = f"{rank[s]}" if len(st.devices) == 1 else f"{rank[s]}.{i}"
                ax.add_patch(Rectangle((dev - 0.5, dev - 0.5), 1, 1, facecolor="white",
                                       edgecolor="black", linewidth=0.8))
                ax.text(dev, dev, label, ha="center", va="center", fontsize=fs,
                        fontweight="bold")
        for s, t in sorted(pairs):
            for i in range(min(len(plan.stages[s].devices), len(plan.stages[t].devices))):
                u, v = plan.stages[s].devices[i], plan.stages[t].devices[i]
                for x, y in ((v, u), (u, v)):
                    ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False,
                                           edgecolor="black", linewidth=1.8))
        for st in plan.stages:
            ring = list(st.devices)
            if len(ring) < 2:
                continue
            for u, v in zip(ring, ring[1:] + ring[:1], strict=True):
                ax.add_patch(Rectangle((v - 0.5, u - 0.5), 1, 1, fill=False, edgecolor="white",
                                       linewidth=1.5, linestyle="--"))
        handles = [Line2D([], [], color="black", lw=2, label="activations/gradients between "
                          "stages"),
                   Line2D([], [], color="white", lw=2, ls="--", label="all-reduce ring"),
                   Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="black",
                             label="diagonal: stage[.replica] on the device")]
        leg = ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12 - (
            0.06 if d > 24 else 0.0)), ncol=1, fontsize=8, frameon=True)
        leg.get_frame().set_facecolor("#eeeeee")
    title = f"{topology.name}: bandwidth between {d} devices"
    if plan is not None:
        title += f"\nmapping of {plan.num_stages} stages x {plan.num_replicas} replicas " \
                 f"({plan_label(plan)})"
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def bandwidth_png(topology: Topology, path: str | os.PathLike[str], plan: Plan | None = None,
                  graph: Graph | None = None) -> None:
    """Write :func:`bandwidth_figure` as a PNG, atomically."""
    from shardplan.report._png import save_png

    save_png(bandwidth_figure(topology, plan, graph), path)
