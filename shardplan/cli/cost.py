"""``shardplan cost PLAN GRAPH TOPO --objective NAME``: evaluate a plan's objective."""

from __future__ import annotations

import argparse
import sys

from shardplan.cli._common import add_plan_inputs, load_plan_inputs, print_json
from shardplan.cli.partition import parse_option

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``cost`` command to ``sub``."""
    p = sub.add_parser(
        "cost", help="evaluate a plan's objective",
        description="Evaluate an objective on PLAN from the three files alone: sharding "
                    "(paper 000, section 2.1), max-stage (the view of the stage-time model "
                    "the plan names: overlap, Parmesan's equation 3, or a mapping's "
                    "equation 6 or 7, with the plan's execution settings) or strategy "
                    "(PaSE).")
    add_plan_inputs(p)
    p.add_argument("--objective", required=True, help="sharding | max-stage")
    p.add_argument("--model", choices=("overlap", "eq3", "p2p", "allreduce"), default=None,
                   help="max-stage: evaluate this view instead of the plan's")
    p.add_argument("--option", action="append", type=parse_option, default=[],
                   metavar="KEY=VALUE", help="an execution setting overriding the plan's, or "
                                             "an objective's option (VALUE as JSON)")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from shardplan.objectives import evaluate

    plan, graph, topology = load_plan_inputs(args)
    options = dict(args.option)
    if args.model is not None:
        options["model"] = args.model
    name, value, details = evaluate(plan, graph, topology, args.objective, **options)
    if args.json:
        print_json({"objective": name, "value": value, "recorded": plan.objective.value,
                    "recorded_name": plan.objective.name, **dict(details)})
    else:
        sys.stdout.write(f"{name} = {value:.10g} (the plan records {plan.objective.name} = "
                         f"{plan.objective.value:.10g})\n")
    return 0
