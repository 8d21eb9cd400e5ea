"""``shardplan cost PLAN GRAPH TOPO --objective NAME``: evaluate a plan's objective."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from shardplan.cli._common import add_plan_inputs, declare_files, load_plan_inputs, print_json
from shardplan.cli.partition import parse_option
from shardplan.errors import ShardplanError

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
    declare_files(p, inputs=("plan", "graph", "topology"))
    p.set_defaults(handler=_run)


def _check_options(plan: Any, objective: str, options: dict[str, Any], *,
                   forced_model: bool) -> None:
    """A ``--option`` the objective would not read is an error, not silently ignored: the
    max-stage time of a partition reads its settings from the plan's options, which hold
    other keys too, so it cannot tell a typo from them itself. (A mapping's formulas and
    the other objectives check their own options.)"""
    if objective != "max-stage" or not options:
        return
    if forced_model or "model" in options or plan.objective.name.startswith("max_stage_seconds_"):
        return
    from dataclasses import fields

    from shardplan.ir import ExecutionSettings

    # What max_stage reads besides ``model``: contention and the execution settings.
    takes = sorted({f.name for f in fields(ExecutionSettings)} | {"global_batch", "contention"})
    unknown = sorted(set(options) - set(takes))
    if unknown:
        raise ShardplanError(f"max-stage of a partition does not take option {unknown[0]!r} "
                             f"(it takes: {', '.join(takes)})")


def _run(args: argparse.Namespace) -> int:
    from shardplan.objectives import evaluate

    plan, graph, topology = load_plan_inputs(args)
    options = dict(args.option)
    _check_options(plan, args.objective, options, forced_model=args.model is not None)
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
