"""One self-contained HTML report of a plan: its numbers and the three pictures."""

from __future__ import annotations

import base64
import html
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from shardplan.ir import Graph, Plan, Topology, write_atomic
from shardplan.report._png import plan_label
from shardplan.simulate import SimulationResult, simulate

__all__ = ["report_html", "write_report"]

_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1250px; color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.5em 0; }
td, th { border: 1px solid #ddd; padding: 3px 9px; text-align: right; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.5em 0; }
.bad { color: #b00020; font-weight: bold; } .note { color: #666; font-size: 0.85em; }
"""


def _img(png: bytes, alt: str) -> str:
    return (f'<img alt="{html.escape(alt)}" src="data:image/png;base64,'
            f'{base64.b64encode(png).decode()}">')


def _table(head: list[str], rows: list[list[Any]], left: int = 1) -> str:
    out = ["<table><tr>"]
    out += [f'<th class="{"l" if i < left else ""}">{html.escape(h)}</th>'
            for i, h in enumerate(head)]
    out.append("</tr>")
    for row in rows:
        out.append("<tr>" + "".join(
            f'<td class="{"l" if i < left else ""}">{c if str(c).startswith("<") else html.escape(str(c))}</td>'  # noqa: E501
            for i, c in enumerate(row)) + "</tr>")
    out.append("</table>")
    return "".join(out)


def _ms(s: float) -> str:
    return f"{s * 1e3:.4g}"


def _gib(b: float) -> str:
    return f"{b / 2**30:.3g}"


def report_html(plan: Plan, graph: Graph, topology: Topology, result: SimulationResult, *,
                pictures: dict[str, bytes],
                ranking: Sequence[Mapping[str, Any]] | None = None) -> str:
    """The report as one HTML string (PNG pictures embedded as base64); ``ranking``: the
    rows of a ``shardplan plan`` search, shown as a table before the winner's details."""
    from shardplan.cost._max_stage import plan_stage_times
    from shardplan.ir import ExecutionSettings

    esc = html.escape
    obj = plan.objective
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>shardplan report: "
             f"{esc(plan.graph)} on {esc(plan.topology)}</title><style>{_CSS}</style></head>"
             "<body>",
             f"<h1>{esc(graph.name)} on {esc(topology.name)}: {esc(plan_label(plan))} plan</h1>"]
    lb = "-" if obj.lower_bound is None else f"{obj.lower_bound:.6g}"
    parts.append(_table(["plan", ""], [
        ["algorithm", plan_label(plan)], ["status", plan.status],
        ["objective", f"{obj.name} = {obj.value:.6g} (lower bound {lb})"],
        ["search seconds", f"{plan.search_seconds:.3g}"], ["seed", plan.seed],
        ["stages x replicas", f"{plan.num_stages} x {plan.num_replicas}"],
        ["graph", f"{graph.num_nodes} operators, {graph.num_edges} edges, captured at "
                  f"batch {graph.batch_size}"],
        ["topology", f"{topology.num_devices} devices"],
    ]))
    if ranking:
        parts.append("<h2>Candidates, ranked by the simulator</h2>")
        rows = [[i + 1, r["family"], f"{r['stages']} x {r['replicas']}", r["schedule"],
                 r["microbatches"], r["mapping"], r["gradient_sync"],
                 _ms(r["iteration_seconds"]) if r["fits"] else
                 f'<span class="bad">{_ms(r["iteration_seconds"])}</span>',
                 f"{r['throughput']:.5g}", _gib(r["peak_memory_bytes"]),
                 f"{r['search_seconds']:.3g}"] for i, r in enumerate(ranking)]
        parts.append(_table(["rank", "family", "stages x replicas", "schedule",
                             "micro-batches", "mapping", "gradient sync", "ms / iteration",
                             "samples/s", "peak GiB", "search s"], rows, left=2))
    fits = "yes" if result.fits_memory else '<span class="bad">NO</span>'
    parts.append("<h2>Simulated iteration</h2>")
    parts.append(_table(["simulation", ""], [
        ["schedule", f"{result.schedule.name}, {result.num_microbatches} micro-batches of "
                     f"{(result.options or {}).get('microbatch_size', '?')} samples"
                     f"{_recompute_text((result.options or {}).get('recompute'))}"],
        ["iteration", f"{_ms(result.iteration_seconds)} ms"],
        ["throughput", f"{result.throughput:.5g} samples/s"],
        ["bubble fraction", f"{result.bubble_fraction:.1%}"],
        ["pipeline (to the last backward)", f"{_ms(result.pipeline_seconds)} ms"],
        ["bubble-free ideal", f"{_ms(result.ideal_seconds)} ms"],
        ["optimizer step", f"{_ms(result.optimizer_seconds)} ms"],
        ["fits in memory", fits],
    ]))
    settings = ExecutionSettings.from_dict(result.options or {})
    times = plan_stage_times(plan, graph, topology, settings) if plan.strategy is None \
        else None
    rows = []
    for pos, s in enumerate(result.stage_order):
        st = plan.stages[s]
        comp = "-" if times is None else _ms(float(times.compute[s].max()))
        rows.append([pos, s, len(st.nodes), ",".join(map(str, st.devices)), comp,
                     _ms(result.allreduce_seconds[pos])])
    parts.append("<h2>Stages</h2>")
    parts.append(_table(["pipeline stage", "plan stage", "operators", "devices",
                         "fwd+bwd per micro-batch (ms)", "all-reduce (ms)"], rows, left=0))
    rows = []
    for i, d in enumerate(result.devices):
        ok = result.peak_memory_bytes[i] <= result.memory_capacity_bytes[i]
        peak = _gib(result.peak_memory_bytes[i])
        rows.append([topology.devices[d].name, d, _ms(result.busy_seconds[i]),
                     peak if ok else f'<span class="bad">{peak}</span>',
                     _gib(result.memory_capacity_bytes[i])])
    parts.append("<h2>Devices</h2>")
    parts.append(_table(["device", "id", "busy (ms)", "peak memory (GiB)",
                         "capacity (GiB)"], rows))
    captions = {"timeline": "Pipeline timeline: compute (top of each row) and the messages "
                            "each device sends (bottom); peak memory on the right.",
                "graph": "The partitioned graph: stages as boxes.",
                "bandwidth": "Bandwidth between devices, with the mapping drawn on it."}
    for key, png in pictures.items():
        parts.append(f"<h2>{esc(key.capitalize())}</h2><p class='note'>"
                     f"{esc(captions.get(key, ''))}</p>{_img(png, key)}")
    parts.append(f"<p class='note'>written by shardplan report at "
                 f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}</p></body></html>")
    return "\n".join(parts)


def write_report(plan: Plan, graph: Graph, topology: Topology,
                 path: str | os.PathLike[str], *, result: SimulationResult | None = None,
                 png_dir: str | os.PathLike[str] | None = None,
                 ranking: Sequence[Mapping[str, Any]] | None = None,
                 **simulate_options: Any) -> dict[str, Any]:
    """Simulate ``plan`` (unless ``result`` is given), draw the timeline, the partitioned
    graph and the bandwidth heat map, and write one self-contained HTML file to ``path``
    atomically. With ``png_dir``, the pictures are also written there as PNG files.

    Returns what was written: ``{"html": path, "pngs": {...}, "graph_drawer": ...}`` plus
    the simulation's numbers.
    """
    from pathlib import Path

    from shardplan.report._bandwidth import bandwidth_figure
    from shardplan.report._graph import graph_figure, graphviz_png
    from shardplan.report._png import png_bytes
    from shardplan.report._timeline import timeline_figure

    if result is None:
        result = simulate(plan, graph, topology, **simulate_options)
    title = f"{graph.name} on {topology.name}: {plan_label(plan)}"
    pictures = {"timeline": png_bytes(timeline_figure(result, topology=topology, title=title))}
    drawer = "stages"
    if graph.num_nodes <= 60:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            if graphviz_png(plan, graph, Path(tmp) / "g.png"):
                pictures["graph"] = (Path(tmp) / "g.png").read_bytes()
                drawer = "graphviz"
        if drawer != "graphviz":
            drawer = "operators"
    if "graph" not in pictures:
        pictures["graph"] = png_bytes(graph_figure(plan, graph, topology))
    pictures["bandwidth"] = png_bytes(bandwidth_figure(topology, plan, graph))
    pngs = {}
    if png_dir is not None:
        for key, png in pictures.items():
            out = Path(png_dir) / f"{key}.png"
            write_atomic(out, png)
            pngs[key] = str(out)
    text = report_html(plan, graph, topology, result, pictures=pictures, ranking=ranking)
    write_atomic(path, text)
    return {"html": str(path), "pngs": pngs, "graph_drawer": drawer,
            **result.to_dict()}


def _recompute_text(value: object) -> str:
    """``, recompute full`` (or ``selective``) for a simulation's ``recompute`` option, ``''``
    for none; ``True`` / ``False`` from results written before the three values."""
    if value is True:
        value = "full"
    return f", recompute {value}" if value not in (None, False, "none") else ""
