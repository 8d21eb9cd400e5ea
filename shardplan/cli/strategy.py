"""``shardplan strategy GRAPH --devices N --algorithm pase|data-parallel|expert``: per-layer
data/parameter parallel configurations (PaSE, paper 004).

Without ``--topology`` the devices are a flat topology of N devices (the ``pase`` cost model
ignores the topology anyway; the ``default`` one reads its FLOP/s, memory and links).
``--export-tables F`` writes the search's input (every node's configurations and costs, every
edge's cost matrix) for outside solvers; ``--import-tables F`` solves such a file instead of
building one, and needs no GRAPH then (the tables hold every node's configurations and costs).
Prints the chosen configuration per layer like the paper's Table II. ``--time-limit`` counts
from the start of the command: loading, building the tables, pruning and the search.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from shardplan.cli._common import (
    SETTING_FLAGS,
    add_output,
    declare_files,
    emit,
    nonnegative_int,
    note,
    positive_float,
    positive_int,
    progress_reporter,
    time_left,
)
from shardplan.errors import ShardplanError

__all__ = ["format_table", "register"]

#: The training settings a strategy search prices (``ExecutionSettings`` fields; the
#: micro-batching flags do not apply: a strategy runs one micro-batch of the graph's batch).
TRAINING_FLAGS = ("precision", "recompute", "gradient_sync", "sequence_parallel",
                  "tp_comm_overlap")


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``strategy`` command to ``sub``."""
    p = sub.add_parser(
        "strategy", help="choose per-layer parallel strategies (PaSE)",
        description="Choose how every layer of GRAPH is split over N devices: pase (the "
                    "paper's dynamic program, exact under the cost model), data-parallel, or "
                    "expert (one weird trick for CNNs, Megatron-style for transformers).")
    p.add_argument("graph", metavar="GRAPH", nargs="?", default=None,
                   help="graph file (shardplan.graph/1); not needed with --import-tables")
    p.add_argument("--devices", type=positive_int, default=None, metavar="N",
                   help="devices (default: the topology's; required without --topology)")
    p.add_argument("--topology", metavar="TOPO", help="topology file (default: flat N)")
    p.add_argument("--algorithm", default="pase", help="pase | data-parallel | expert")
    p.add_argument("--cost-model", choices=("pase", "default"), default="pase",
                   help="pase: the prototype's FLOP-equivalents; default: seconds with "
                        "dtype bytes, topology links and a memory limit")
    p.add_argument("--ordering", choices=("generate-seq", "bfs"), default=None,
                   help="vertex order of the dynamic program (pase; default generate-seq)")
    p.add_argument("--cutoff", type=positive_int, default=None,
                   help="smallest per-device size of a split dimension (default: the "
                        "graph's pase_cutoff, else 4)")
    p.add_argument("--memory-limit", type=positive_float, default=None, metavar="BYTES",
                   help="bytes per device (default cost model; default: device memory)")
    p.add_argument("--model-parallel", type=positive_int, default=None, metavar="M",
                   help="expert: model-parallel ways (default: the graph's, else 8)")
    p.add_argument("--export-tables", metavar="FILE",
                   help="write every node's configurations and costs and every edge's cost "
                        "matrix as JSON")
    p.add_argument("--import-tables", metavar="FILE",
                   help="solve this tables file (from --export-tables) instead")
    p.add_argument("--time-limit", type=positive_float, default=None, metavar="SEC",
                   help="stop the search after SEC seconds with the best plan so far")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="recorded (deterministic)")
    p.add_argument("--quiet", action="store_true", help="do not print the per-layer table")
    for dest in TRAINING_FLAGS:
        flag, kw = SETTING_FLAGS[dest]
        p.add_argument(flag, dest=dest, default=None, **kw)
    add_output(p)
    declare_files(p, inputs=("graph", "topology", "import_tables"),
                  outputs=("output", "export_tables"))
    p.set_defaults(handler=_run)


def format_table(names: Any, ops: Any, strategy: Any, dims: Any, limit: int = 60) -> str:
    """Per-layer table (the paper's Table II): consecutive layers with the same kind, dims
    and configuration are merged into one row."""
    rows: list[tuple[str, str, str, str]] = []
    last = None
    for v in range(len(names)):
        key = (ops[v], ",".join(dims[v]),
               "(" + ",".join(str(x) for x in strategy[str(v)]) + ")")
        if key == last and rows:
            first = rows[-1][0].split(" .. ")[0]
            rows[-1] = (f"{first} .. {names[v]}", *key)
        else:
            rows.append((names[v], *key))
        last = key
    head = ("layer", "op", "dims", "configuration")
    shown = rows if len(rows) <= limit else rows[:limit]
    width = [max(len(r[i]) for r in [head, *shown]) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, width, strict=True)).rstrip()
             for r in [head, *shown]]
    if len(rows) > limit:
        lines.append(f"... {len(rows) - limit} more rows (the plan's strategy has them all)")
    return "\n".join(lines)


def _remaining(args: argparse.Namespace, t0: float) -> float | None:
    """The time limit left after what the command already spent, counted from the
    command's start (:func:`~shardplan.cli._common.time_left`)."""
    del t0  # the command's own clock starts earlier, with the process
    return time_left(args.time_limit)


def _run(args: argparse.Namespace) -> int:
    from shardplan import registry
    from shardplan.ir import load_graph, load_topology, write_json
    from shardplan.topology import flat

    t0 = time.perf_counter()
    if not args.output and not args.json and not args.export_tables:
        raise ShardplanError("say where the plan goes: -o FILE or --json")
    registry.get("strategy", args.algorithm)
    if args.import_tables and args.algorithm != "pase":
        raise ShardplanError("--import-tables solves with the pase algorithm only")
    if args.import_tables and args.export_tables:
        raise ShardplanError("--import-tables and --export-tables do not go together")
    if args.ordering is not None and args.algorithm != "pase":
        raise ShardplanError("--ordering applies to --algorithm pase only")
    if args.model_parallel is not None and args.algorithm != "expert":
        raise ShardplanError("--model-parallel applies to --algorithm expert only")
    if args.import_tables:
        return _run_imported(args, t0)
    if args.graph is None:
        raise ShardplanError("give GRAPH (or --import-tables FILE)")
    graph = load_graph(args.graph)
    if args.topology:
        topology = load_topology(args.topology)
    elif args.devices is None:
        raise ShardplanError("give --devices N (or --topology TOPO)")
    else:
        topology = flat(args.devices)
    options: dict[str, Any] = {"cost_model": args.cost_model}
    if args.devices is not None:
        options["devices"] = args.devices
    if args.cutoff is not None:
        options["cutoff"] = args.cutoff
    if args.memory_limit is not None:
        options["memory_limit"] = args.memory_limit
    if args.ordering is not None:
        options["ordering"] = args.ordering
    if args.model_parallel is not None:
        options["model_parallel"] = args.model_parallel
    execution = _execution(args)
    if execution is not None:
        options["execution"] = execution.to_dict()

    from shardplan.strategy.pase import devices_of
    from shardplan.strategy.tables import build_tables, graph_spaces

    devices = devices_of(topology, options.get("devices"))
    if args.export_tables:
        tables = build_tables(graph, devices, cost_model=args.cost_model, topology=topology,
                              cutoff=args.cutoff, memory_limit=args.memory_limit)
        assert tables is not None
        write_json(args.export_tables, tables.to_dict())
        if not args.json:
            print(f"wrote tables to {args.export_tables}")
        if not args.output and not args.json:
            return 0
    with progress_reporter() as progress:
        result = registry.run("strategy", args.algorithm, graph, topology, seed=args.seed,
                              time_limit=_remaining(args, t0), progress=progress, **options)
    plan = result.plan
    if execution is not None and args.cost_model == "pase":
        # the paper's cost model prices none of them; the plan carries them to later commands
        note("the pase cost model does not price --precision, --recompute or --gradient-sync "
             "(--cost-model default does); they are recorded in the plan")
        plan = plan.with_settings(execution.resolve(graph))
    dims = [sp.dims for sp in graph_spaces(graph)]
    _report(args, plan, graph.names, graph.ops, dims, devices)
    return 0


def _execution(args: argparse.Namespace) -> Any:
    """The settings the training flags ask the search to price (one micro-batch, as a
    strategy search without them prices), or None when none was given."""
    from shardplan.ir import ExecutionSettings

    changes = {k: getattr(args, k) for k in TRAINING_FLAGS if getattr(args, k) is not None}
    if not changes:
        return None
    return ExecutionSettings(microbatches=1).override(**changes)[0]


def _run_imported(args: argparse.Namespace, t0: float) -> int:
    """``--import-tables``: solve the file's tables; GRAPH, when given, is checked against
    them."""
    from shardplan.ir import load_graph, load_topology, read_json
    from shardplan.strategy.pase import solve_tables
    from shardplan.strategy.tables import Tables

    for flag, value in (("--cost-model", args.cost_model != "pase"), ("--cutoff", args.cutoff),
                        ("--memory-limit", args.memory_limit),
                        ("--precision etc.", _execution(args) is not None)):
        if value:
            raise ShardplanError(f"{flag} does not apply to --import-tables (the file holds "
                                 "the costs)")
    tables = Tables.from_dict(read_json(args.import_tables))
    topology_name = ""
    if args.graph is not None:
        graph = load_graph(args.graph)
        if tables.num_nodes != graph.num_nodes:
            raise ShardplanError(f"tables have {tables.num_nodes} nodes, the graph "
                                 f"{graph.num_nodes}")
    if args.topology:
        topology = load_topology(args.topology)
        if tables.devices > topology.num_devices:
            raise ShardplanError(f"tables are for {tables.devices} devices, the topology has "
                                 f"{topology.num_devices}")
        topology_name = topology.name
    if args.devices is not None and args.devices != tables.devices:
        raise ShardplanError(f"tables are for {tables.devices} devices, not {args.devices}")
    with progress_reporter() as progress:
        result = solve_tables(tables, ordering=args.ordering or "generate-seq",
                              time_limit=_remaining(args, t0), progress=progress,
                              topology_name=topology_name, seed=args.seed, t0=t0,
                              options={"import_tables": str(args.import_tables),
                                       "devices": tables.devices})
    ops = [""] * tables.num_nodes
    _report(args, result.plan, tables.names, ops, tables.dims, tables.devices)
    return 0


def _report(args: argparse.Namespace, plan: Any, names: Any, ops: Any, dims: Any,
            devices: int) -> None:
    if args.output or args.json:
        emit(args, plan, what="plan")
    meta = plan.meta
    if "note" in meta:
        note(meta["note"])
    if plan.status == "timed_out" and "incumbent" in meta:
        note(f"the time limit cut the search short: the plan is the {meta['incumbent']} "
             "strategy")
    if not args.json:
        if not args.quiet:
            sys.stdout.write(format_table(names, ops, plan.strategy, dims) + "\n")
        extra = f", model parallel {meta['choice']}" if plan.algorithm == "expert" and \
            "choice" in meta else ""
        sys.stdout.write(f"{plan.algorithm}: {devices} devices{extra}, {plan.objective.name} = "
                         f"{plan.objective.value:.6g} ({plan.status}, "
                         f"{plan.search_seconds:.2f} s)\n")
