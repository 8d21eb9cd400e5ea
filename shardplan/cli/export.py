"""``shardplan export PLAN GRAPH TOPO --to FORMAT -o FILE``: a plan for another tool."""

from __future__ import annotations

import argparse
import os
import sys

from shardplan.cli._common import (
    add_plan_inputs,
    declare_files,
    load_plan_inputs,
    note,
    note_unused_devices,
)
from shardplan.cli.simulate import add_simulation_options, simulation_kwargs

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``export`` command to ``sub``."""
    from shardplan.export import FORMATS, TORCHTITAN_VERSIONS

    p = sub.add_parser(
        "export", help="write a plan in the form another tool reads",
        description="Write PLAN for torch.distributed.pipelining (split points by module "
                    "path, schedule CSV), torchtitan (a torchtitan 0.3.0 recipe module, its "
                    "flags and the schedule CSV beside it), Megatron-LM "
                    "(--pipeline-model-parallel-layout and sizes), "
                    "DeepSpeed (layer boundaries, partition_method) or as a Chrome trace of "
                    "the simulated iteration (Perfetto, chrome://tracing). A plan the format "
                    "cannot express ends in one line saying why (exit 2).")
    add_plan_inputs(p)
    p.add_argument("--to", required=True, choices=FORMATS, metavar="FORMAT",
                   help=f"one of {', '.join(FORMATS)}")
    p.add_argument("--exact-split", action="store_true",
                   help="refuse a plan whose stage starts where the format cannot split "
                        "(inside a module for torch, a layer for the others) instead of "
                        "moving that start to the nearest place it can, with a note")
    p.add_argument("--torchtitan-version", choices=TORCHTITAN_VERSIONS, default="current",
                   help="current: a torchtitan 0.3.0 recipe module (--module FILE --config "
                        "shardplan_plan) and FILE.flags; 0.2: the TOML of torchtitan <= 0.2.2")
    p.add_argument("--torchtitan-base", default="MODULE:FUNCTION", metavar="MODULE:FUNCTION",
                   type=_module_function,
                   help="the recipe of your model that the torchtitan recipe starts from")
    add_simulation_options(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="write it here")
    declare_files(p, inputs=("plan", "graph", "topology", "schedule_file"),
                  outputs=("output",))
    p.set_defaults(handler=_run)


def _module_function(text: str) -> str:
    """``MODULE:FUNCTION`` with a dotted Python module and an identifier (what the recipe
    imports and calls)."""
    module, colon, function = text.partition(":")
    if not colon or not function.isidentifier() or \
            not all(part.isidentifier() for part in module.split(".")):
        raise argparse.ArgumentTypeError(
            f"expected MODULE:FUNCTION (a dotted module and a function in it, as "
            f"torchtitan.models.llama3.config_registry:llama3_8b), got {text!r}")
    return text


def _run(args: argparse.Namespace) -> int:
    from shardplan.export import ExportOptions, export
    from shardplan.ir import write_atomic
    from shardplan.ir.hardware import check_precision

    plan, graph, topology = load_plan_inputs(args)
    note_unused_devices(plan, topology, "the export")
    kw = simulation_kwargs(args, plan, graph)
    # as simulate and plan: a precision the devices have no units for is not written either
    check_precision(topology, kw["settings"].precision)
    # absolute: torchtitan opens the path from the folder it runs in
    options = ExportOptions(exact=args.exact_split, torchtitan_version=args.torchtitan_version,
                            torchtitan_base=args.torchtitan_base,
                            schedule_csv=os.path.abspath(args.output + ".schedule.csv"),
                            output_name=os.path.basename(args.output))
    out = export(plan, graph, topology, args.to, settings=kw["settings"],
                 schedule=kw.get("schedule"), options=options)
    for line in out.notes:
        note(line)
    for suffix, text in out.beside.items():
        write_atomic(args.output + suffix, text)
    write_atomic(args.output, out.text)
    sys.stdout.write(f"wrote {args.to} export to {args.output}\n")
    for suffix in out.beside:
        sys.stdout.write(f"wrote {args.output}{suffix}\n")
    return 0
