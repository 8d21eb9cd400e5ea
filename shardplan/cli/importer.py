"""``shardplan import KIND FILE``: turn another tool's profile into a graph.

The module is named ``importer`` because ``import`` is a Python keyword; the command is
``import``.
"""

from __future__ import annotations

import argparse

from shardplan.cli._common import OneLineParser, add_output, declare_files, emit, note, positive_int
from shardplan.importers import load_pipedream

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``import`` command (with its kinds as sub-commands) to ``sub``."""
    p = sub.add_parser("import", help="import a graph from another tool's profile (pipedream)",
                       description="Import a computation graph from another tool's format.")
    kinds = p.add_subparsers(dest="import_kind", metavar="KIND", parser_class=OneLineParser)
    kinds.required = True
    pd = kinds.add_parser(
        "pipedream", help="a PipeDream / DAPPLE / Piper profile (graph.txt)",
        description="Import a PipeDream profile: lines 'nodeN -- description -- "
                    "forward_compute_time=MS, backward_compute_time=MS, activation_size=BYTES, "
                    "parameter_size=BYTES [-- stage_id=S]' and tab-indented edge lines "
                    "'nodeA -- nodeB'. Measured times become the nodes' fwd_seconds and "
                    "bwd_seconds; FLOPs are left at 0. As PipeDream's optimizer does, the "
                    "Input (data loading) sources and trailing __getitem__ sinks are dropped "
                    "(listed by 'shardplan inspect'); --keep-inputs keeps them.")
    pd.add_argument("profile", metavar="GRAPH_TXT", help="the profile file")
    pd.add_argument("--name", help="graph name (default: the file name without extension)")
    pd.add_argument("--batch-size", type=positive_int, default=1,
                    help="batch size the profile was taken at (not in the file; default 1)")
    pd.add_argument("--keep-inputs", action="store_true",
                    help="keep the Input sources and __getitem__ sinks that PipeDream's "
                         "optimizer removes")
    add_output(pd)
    declare_files(pd, inputs=("profile",), outputs=("output",))
    pd.set_defaults(handler=_run_pipedream)


def _run_pipedream(args: argparse.Namespace) -> int:
    graph = load_pipedream(args.profile, name=args.name, batch_size=args.batch_size,
                           keep_inputs=args.keep_inputs)
    dropped = graph.meta.get("dropped_on_import") or []
    if dropped and not args.json:
        names = ", ".join(f"{d['name']} ({d['description'][:20]})" for d in dropped[:4])
        more = f" and {len(dropped) - 4} more" if len(dropped) > 4 else ""
        note(f"dropped {len(dropped)} node(s) as PipeDream's optimizer does: {names}{more} "
             "(--keep-inputs keeps them)")
    emit(args, graph, what="graph")
    return 0
