"""``shardplan inspect FILE``: validate any contract file and summarise it."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from shardplan.cli._common import declare_files, positive_int, print_json
from shardplan.errors import ShardplanError
from shardplan.ir import Graph, Plan, Topology, load, load_graph, load_topology


def summarize(obj: Graph | Topology | Plan, *, devices: int | None = None,
              graph: Graph | None = None, topology: Topology | None = None) -> dict[str, Any]:
    """The summary ``shardplan inspect`` prints, as a dict.

    Graphs get ``parameters`` (tied weights once), the model's ``transformer`` dimensions
    when capture recorded them, and lower bounds for ``devices`` devices (default: 1, 8 and
    64). Plans are checked
    against ``graph``/``topology`` when given.
    """
    out = obj.summary()
    if isinstance(obj, Graph):
        out["parameters"] = _parameters(obj)
        if isinstance(obj.meta.get("transformer"), dict):
            out["transformer"] = dict(obj.meta["transformer"])
        counts = [devices] if devices else [1, 8, 64]
        measured = _measured_work(obj)
        if measured is not None:
            out["lower_bounds_seconds"] = {str(d): _bounds(measured[0], d) for d in counts}
            if measured[1]:
                out["unmeasured_nodes"] = measured[1]
        if measured is None or measured[1] or float(obj.fwd_flops.sum()) > 0:
            out["lower_bounds_flops"] = {str(d): obj.lower_bounds(d) for d in counts}
        dropped = obj.meta.get("dropped_on_import")
        if dropped:
            out["dropped_on_import"] = [
                f"{d.get('name')} ({d.get('description')}: {d.get('reason')}, "
                f"{1e3 * (d.get('fwd_seconds', 0) + d.get('bwd_seconds', 0)):.3g} ms)"
                for d in dropped]
    if isinstance(obj, Plan):
        if graph is not None:
            obj.validate(graph, topology)
            out["checked_against"] = {"graph": graph.name,
                                      "topology": None if topology is None else topology.name}
            stage_flops = [float((graph.fwd_flops[list(s.nodes)] + graph.bwd_flops[
                list(s.nodes)]).sum()) for s in obj.stages]
            out["stage_flops"] = stage_flops
            measured = _measured_work(graph)
            if measured is not None:  # what a profile knows: measured seconds per stage
                out["stage_measured_seconds"] = [float(measured[0][list(s.nodes)].sum())
                                                 for s in obj.stages]
            a = obj.assignment(graph.num_nodes)
            from shardplan.cost import stage_traffic

            out["inter_stage_bytes"] = float(stage_traffic(graph, a, obj.num_stages)[0].sum())
            out["stage_graph_acyclic"] = graph.is_acyclic_partition(a)
            if obj.strategy is not None:
                out.update(_check_strategy(obj, graph, topology))
        elif topology is not None:
            raise ShardplanError("checking a plan against a topology needs --graph too")
    return out


def _parameters(graph: Graph) -> int:
    """Total parameters, a tied weight once: what capture recorded (``meta["parameters"]``),
    else the nodes' ``weight`` (each parameter counted at the node that owns it)."""
    recorded = graph.meta.get("parameters")
    if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded >= 0:
        return recorded
    return int(round(float(graph.weight.sum())))


def _measured_work(graph: Graph) -> tuple[np.ndarray, int] | None:
    """Forward + backward measured seconds per node and how many nodes lack them (counted
    as 0), or None when the graph has no measured times."""
    if graph.fwd_seconds is None and graph.bwd_seconds is None:
        return None
    n = graph.num_nodes
    f = np.full(n, np.nan) if graph.fwd_seconds is None else graph.fwd_seconds
    b = np.full(n, np.nan) if graph.bwd_seconds is None else graph.bwd_seconds
    missing = int(np.count_nonzero(np.isnan(f) & np.isnan(b)))
    return np.nan_to_num(f) + np.nan_to_num(b), missing


def _bounds(work: np.ndarray, devices: int) -> dict[str, float]:
    """The two makespan bounds of :meth:`Graph.lower_bounds`, on ``work``."""
    total = float(work.sum())
    largest = float(work.max()) if work.size else 0.0
    return {"average": total / devices, "largest_node": largest,
            "bound": max(total / devices, largest)}


def _check_strategy(plan: Plan, graph: Graph, topology: Topology | None) -> dict[str, Any]:
    """Check a plan's per-layer ``strategy`` against the graph: node ids it names, one split
    factor (a positive integer) per dimension of each node's space; with the topology too,
    every configuration must be one the strategy search allows there (its cost is then
    reported). One-line :class:`ShardplanError` otherwise."""
    from shardplan.strategy.tables import graph_spaces

    assert plan.strategy is not None  # called for plans that carry one
    spaces = graph_spaces(graph)
    n = graph.num_nodes
    for key, factors in plan.strategy.items():
        if not key.isdigit() or int(key) >= n:
            raise ShardplanError(f"the plan's strategy names node {key!r}, which the graph "
                                 f"({n} nodes) does not have")
        v = int(key)
        dims = spaces[v].dims
        if len(factors) != len(dims):
            raise ShardplanError(f"the plan's strategy gives node {v} ({graph.names[v]!r}) "
                                 f"{len(factors)} split factors, its space has {len(dims)} "
                                 f"dimensions ({', '.join(dims)})")
        if any(f < 1 for f in factors):
            raise ShardplanError(f"the plan's strategy gives node {v} ({graph.names[v]!r}) a "
                                 f"split factor below 1: {tuple(factors)}")
    if topology is None:
        return {}
    from shardplan.objectives import evaluate

    name, value, _ = evaluate(plan, graph, topology, "strategy")
    return {"strategy_objective": name, "strategy_value": value}


def _fmt(v: float) -> str:
    for unit, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{unit}"
    return f"{v:.3g}"


def _print_text(s: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    kind = s["kind"]
    table = Table(title=f"{kind} {s.get('name', s.get('algorithm', ''))!s}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for key, val in s.items():
        if key in ("kind",):
            continue
        if isinstance(val, float) or (isinstance(val, int) and not isinstance(val, bool)
                                      and abs(val) >= 1e6):
            text = _fmt(float(val))
        elif isinstance(val, dict) and key == "lower_bounds_flops":
            text = "; ".join(f"D={d}: {_fmt(b['bound'])} FLOP (avg {_fmt(b['average'])}, "
                             f"largest node {_fmt(b['largest_node'])})" for d, b in val.items())
        elif isinstance(val, dict) and key == "lower_bounds_seconds":
            text = "; ".join(f"D={d}: {b['bound']:.4g} s (avg {b['average']:.4g} s, "
                             f"largest node {b['largest_node']:.4g} s)" for d, b in val.items())
        elif key == "dropped_on_import":
            text = "; ".join(val)
        elif isinstance(val, list) and val and isinstance(val[0], dict) \
                and "bandwidth" in val[0]:
            if len(val) > 6:  # measured: every pair its own value
                text = (f"{len(val)} distinct values, {_fmt(val[-1]['bandwidth'])}B/s to "
                        f"{_fmt(val[0]['bandwidth'])}B/s")
            else:
                text = ", ".join(f"{_fmt(c['bandwidth'])}B/s x{c['pairs']}" for c in val)
        elif key == "latency_range":
            text = f"{val[0]:.3g} s to {val[1]:.3g} s"
        elif key == "levels":
            text = ", ".join(f"{lv['name']} ({lv['groups']} groups)" for lv in val) or "none"
        elif isinstance(val, list) and len(val) > 12:
            text = f"{len(val)} values: {', '.join(_fmt(x) if isinstance(x, float) else str(x) for x in val[:12])} ..."  # noqa: E501
        else:
            text = str(val)
        table.add_row(key, text)
    console.print(table)


def _handler(args: argparse.Namespace) -> int:
    obj = load(args.file)
    graph = load_graph(args.graph) if args.graph else None
    topo = load_topology(args.topology) if args.topology else None
    if not isinstance(obj, Plan) and (graph or topo):
        raise ShardplanError("--graph/--topology only apply when FILE is a plan")
    if args.devices and not isinstance(obj, Graph):
        raise ShardplanError("--devices only applies when FILE is a graph")
    summary = summarize(obj, devices=args.devices, graph=graph, topology=topo)
    if args.json:
        print_json(summary)
    else:
        _print_text(summary)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="validate and summarise a graph, topology or plan file",
                       description="Validate a shardplan graph, topology or plan file and "
                                   "summarise it: sizes, FLOPs, parameters and lower bounds; "
                                   "devices and bandwidth classes; stages and objective.")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--devices", type=positive_int, help="lower bounds for this many devices")
    p.add_argument("--graph", metavar="GRAPH", help="(plans) check the plan against this graph")
    p.add_argument("--topology", metavar="TOPO", help="(plans) ... and this topology")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    declare_files(p, inputs=("file", "graph", "topology"))
    p.set_defaults(handler=_handler)
