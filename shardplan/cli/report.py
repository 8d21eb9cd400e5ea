"""``shardplan report PLAN GRAPH TOPO -o report.html``: a plan's numbers and pictures."""

from __future__ import annotations

import argparse
import sys

from shardplan.cli._common import add_plan_inputs, declare_files, load_plan_inputs, print_json
from shardplan.cli.simulate import add_simulation_options, simulation_kwargs

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``report`` command to ``sub``."""
    p = sub.add_parser(
        "report", help="write an HTML report of a plan",
        description="Simulate PLAN and write one self-contained HTML file with its numbers, "
                    "the pipeline timeline, the partitioned graph (stages as boxes) and the "
                    "topology's bandwidth heat map with the mapping drawn on it.")
    add_plan_inputs(p)
    add_simulation_options(p)
    p.add_argument("-o", "--output", metavar="FILE.html", required=True,
                   help="where to write the report (atomically)")
    p.add_argument("--png-dir", metavar="DIR", help="also write the pictures here as PNGs")
    p.add_argument("--json", action="store_true", help="print what was written as JSON")
    declare_files(p, inputs=("plan", "graph", "topology", "schedule_file"),
                  outputs=("output",))
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from shardplan.report import write_report

    plan, graph, topology = load_plan_inputs(args)
    out = write_report(plan, graph, topology, args.output, png_dir=args.png_dir,
                       **simulation_kwargs(args, plan, graph))
    if args.json:
        print_json(out)
    else:
        sys.stdout.write(f"wrote report to {args.output} (simulated "
                         f"{out['iteration_seconds'] * 1e3:.3f} ms per iteration, "
                         f"{out['throughput']:.4g} samples/s)\n")
    return 0
