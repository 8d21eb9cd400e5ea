"""``shardplan plan MODEL_OR_GRAPH --cluster TOPO``: find, rank and run the best plan.

Every family's candidates are simulated with the execution settings they would run with,
and ranked by the simulated iteration (:mod:`shardplan.planner`); the winner is a plan file
every other command takes. ``--report`` writes the ranking and the winner's timeline as HTML,
``--run --steps N`` trains the winner for real and prints predicted against measured time.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any

from shardplan._argtypes import byte_size, ray_address, size_int
from shardplan.cli._common import (
    add_settings_arguments,
    declare_files,
    note,
    positive_float,
    positive_int,
    print_json,
    progress_reporter,
    settings_changes,
    time_left,
    with_provenance,
)
from shardplan.cli._llm_table import plain
from shardplan.cli._plan_defaults import (
    DEFAULT_TIME_LIMIT,
    TARGET_STACKS,
    TARGETS,
    Assumptions,
    bf16_tensor_cores,
    keep_target,
    use_gpus,
)
from shardplan.errors import ShardplanError

__all__ = ["register"]

def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``plan`` command to ``sub``."""
    p = sub.add_parser(
        "plan", help="find, rank and run the best plan for a model on a cluster",
        description="Search every family of plan (data parallelism with all-reduce, DDP "
                    "buckets or FSDP sharding; Parmesan pipelines over every stages x "
                    "replicas, schedule and micro-batch count, mapped optimally and "
                    "consecutively; the PipeDream, params and uniform baselines; paper "
                    "000's partitions; PaSE strategies; Parmesan stages run by PaSE "
                    "strategies), simulate each with its execution settings and rank them. "
                    "The winner never simulates slower than any candidate evaluated.")
    p.add_argument("model", metavar="MODEL_OR_GRAPH",
                   help="a graph file (shardplan.graph/1) or a model spec to capture "
                        "(mlp, torchvision:resnet50, transformers:gpt2, FILE.py:FN)")
    p.add_argument("--cluster", required=True, metavar="TOPO",
                   help="a topology file, or a builder like dgx1,boxes=2 or "
                        "hierarchical,shape=4x4")
    p.add_argument("--global-batch", type=size_int("batch"), metavar="B",
                   help="samples per iteration (default: the graph's batch per device)")
    p.add_argument("--memory-limit", type=byte_size, metavar="BYTES",
                   help="memory per device to plan for, at most the topology's (16GiB)")
    p.add_argument("--families", metavar="NAME,...",
                   help="families to search (default: all of data-parallel, parmesan, "
                        "pipedream, pipedream-sequence, params, uniform, sharding, pase, "
                        "hybrid)")
    p.add_argument("--time-limit", type=positive_float, metavar="SEC",
                   help="stop the search after SEC seconds with the best plan so far "
                        f"(default {DEFAULT_TIME_LIMIT:g})")
    p.add_argument("--gpus", type=positive_int, metavar="N",
                   help="use N of the cluster's GPUs (its first: 2 of a node's 8, or whole "
                        "nodes; the cluster spec's gpus=N alike; default: all)")
    p.add_argument("--target", choices=TARGETS,
                   help="keep only plans this stack can run and 'shardplan export --to' "
                        "writes (each ranked plan is exported in memory, and dropped when "
                        "the export refuses it); torchtitan and deepspeed also price the "
                        "plans as that stack runs them unless --stack is given")
    p.add_argument("--top", type=positive_int, default=10, metavar="K",
                   help="candidates to show (default 10)")
    p.add_argument("--ray", type=ray_address, metavar="ADDRESS",
                   help="evaluate candidates on a Ray cluster (local | auto | HOST:PORT; "
                        "needs pip install 'shardplan[ray]')")
    p.add_argument("--workers", type=positive_int, metavar="N",
                   help="processes evaluating candidates (default: the CPUs, at most 4)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--batch-size", type=size_int("batch"), default=8, metavar="N",
                   help="capture: samples per graph (default 8)")
    p.add_argument("--seq-len", type=size_int("sequence"), default=None, metavar="L",
                   help="capture: tokens per sample (default: the spec's seq=, else the "
                        "sequence a published flavor was trained at (llama3: 8192, llama2: "
                        "4096), else 128; both given must agree)")
    add_settings_arguments(p, skip=("microbatch_size", "global_batch"))
    p.add_argument("--baseline", metavar="PLAN",
                   help="an LLM plan of your own (as 'shardplan import' writes it): searched "
                        "beside the candidates, its training settings the search's, and the "
                        "winner compared with it")
    p.add_argument("-o", "--output", metavar="FILE", help="write the winning plan here")
    p.add_argument("--report", metavar="FILE.html", help="write the ranking and the "
                   "winner's timeline here")
    p.add_argument("--run", action="store_true", help="train the winner for real and "
                   "print predicted against measured time per step")
    p.add_argument("--steps", type=positive_int, default=None,
                   help="--run: steps (default 5)")
    p.add_argument("--trust-model-code", action="store_true",
                   help="--run: allow building the model from the Python file a graph "
                        "file's 'model' field names (FILE.py:FN), which runs its code")
    p.add_argument("--json", action="store_true", help="print the ranking as JSON")
    from shardplan.cli._failures import add_failure_options

    add_failure_options(p)  # issue 48: rank the first LLM plans by their goodput
    declare_files(p, inputs=("model", "cluster", "baseline"), outputs=("output", "report"))
    p.set_defaults(handler=_run)


def _cluster(text: str, gpus: int | None = None) -> Any:
    """The cluster of ``--cluster`` (a topology file or a builder spec), restricted to
    ``gpus`` of its GPUs (``--gpus``, or the spec's own ``gpus=`` key;
    :func:`~shardplan.cli._plan_defaults.use_gpus`)."""
    import shardplan.measure  # noqa: F401 - registers the topology kind 'measure'
    from shardplan.ir import load_topology
    from shardplan.topology import build, parse_spec

    if os.path.exists(text) or text.endswith(".json"):
        topology = load_topology(text)
        return topology if gpus is None else use_gpus(topology, gpus)
    kind, options = parse_spec(text)
    own = options.pop("gpus", None)
    if own is not None and (isinstance(own, bool) or not isinstance(own, int) or own < 1):
        raise ShardplanError(f"--cluster {text!r}: gpus= must be a positive integer, got "
                             f"{own!r}")
    if own is not None and gpus is not None and own != gpus:
        raise ShardplanError(f"--cluster {text!r} says gpus={own} and --gpus says {gpus}: "
                             f"give the GPU count once")
    _check_size(text, options, kind)
    _check_rates(options)
    topology = build(kind, **options)
    count = gpus if gpus is not None else own
    return topology if count is None else use_gpus(
        topology, count, flag="--gpus" if gpus is not None else "gpus=")


def _check_rates(options: dict[str, Any]) -> None:
    """The memory, FLOP/s and bandwidth keys of a ``--cluster`` spec within
    :data:`shardplan._limits.LIMITS`, named as written (``gpu_memory=``), before the
    builder runs."""
    from shardplan._limits import check_size
    from shardplan.topology._devices import check_bytes

    for key, value in options.items():
        if isinstance(value, bool):
            continue
        if "memory" in key and "bandwidth" not in key:
            check_size(f"{key}=", check_bytes(key, value), "memory")
        elif key == "flops" and isinstance(value, (int, float)):
            check_size(f"{key}=", value, "flops")
        elif key == "nic_gbps" and isinstance(value, (int, float)):
            check_size(f"{key}=", value * 1e9 / 8, "bandwidth")
        elif "bandwidth" in key and isinstance(value, (int, float)):
            check_size(f"{key}=", value, "bandwidth")


def _check_size(text: str, options: dict[str, Any], kind: str = "") -> None:
    """Refuse a builder spec whose device count (``num_devices``, the product of
    ``shape``, or a cluster preset's ``nodes`` x GPUs per node) is beyond what ``plan``
    searches, before building it (a million devices take a minute to build): a cluster
    preset (a compact pair model, which the LLM family prices) up to
    :data:`~shardplan.planner.MAX_LLM_PLAN_DEVICES`, other kinds (dense per-pair matrices) up
    to :data:`~shardplan.planner.MAX_PLAN_DEVICES`. The search checks every topology again,
    against its families."""
    from shardplan.planner import MAX_LLM_PLAN_DEVICES, MAX_PLAN_DEVICES
    from shardplan.topology import CLUSTER_PRESETS

    shape = options.get("shape")
    count = options.get("num_devices")
    if isinstance(shape, tuple):
        count = math.prod(shape)
    nodes = options.get("racks" if kind == "gb200-nvl72" else "nodes", 1)
    limit = MAX_PLAN_DEVICES
    if kind in CLUSTER_PRESETS and isinstance(nodes, int):
        count = nodes * CLUSTER_PRESETS[kind].gpus_per_node
        limit = MAX_LLM_PLAN_DEVICES
    per_node = options.get("gpus_per_node")
    if kind == "custom" and isinstance(nodes, int) and isinstance(per_node, int):
        count = nodes * per_node
        limit = MAX_LLM_PLAN_DEVICES
    if isinstance(count, int) and count > limit:
        raise ShardplanError(f"--cluster {text!r} has {count} devices; plan searches at most "
                             f"{limit}")


def _from_graph_file(args: argparse.Namespace) -> bool:
    """Whether MODEL_OR_GRAPH is a graph file (else a model spec to capture)."""
    return os.path.exists(args.model) and args.model.endswith(".json")


#: The sequence a spec is captured at when neither it (``seq=``), its flavor nor
#: ``--seq-len`` gives one.
DEFAULT_SEQ = 128


def _graph(args: argparse.Namespace, assumed: Assumptions | None = None) -> Any:
    """The graph file, or the model spec captured; the sequence it was captured at, when the
    user gave none, added to ``assumed`` (a language model's only)."""
    from shardplan.ir import load_graph

    if _from_graph_file(args):
        return load_graph(args.model)
    from shardplan.capture import capture_spec
    from shardplan.workload.zoo import spec_seq, training_seq

    seq = spec_seq(args.model)
    if seq is not None and args.seq_len is not None and seq != args.seq_len:
        raise ShardplanError(f"the model spec's seq={seq} and --seq-len {args.seq_len} "
                             f"disagree: give the sequence length once")
    chosen = args.seq_len or seq
    why = ""
    if chosen is None:
        trained = training_seq(args.model)
        chosen, why = trained if trained is not None else (DEFAULT_SEQ, "the default")
    graph = capture_spec(args.model, batch_size=args.batch_size, seq_len=chosen)
    meta = graph.meta.get("transformer") if isinstance(graph.meta, dict) else None
    if why and assumed is not None and isinstance(meta, dict):
        assumed.add("sequence", f"sequence {meta.get('seq', chosen)} ({why}; seq= or "
                                f"--seq-len to change)")
    return graph


def _limit_memory(topology: Any, limit: float | None) -> Any:
    if limit is None:
        return topology
    from dataclasses import replace

    most = max(float(d.memory_bytes) for d in topology.devices)
    if limit > most:
        note(f"--memory-limit {limit:.4g} bytes is above the devices' memory ({most:.4g} "
             f"bytes): the devices' own memory is planned for")
    devices = tuple(replace(d, memory_bytes=min(float(d.memory_bytes), limit))
                    for d in topology.devices)
    return replace(topology, devices=devices)


def _run(args: argparse.Namespace) -> int:
    from shardplan.cli._failures import check_failure_args
    from shardplan.ir import ExecutionSettings, save
    from shardplan.planner import FAMILIES, search

    check_failure_args(args)
    if args.steps is not None and not args.run:  # it was ignored without a word
        raise ShardplanError(f"--steps {args.steps} counts the steps of --run: add --run, or "
                             f"leave --steps out")
    families = None
    if args.families is not None:
        families = [f.strip() for f in args.families.split(",") if f.strip()]
        if not families:
            raise ShardplanError(f"--families names no family (choose from "
                                 f"{', '.join(FAMILIES)})")
        bad = [f for f in families if f not in FAMILIES]
        if bad:
            raise ShardplanError(f"unknown plan family {bad[0]!r} (choose from "
                                 f"{', '.join(FAMILIES)})")
    topology = _limit_memory(_cluster(args.cluster, args.gpus), args.memory_limit)
    assumed = Assumptions()
    graph = _graph(args, assumed)
    if args.run and _from_graph_file(args) and graph.meta.get("model"):
        from shardplan.runtime._args import check_model_trust

        check_model_trust(str(graph.meta["model"]), from_file=f"the graph {args.model}",
                          trusted=args.trust_model_code)
    changes = settings_changes(args)
    # --global-batch goes to the search, which splits it into micro-batches itself: the
    # default count of 8, which the user did not set, is never the reason to refuse it
    changes.pop("global_batch", None)
    fixed: dict[str, Any] = {k: changes.pop(k) for k in ("microbatches", "schedule",
                                                          "gradient_sync") if k in changes}
    baseline = _baseline(args, graph, topology)
    start = ExecutionSettings() if baseline is None else _training_settings(baseline.settings)
    if baseline is None:
        changes.update(_defaults(args, graph, topology, families, assumed))
    settings, _ = start.override(**changes)
    from shardplan.ir.hardware import check_precision

    check_precision(topology, settings.precision)  # before the search: never blamed on memory
    global_batch = args.global_batch
    if global_batch is None and baseline is not None:
        global_batch = baseline.settings.global_batch
    include = [] if baseline is None else [(baseline.parallel, baseline.settings)]
    time_limit = DEFAULT_TIME_LIMIT if args.time_limit is None else args.time_limit
    with progress_reporter() as progress:
        result = search(graph, topology, global_batch=global_batch, settings=settings,
                        families=families, time_limit=time_left(time_limit),
                        seed=args.seed, workers=args.workers, fixed=fixed, ray=args.ray,
                        progress=progress, include=include)
    for err in result.errors:
        note(f"no candidate from {err}")
    if result.timed_out:
        note(f"the time limit stopped the search after {result.done} of {result.tasks} "
             "tasks: the best plan so far")
    _assume_after(args, result, topology, assumed)
    target = None
    if args.target is not None:
        result, target = keep_target(result, graph, topology, args.target,
                                     keep=max(args.top, 20))
        assumed.add("target", target.summary())
    from shardplan.cli._failures import prefer_resilient

    result, failure_lines = prefer_resilient(result, args, graph, topology)
    winner = result.winner
    if winner is None:
        raise ShardplanError("the time limit ran out before any candidate was evaluated")
    if args.output:
        from shardplan.cli._replan_context import with_context  # issue 48: what replan reuses

        save(with_provenance(with_context(winner, args, result, settings, graph, topology)),
             args.output)
    if args.report:
        from shardplan.report import write_report

        write_report(winner, graph, topology, args.report,
                     ranking=[r.row() for r in result.ranked[:max(args.top, 20)]])
    measured = _train(args, winner, graph, topology) if args.run else None
    compared = None if baseline is None else _compare(baseline, winner, result, graph, topology)
    if args.json:
        out = result.to_dict(top=args.top)
        _llm_json(out, result, graph, topology, args.top)
        out["assumptions"] = assumed.to_dict()
        out["assumed"] = assumed.line()
        if target is not None:
            out["target"] = target.to_dict()
        if measured is not None:
            out["run"] = measured
        if compared is not None:
            out["baseline"] = compared
        if failure_lines:
            out["failures"] = failure_lines[0]
        print_json(out)
    else:
        _print(result, args, measured, graph, topology, assumed)
        if compared is not None:
            print(compared["summary"])
        for line in failure_lines:
            print(line)
    return 0


def _plans_llm(graph: Any, topology: Any, families: list[str] | None) -> bool:
    """Whether the LLM family is among those searched (a transformer)."""
    from shardplan.planner._llm import has_blocks
    from shardplan.planner._search import default_families

    if families is not None:
        return "llm" in families and has_blocks(graph)
    return "llm" in default_families(graph, topology)


def _defaults(args: argparse.Namespace, graph: Any, topology: Any,
              families: list[str] | None, assumed: Assumptions) -> dict[str, Any]:
    """The settings ``plan`` chooses where the user said nothing (no ``--baseline``): an
    LLM's bf16 on GPUs with bf16 tensor cores, the ``--target`` stack's pricing; each said
    in ``assumed``."""
    out: dict[str, Any] = {}
    llm = _plans_llm(graph, topology, families)
    if args.precision is None:
        if llm and bf16_tensor_cores(topology):
            out["precision"] = "bf16"
            assumed.add("precision", "bf16 (tensor cores; --precision to change)")
        elif llm:
            assumed.add("precision", "fp32 (no bf16 tensor cores; --precision to change)")
        else:
            assumed.add("precision", "fp32 (--precision to change)")
    if llm and args.stack is None:
        stack = TARGET_STACKS.get(args.target or "", "megatron")
        out["stack"] = stack
        why = f"--target {args.target}" if stack != "megatron" else "Megatron-LM's modules"
        assumed.add("stack", f"stack {stack} ({why}; --stack to change)")
    return out


def _assume_after(args: argparse.Namespace, result: Any, topology: Any,
                  assumed: Assumptions) -> None:
    """The assumptions the search's answer shows: the global batch, the GPUs, the time
    limit."""
    if args.global_batch is None and not args.baseline:
        per = result.global_batch / max(1, topology.num_devices)
        per_text = f"{per:g} per GPU, " if per == int(per) else ""
        assumed.add("global_batch", f"global batch {result.global_batch} ({per_text}"
                                    f"--global-batch to change)")
    gen = topology.meta.get("generator") if isinstance(topology.meta, dict) else None
    total = (gen.get("options") or {}).get("gpus_of") if isinstance(gen, dict) else None
    if total:
        assumed.add("gpus", f"{topology.num_devices} of the cluster's {total} GPUs (--gpus)")
    else:
        assumed.add("gpus", f"all {topology.num_devices} GPUs of {topology.name} (--gpus N "
                            f"to use fewer)")
    if args.time_limit is None:
        stopped = ": it stopped the search" if result.timed_out else ""
        assumed.add("time_limit", f"time limit {DEFAULT_TIME_LIMIT:g} s{stopped} "
                                  f"(--time-limit to change)")


def _llm_json(out: dict[str, Any], result: Any, graph: Any, topology: Any, top: int) -> None:
    """Each LLM row of ``--json``'s ranking gets ``llm``: its fields in the user's terms
    (:func:`~shardplan.cli._llm_table.llm_fields`)."""
    from shardplan.cli._llm_table import llm_fields

    for row, shown in zip(result.ranked[:top], out["ranked"], strict=True):
        fields = llm_fields(row, graph, topology, result.global_batch)
        if fields is not None:
            shown["llm"] = fields


def _baseline(args: argparse.Namespace, graph: Any, topology: Any) -> Any:
    """``--baseline``: the user's LLM plan, laid out again on this graph (its node ids may
    differ: the layout is what it means), or None."""
    if not args.baseline:
        return None
    from shardplan.ir import load_plan
    from shardplan.strategy.llm import layout_plan

    own = load_plan(args.baseline)
    if own.parallel is None:
        raise ShardplanError(f"--baseline {args.baseline} is not an LLM plan (it has no "
                             f"'parallel' layout; 'shardplan import' writes one)")
    own_model = (own.meta.get("imported_from") or {}).get("model")
    this_model = graph.meta.get("model")
    if own_model and this_model and own_model != this_model:
        raise ShardplanError(f"--baseline {args.baseline} is a plan of {own_model}, not of "
                             f"{this_model}: a baseline must be of the same model")
    if not (own_model and this_model) and own.graph != graph.name:
        raise ShardplanError(f"--baseline {args.baseline} is a plan of graph {own.graph!r}, "
                             f"not of {graph.name!r}: a baseline must be of the same model")
    if own.topology and own.topology != topology.name:
        note(f"--baseline {args.baseline} was made for cluster {own.topology!r}: it is "
             f"simulated again on {topology.name!r}")
    return layout_plan(graph, topology, own.parallel, own.settings, algorithm="baseline")


def _training_settings(settings: Any) -> Any:
    """What a baseline fixes for every candidate: its precision, optimizer and kernels (the
    search chooses the layout, micro-batches, schedule, recompute)."""
    from shardplan.ir import ExecutionSettings

    return ExecutionSettings(precision=settings.precision, optimizer=settings.optimizer,
                             gradient_sync=settings.gradient_sync, attention=settings.attention,
                             tp_comm_overlap=settings.tp_comm_overlap,
                             shard_unit=settings.shard_unit,
                             grad_reduce=settings.grad_reduce, stack=settings.stack,
                             expandable_segments=settings.expandable_segments,
                             efficiency=settings.efficiency, overlap=settings.overlap)


def _compare(baseline: Any, winner: Any, result: Any, graph: Any, topology: Any
             ) -> dict[str, Any]:
    """The baseline simulated beside the winner: times, speed-up, the knobs moved."""
    from shardplan.planner._llm import moved_knobs
    from shardplan.simulate import simulate

    own = simulate(baseline, graph, topology, timeline=False)
    best = result.ranked[0].iteration_seconds
    speedup = own.iteration_seconds / best if best > 0 else math.inf
    moved = [] if winner.parallel is None else moved_knobs(
        (baseline.parallel, baseline.settings), (winner.parallel, winner.settings))
    what = winner.parallel.label() if winner.parallel is not None else winner.algorithm
    summary = (f"the winner ({what}, {best:.4g} s per iteration) simulates {speedup:.3g}x "
               f"as fast as your configuration ({baseline.parallel.label()}, "
               f"{own.iteration_seconds:.4g} s{'' if own.fits_memory else ', does not fit'})")
    summary += (": " + ", ".join(moved)) if moved else ("" if speedup > 1 else
                                                        ": it is your configuration")
    return {"baseline": baseline.parallel.label(), "baseline_seconds": own.iteration_seconds,
            "baseline_fits": own.fits_memory, "winner_seconds": best, "speedup": speedup,
            "moved": moved, "summary": summary}


def _print(result: Any, args: argparse.Namespace, measured: dict[str, Any] | None,
           graph: Any, topology: Any, assumed: Assumptions) -> None:
    """The ranking: LLM rows in the user's terms (:mod:`shardplan.cli._llm_table`), the
    other families' rows in the papers' table, each row with its rank; the assumptions in
    one line under them."""
    from rich.console import Console
    from rich.table import Table

    from shardplan.cli._llm_table import LLM_COLUMNS, llm_fields, llm_table_rows
    from shardplan.planner import shape_label

    console = Console(file=sys.stdout, width=max(120, Console().width))
    shown = list(enumerate(result.ranked[:args.top], start=1))
    llm = [(i, r, f) for i, r in shown
           if (f := llm_fields(r, graph, topology, result.global_batch)) is not None]
    ranks = {i for i, _, _ in llm}
    others = [(i, r) for i, r in shown if i not in ranks]
    title = (f"{len(result.ranked)} candidates, global batch {result.global_batch}, "
             f"searched in {result.seconds:.1f} s")
    if llm:
        seq = llm[0][2]["sequence"]
        table = Table(title=title + (f"; sequences of {seq} tokens" if seq else ""))
        for col in LLM_COLUMNS:
            table.add_column(col, no_wrap=True, justify="left" if col in (
                "TP x PP x DP", "precision", "recompute", "SP") else "right")
        for cells in llm_table_rows(llm):
            table.add_row(*cells)
        Console(file=sys.stdout, width=max(170, Console().width)).print(table)
    if others or not llm:
        table = Table(title=title if not llm else "other families")
        for col in ("#", "family", "S x R", "schedule", "M", "mapping", "sync", "ms/iter",
                    "samples/s", "peak GiB", "search s"):
            table.add_column(col, justify="right" if col not in (
                "family", "schedule", "mapping", "sync") else "left")
        for i, r in others:
            ms = plain(r.iteration_seconds * 1e3)
            table.add_row(str(i), r.family, shape_label(r), r.schedule,
                          str(r.microbatches), r.mapping, r.gradient_sync,
                          ms if r.fits else f"{ms} (no fit)", plain(r.throughput, 5),
                          plain(r.peak_memory_bytes / 2**30, 3), plain(r.search_seconds, 2))
        console.print(table)
    if assumed.items:
        sys.stdout.write(assumed.line() + "\n")
    comp = result.comparisons
    lines = []
    if "speedup_over_data_parallel" in comp:
        lines.append(f"{comp['speedup_over_data_parallel']:.2f}x faster than data parallelism "
                     "(DDP)")
    if "speedup_over_best_other_family" in comp:
        lines.append(f"{comp['speedup_over_best_other_family']:.2f}x faster than the best "
                     "plan of any other family")
    if lines:
        sys.stdout.write(f"winner: {comp['winner']['family']}, " + "; ".join(lines) + "\n")
    for what, path in (("plan", args.output), ("report", args.report)):
        if path:
            sys.stdout.write(f"wrote {what} to {path}\n")
    if measured is not None:
        sys.stdout.write(f"ran {measured['steps']} steps: predicted "
                         f"{measured['predicted_seconds'] * 1e3:.4g} ms per step, measured "
                         f"{measured['measured_seconds'] * 1e3:.4g} ms (median of the steps "
                         f"after the first), predicted / measured "
                         f"{measured['ratio']:.2f}\n")


def _train(args: argparse.Namespace, plan: Any, graph: Any, topology: Any) -> dict[str, Any]:
    """Train the winner for ``--steps`` steps; predicted and measured seconds per step."""
    import statistics

    from shardplan.runtime import config_for_plan, train
    from shardplan.simulate import simulate

    model = graph.meta.get("model")
    if not model:
        raise ShardplanError("--run needs the model the graph was captured from (capture it "
                             "with shardplan, or plan from a model spec)")
    cfg = config_for_plan(plan, graph, steps=5 if args.steps is None else args.steps,
                          model=model)
    result = train(cfg)
    times = list(result.seconds_per_step)
    measured = statistics.median(times[1:] if len(times) > 1 else times)
    predicted = simulate(plan, graph, topology, timeline=False).iteration_seconds
    return {"steps": len(times), "losses": list(result.losses),
            "seconds_per_step": times, "measured_seconds": measured,
            "predicted_seconds": predicted, "ratio": predicted / measured}
