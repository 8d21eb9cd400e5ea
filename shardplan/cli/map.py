"""``shardplan map PLAN GRAPH TOPO --algorithm optimal|consecutive``: map a plan's stages onto
devices (Parmesan section 5)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from shardplan.cli._common import (
    SETTING_FLAGS,
    add_plan_inputs,
    declare_files,
    emit,
    load_plan_inputs,
    note,
    positive_float,
    positive_int,
    progress_reporter,
    time_left,
)
from shardplan.cli.partition import add_search_arguments, algorithm_options
from shardplan.errors import ShardplanError

__all__ = ["register"]

FLAGS: dict[str, tuple[str, dict[str, Any]]] = {
    "model": ("--model", {"choices": ("overlap", "p2p", "allreduce", "auto"),
                          "help": "stage-time model: overlap (the simulator's), p2p (eq. 6), "
                                  "allreduce (eq. 7) or auto (overlap, or p2p when the plan's "
                                  "settings turn overlap off; default)"}),
    "workers": ("--workers", {"type": positive_int,
                              "help": "optimal: targets searched at once in worker processes "
                                      "(default 1)"}),
    "target_time_limit": ("--target-time-limit", {
        "type": positive_float, "metavar": "SEC",
        "help": "optimal: seconds per inner search; one that runs out counts as infeasible "
                "(the paper's heuristic; status timed_out)"}),
    "order": ("--order", {"choices": ("stage-major", "replica-major"),
                          "help": "consecutive: stage s's replicas side by side (stage-major, "
                                  "default) or replica r's pipeline side by side"}),
    **SETTING_FLAGS,
}


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``map`` command to ``sub``."""
    p = sub.add_parser(
        "map", help="map a plan's stages onto devices",
        description="Place every replica of every stage of PLAN on its own device of TOPO, "
                    "minimising the largest stage time (Parmesan section 5): optimal "
                    "(binary search + backtracking, exact) or consecutive (CS map).")
    add_plan_inputs(p)
    add_search_arguments(p, "optimal | consecutive", FLAGS)
    declare_files(p, inputs=("plan", "graph", "topology"), outputs=("output",))
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from shardplan import registry

    if not args.output and not args.json:
        raise ShardplanError("say where the plan goes: -o FILE or --json")
    registry.get("map", args.algorithm)  # unknown name: fail before loading files
    plan, graph, topology = load_plan_inputs(args)
    options = algorithm_options(args, FLAGS)
    _, notes = plan.settings.override(**{k: options[k] for k in SETTING_FLAGS if k in options})
    for line in notes:
        note(line)
    with progress_reporter({"map": "binary search"}) as progress:
        result = registry.run("map", args.algorithm, graph, topology, seed=args.seed,
                              time_limit=time_left(args.time_limit), progress=progress,
                              plan=plan,
                              **options)
    emit(args, result.plan, what="plan")
    if not args.json:
        out = result.plan
        sys.stdout.write(f"{out.algorithm}: {out.num_stages} stages x {out.num_replicas} "
                         f"replicas, {out.objective.name} = {out.objective.value:.6g} "
                         f"({out.status}, {out.search_seconds:.2f} s)\n")
    judge = result.plan.meta.get("judge", {})
    if judge.get("kept") == "consecutive":
        note(f"kept the consecutive mapping: {judge['why']}")
    return 0
