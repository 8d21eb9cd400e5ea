"""``shardplan partition GRAPH TOPO --algorithm NAME``: run a registered partitioner.

Every partitioner of the registry is reachable here. The flags below are the union of the
partitioners' options; only the flags a user sets reach the algorithm, which rejects those it
does not take in one line. ``--option KEY=VALUE`` passes any other option (VALUE parsed as
JSON when it parses, else kept as a string).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from shardplan._argtypes import ray_address
from shardplan.cli._common import (
    SETTING_FLAGS,
    add_output,
    declare_files,
    emit,
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
    progress_reporter,
    time_left,
)
from shardplan.errors import ShardplanError

__all__ = ["add_search_arguments", "algorithm_options", "list_algorithms_in_help",
           "parse_option", "register"]

# argparse dest -> (flag, argparse keywords). The option key is the dest.
FLAGS: dict[str, tuple[str, dict[str, Any]]] = {
    "stages": ("--stages", {"type": positive_int, "metavar": "S",
                            "help": "number of stages / components (default: the algorithm's "
                                    "choice; the sharding partitioners use every device)"}),
    "replicas": ("--replicas", {"type": positive_int, "metavar": "R",
                                "help": "replicas per stage (Parmesan: S x R = devices)"}),
    "workers": ("--workers", {"type": positive_int,
                              "help": "parallel worker processes (default: the cores)"}),
    "ray": ("--ray", {"type": ray_address, "metavar": "ADDRESS",
                      "help": "heuristic: run the restarts on a Ray cluster (local | auto | "
                              "HOST:PORT; needs pip install 'shardplan[ray]')"}),
    "restarts": ("--restarts", {"type": positive_int,
                                "help": "random restarts of a local search"}),
    "start": ("--start", {"help": "initial partition of a local search "
                                  "(random | topo | metis)"}),
    "clusters": ("--clusters", {"type": positive_int, "metavar": "K",
                                "help": "Parmesan: operators left after clustering"}),
    "alpha": ("--alpha", {"type": nonnegative_float,
                          "help": "Parmesan: weight of communication in clustering (eq. 4)"}),
    "refine_steps": ("--refine-steps", {"type": nonnegative_int, "metavar": "I",
                                        "help": "Parmesan: refinement steps (section 4.3)"}),
    "max_fronted": ("--max-fronted", {"type": positive_int, "metavar": "N",
                                      "help": "Parmesan: most fronted subgraphs the DP takes "
                                              "(more: keep clustering)"}),
    "objective": ("--objective", {"choices": ("overlap", "eq3"),
                                  "help": "pipeline partitioners: the stage time to minimise: "
                                          "overlap (the simulator's model, default) or eq3 "
                                          "(Parmesan's equation 3)"}),
    **SETTING_FLAGS,
}


def parse_option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` -> ``(key, value)``, VALUE as JSON when it parses."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return key.replace("-", "_"), value


def add_flags(p: argparse.ArgumentParser, flags: dict[str, tuple[str, dict[str, Any]]]) -> None:
    for dest, (flag, kw) in flags.items():
        p.add_argument(flag, dest=dest, default=None, **kw)
    p.add_argument("--option", action="append", type=parse_option, default=[],
                   metavar="KEY=VALUE", help="any other option of the algorithm "
                                             "(VALUE as JSON)")


def algorithm_options(args: argparse.Namespace,
                      flags: dict[str, tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The options a user set: flags that are not None, then ``--option`` pairs."""
    opts = {dest: getattr(args, dest) for dest in flags if getattr(args, dest) is not None}
    for key, value in args.option:
        if key in opts:
            raise ShardplanError(f"option {key!r} given twice")
        opts[key] = value
    return opts


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``partition`` command to ``sub``."""
    p = sub.add_parser(
        "partition", help="partition a graph onto a topology",
        description="Partition GRAPH onto TOPO with a registered algorithm and write the plan. "
                    "Sharding cost (paper 000): brute-force, heuristic, hierarchical. Pipeline "
                    "stages (Parmesan and baselines): parmesan, pipedream, uniform, params, "
                    "metis.")
    p.add_argument("graph", metavar="GRAPH", help="graph file (shardplan.graph/1)")
    p.add_argument("topology", metavar="TOPO", help="topology file (shardplan.topology/1)")
    add_search_arguments(p, "partitioner name (the list below)", FLAGS)
    list_algorithms_in_help(p, "partition")
    declare_files(p, inputs=("graph", "topology"), outputs=("output",))
    p.set_defaults(handler=_run)


def list_algorithms_in_help(p: argparse.ArgumentParser, family: str) -> None:
    """``--help`` of ``p`` ends with the algorithms registered in ``family``, plug-ins
    (entry-point group ``shardplan.algorithms``) included; looked up only when help is
    shown, so the command line starts without importing them."""
    plain = p.format_help

    def format_help() -> str:
        from shardplan import registry

        p.epilog = f"{family} algorithms: {', '.join(registry.available(family))}"
        return plain()

    p.format_help = format_help  # type: ignore[method-assign]


def add_search_arguments(p: argparse.ArgumentParser, algorithm_help: str,
                         flags: dict[str, tuple[str, dict[str, Any]]]) -> None:
    """``--algorithm``, ``--time-limit``, ``--seed``, the algorithm ``flags``, ``--option``,
    and the output flags: what every command that runs a registered search takes."""
    p.add_argument("--algorithm", required=True, help=algorithm_help)
    p.add_argument("--time-limit", type=positive_float, default=None, metavar="SEC",
                   help="the whole command (loading the files included) ends within SEC "
                        "seconds, with the best plan found so far (status timed_out; such "
                        "a plan may differ from run to run)")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="random seed (default 0)")
    add_flags(p, flags)
    add_output(p)


def _run(args: argparse.Namespace) -> int:
    from shardplan import registry
    from shardplan.ir import load_graph, load_topology

    if not args.output and not args.json:
        raise ShardplanError("say where the plan goes: -o FILE or --json")
    registry.get("partition", args.algorithm)  # unknown name: fail before loading files
    graph = load_graph(args.graph)
    topology = load_topology(args.topology)
    options = algorithm_options(args, FLAGS)
    with progress_reporter() as progress:
        result = registry.run("partition", args.algorithm, graph, topology, seed=args.seed,
                              time_limit=time_left(args.time_limit), progress=progress,
                              **options)
    emit(args, result.plan, what="plan")
    if not args.json:
        plan = result.plan
        sys.stdout.write(f"{plan.algorithm}: {plan.num_stages} stages x {plan.num_replicas} "
                         f"replicas, {plan.objective.name} = {plan.objective.value:.6g} "
                         f"({plan.status}, {plan.search_seconds:.2f} s)\n")
        report = plan.meta.get("acyclic")
        if isinstance(report, dict) and "unconstrained" in report:
            ratio = report.get("ratio")
            sys.stdout.write(f"acyclic (a pipeline runs it); without the constraint "
                             f"{report['unconstrained']:.6g}"
                             f"{f' ({ratio:.3g}x)' if ratio is not None else ''}"
                             f"{', optimal' if report.get('exact') else ''}\n")
        elif isinstance(report, dict) and report.get("acyclic") is False:
            sys.stdout.write("the stages form a cycle: train cannot run this plan (it was "
                             "made with acyclic=false)\n")
    return 0
