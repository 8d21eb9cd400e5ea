"""The partitioned graph as a picture: stages as boxes (paper 000, Figure 2).

Two drawings, chosen by size:

- **operators** (graphs of at most ``max_nodes`` nodes): every node inside its stage's box,
  laid out by topological level within the stage, edges between them; sources green and
  sinks red, each node labelled with its name and parameter count, as in paper 000's
  Figure 2. Graphviz ``dot`` draws it (clusters) when installed; matplotlib otherwise.
- **stages** (larger graphs, where a thousand operators would be ink): one box per stage in
  pipeline order with its devices, operator count, FLOPs, parameters, compute time and the
  first and last operator, arrows between stages labelled with the bytes they exchange.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

import numpy as np

from shardplan.cost import CostModel, stage_traffic
from shardplan.ir import Graph, Plan, Topology
from shardplan.report._png import plan_label

__all__ = ["graph_figure", "graph_png", "graphviz_png"]

_STAGE_COLORS = ("#dbe9f6", "#fde2cf", "#d9f0d3", "#f6d5e5", "#e8e0f3", "#fff3c4",
                 "#d4f1f4", "#efe4d6")


def _bytes(v: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if v >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{v:.0f} B"


def _count(v: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if v >= scale:
            return f"{v / scale:.3g}{unit}"
    return f"{v:.0f}"


def _order(graph: Graph, plan: Plan) -> tuple[int, ...]:
    from shardplan.simulate import stage_order

    return stage_order(graph, plan)


def graph_figure(plan: Plan, graph: Graph, topology: Topology | None = None, *,
                 max_nodes: int = 60) -> Any:
    """A matplotlib Figure of the partitioned graph (see the module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    if graph.num_nodes <= max_nodes:
        return _operator_figure(plan, graph)
    return _stage_figure(plan, graph, topology)


def _operator_figure(plan: Plan, graph: Graph) -> Any:
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    order = _order(graph, plan)
    a = plan.assignment(graph.num_nodes)
    level = graph.levels
    pos: dict[int, tuple[float, float]] = {}
    boxes = []
    x0 = 0.0
    for rank, s in enumerate(order):
        nodes = np.array(plan.stages[s].nodes, dtype=np.int64)
        lv = level[nodes]
        uniq = np.unique(lv)
        local = {int(v): i for i, v in enumerate(uniq)}
        width = 1
        cols: dict[int, int] = {}
        for v in nodes[np.argsort(lv, kind="stable")]:
            r = local[int(level[v])]
            c = cols.get(r, 0)
            cols[r] = c + 1
            width = max(width, c + 1)
            pos[int(v)] = (x0 + c * 2.2, -r * 1.0)
        boxes.append((rank, s, x0 - 1.1, -len(uniq) + 0.4, width * 2.2, len(uniq) + 0.2))
        x0 += width * 2.2 + 1.0
    height = max(b[5] for b in boxes) if boxes else 1.0
    fig, ax = plt.subplots(figsize=(min(2 + x0 * 0.9, 30), min(2 + height * 0.75, 30)), dpi=110)
    for rank, s, bx, by, bw, bh in boxes:
        ax.add_patch(FancyBboxPatch((bx, by), bw, bh, boxstyle="round,pad=0.05",
                                    facecolor=_STAGE_COLORS[rank % len(_STAGE_COLORS)],
                                    edgecolor="#555555", linewidth=1.2))
        devs = ",".join(map(str, plan.stages[s].devices))
        ax.text(bx + 0.1, by + bh + 0.05, f"stage {rank} (devices {devs})", fontsize=9,
                fontweight="bold", va="bottom")
    for u, v in zip(graph.src.tolist(), graph.dst.tolist(), strict=True):
        (x1, y1), (x2, y2) = pos[u], pos[v]
        cross = a[u] != a[v]
        ax.annotate("", xy=(x2, y2 + 0.27), xytext=(x1, y1 - 0.27),
                    arrowprops={"arrowstyle": "-|>", "color": "#c0392b" if cross else "#777777",
                                "lw": 1.3 if cross else 0.8, "shrinkA": 0, "shrinkB": 0})
    src, snk = graph.in_degree == 0, graph.out_degree == 0
    for v, (x, y) in pos.items():
        face = "#b7e4b0" if src[v] else "#f4a6a6" if snk[v] else "white"
        params = int(graph.param_bytes[v]) // 4
        label = graph.names[v] if len(graph.names[v]) <= 22 else graph.names[v][:21] + "~"
        if params:
            label += f"\n({_count(params)})"
        ax.text(x, y, label, ha="center", va="center", fontsize=6.5,
                bbox={"boxstyle": "round,pad=0.25", "facecolor": face, "edgecolor": "#333333",
                      "linewidth": 0.6})
    ax.set_xlim(-1.5, x0)
    ax.set_ylim(-height - 0.3, 1.2)
    ax.axis("off")
    ax.set_title(f"{graph.name}: {graph.num_nodes} operators in {plan.num_stages} stages "
                 f"({plan_label(plan)}); red edges cross stages, sources green, sinks red",
                 fontsize=10)
    fig.tight_layout()
    return fig


def _stage_figure(plan: Plan, graph: Graph, topology: Topology | None) -> Any:
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    order = _order(graph, plan)
    k = plan.num_stages
    a = plan.assignment(graph.num_nodes)
    traffic, _ = stage_traffic(graph, a, k)
    flops = np.bincount(a, weights=graph.fwd_flops + graph.bwd_flops, minlength=k)
    params = np.bincount(a, weights=graph.param_bytes.astype(np.float64), minlength=k)
    secs = None
    if topology is not None:
        cm = CostModel(graph, topology)
        comp = cm.compute_matrix(a, k)
        secs = [comp[s, plan.stages[s].devices[0]] / len(plan.stages[s].devices)
                for s in range(k)]
    per_row = k if k <= 8 else 6
    rows = -(-k // per_row)
    bw_, bh_, gap_x, gap_y = 3.0, 1.6, 1.3, 1.3
    fig, ax = plt.subplots(figsize=(1.0 + per_row * 3.3, 1.2 + rows * 2.9), dpi=110)
    centre: dict[int, tuple[float, float]] = {}
    for rank, s in enumerate(order):
        r, c = divmod(rank, per_row)
        x, y = c * (bw_ + gap_x), -r * (bh_ + gap_y)
        centre[s] = (x + bw_ / 2, y + bh_ / 2)
        ax.add_patch(FancyBboxPatch((x, y), bw_, bh_, boxstyle="round,pad=0.06",
                                    facecolor=_STAGE_COLORS[rank % len(_STAGE_COLORS)],
                                    edgecolor="#444444", linewidth=1.2))
        nodes = plan.stages[s].nodes
        first = min(nodes, key=lambda v: graph.topological_rank[v])
        last = max(nodes, key=lambda v: graph.topological_rank[v])
        devs = plan.stages[s].devices
        dev_text = ",".join(map(str, devs)) if len(devs) <= 6 else \
            f"{','.join(map(str, devs[:5]))},..."
        lines = [f"{len(nodes)} ops, {_count(flops[s])}FLOP",
                 f"params {_bytes(params[s])}"]
        if secs is not None:
            lines.append(f"compute {secs[s] * 1e3:.3g} ms / micro-batch")

        def short(v: int) -> str:
            name = graph.modules[v] or graph.names[v]
            return name if len(name) <= 26 else "~" + name[-25:]

        lines += [f"from {short(first)}", f"to {short(last)}"]
        ax.text(x + bw_ / 2, y + bh_ - 0.12, f"stage {rank}: devices {dev_text}",
                ha="center", va="top", fontsize=8.5, fontweight="bold")
        ax.text(x + bw_ / 2, y + bh_ - 0.42, "\n".join(lines), ha="center", va="top",
                fontsize=7.2, linespacing=1.35)
    low = -(rows - 1) * (bh_ + gap_y) - 0.3
    for s in range(k):
        for t in range(k):
            if traffic[s, t] <= 0:
                continue
            (x1, y1), (x2, y2) = centre[s], centre[t]
            adjacent = order.index(t) == order.index(s) + 1 and abs(y1 - y2) < 1e-9
            if adjacent:
                start, end, rad = (x1 + bw_ / 2, y1), (x2 - bw_ / 2, y2), 0.0
                lx, ly, va = (start[0] + end[0]) / 2, y1 + 0.08, "bottom"
            elif abs(y1 - y2) > 1e-9:  # to a later row: straight down, bottom to top
                start, end, rad = (x1, y1 - bh_ / 2), (x2, y2 + bh_ / 2), 0.0
                lx, ly, va = (x1 + x2) / 2 + 0.1, (y1 + y2) / 2, "center"
            else:  # same row, not adjacent: below the boxes, bending down by rad * dist / 2
                start, end, rad = (x1, y1 - bh_ / 2), (x2, y2 - bh_ / 2), 0.2
                dist = float(np.hypot(x2 - x1, y2 - y1))
                dip = min(y1, y2) - bh_ / 2 - rad * dist / 2
                lx, ly, va = (x1 + x2) / 2, dip - 0.05, "top"
                low = min(low, dip - 0.45)
            ax.annotate("", xy=end, xytext=start,
                        arrowprops={"arrowstyle": "-|>", "color": "#c0392b", "lw": 1.4,
                                    "shrinkA": 2, "shrinkB": 2,
                                    "connectionstyle": f"arc3,rad={rad}"})
            ax.text(lx, ly, _bytes(traffic[s, t]), ha="center", va=va, fontsize=7,
                    color="#c0392b", bbox={"facecolor": "white", "edgecolor": "none",
                                           "pad": 0.5})
    ax.set_xlim(-0.4, per_row * (bw_ + gap_x) - gap_x + 0.4)
    ax.set_ylim(low, bh_ + 0.3)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"{graph.name}: {graph.num_nodes} operators in {k} stages x "
                 f"{plan.num_replicas} replicas ({plan_label(plan)}); arrows: activation "
                 "bytes per micro-batch", fontsize=10)
    fig.tight_layout()
    return fig


def graphviz_png(plan: Plan, graph: Graph, path: str | os.PathLike[str]) -> bool:
    """Draw the operator-level picture with Graphviz ``dot`` (clusters per stage) when it is
    installed; returns False (and writes nothing) when it is not."""
    dot = shutil.which("dot")
    if dot is None:
        return False
    order = _order(graph, plan)
    lines = ["digraph G {", "  rankdir=TB; node [shape=box, fontsize=9, style=filled];"]
    src, snk = graph.in_degree == 0, graph.out_degree == 0
    for rank, s in enumerate(order):
        color = _STAGE_COLORS[rank % len(_STAGE_COLORS)]
        lines.append(f'  subgraph cluster_{rank} {{ label="stage {rank}"; style=filled; '
                     f'fillcolor="{color}";')
        for v in plan.stages[s].nodes:
            fill = "#b7e4b0" if src[v] else "#f4a6a6" if snk[v] else "white"
            params = int(graph.param_bytes[v]) // 4
            label = graph.names[v].replace('"', "'") + (f"\\n({_count(params)})" if params
                                                         else "")
            lines.append(f'    n{v} [label="{label}", fillcolor="{fill}"];')
        lines.append("  }")
    for u, v in zip(graph.src.tolist(), graph.dst.tolist(), strict=True):
        lines.append(f"  n{u} -> n{v};")
    lines.append("}")
    try:
        png = subprocess.run([dot, "-Tpng"], input="\n".join(lines).encode(),
                             capture_output=True, check=True, timeout=60).stdout
    except (subprocess.SubprocessError, OSError):
        return False
    from shardplan.ir import write_atomic

    write_atomic(path, png)
    return True


def graph_png(plan: Plan, graph: Graph, path: str | os.PathLike[str],
              topology: Topology | None = None, *, max_nodes: int = 60) -> str:
    """Write the partitioned-graph picture as a PNG; returns the drawer used
    (``graphviz``, ``operators`` or ``stages``)."""
    from shardplan.report._png import save_png

    if graph.num_nodes <= max_nodes and graphviz_png(plan, graph, path):
        return "graphviz"
    save_png(graph_figure(plan, graph, topology, max_nodes=max_nodes), path)
    return "operators" if graph.num_nodes <= max_nodes else "stages"
