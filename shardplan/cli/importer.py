"""``shardplan import KIND ...``: turn another tool's profile into a graph, or another tool's
training run (Megatron-LM arguments, a torchtitan config) into graph, topology and plan files.

The module is named ``importer`` because ``import`` is a Python keyword; the command is
``import``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from shardplan.cli._common import OneLineParser, add_output, declare_files, emit, note, positive_int
from shardplan.importers import load_pipedream

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``import`` command (with its kinds as sub-commands) to ``sub``."""
    p = sub.add_parser("import", help="import a graph from another tool's profile (pipedream), "
                       "or a Megatron-LM / torchtitan run as graph, topology and plan",
                       description="Import a computation graph from another tool's format, or "
                                   "a training run's configuration as the three files every "
                                   "command reads.")
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
    _register_runs(kinds)


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


_RUN_EPILOG = ("DIR gets graph.json (the model captured at the run's micro-batch, on the meta "
               "device), topology.json (the cluster) and plan.json (the LLM plan of the run's "
               "parallel layout, its execution settings included), all or none. An argument "
               "that changes the run but is not modelled gets one 'shardplan: note:' line; an "
               "inconsistent run (TP not dividing the heads, a batch that does not divide, a "
               "world size other than the cluster's GPUs, or --gpus N of them) is an error. "
               "--json prints the run as read (model spec, parallel layout, execution "
               "settings, notes) instead of, or besides, writing DIR.")


def _register_runs(kinds: argparse._SubParsersAction) -> None:
    mg = kinds.add_parser(
        "megatron", help="a Megatron-LM run from its arguments",
        description="Import a Megatron-LM run from its pretrain_gpt.py arguments (read with "
                    "shlex against shardplan's tables, never run): the model, batch, "
                    "parallelism, recompute, precision, distributed optimizer, FSDP and "
                    "overlap arguments.", epilog=_RUN_EPILOG)
    mg.add_argument("--args", required=True, metavar="ARGS", dest="megatron_args",
                    help="the arguments, quoted as one string (write --args='--fp16' when it "
                         "has no blank; --vocab-size V is needed when "
                         "no --tokenizer-type fixes it; shardplan's --data-parallel-size N "
                         "stands for the world size torchrun would give)")
    _run_options(mg, inputs=("cluster",))
    mg.set_defaults(handler=_run_megatron)
    tt = kinds.add_parser(
        "torchtitan", help="a torchtitan run from its TOML or flags file",
        description="Import a torchtitan run: a v0.2 TOML file ([model] name/flavor, "
                    "[training], [parallelism], [activation_checkpoint]) or a file of current "
                    "torchtitan's --section.option flags.", epilog=_RUN_EPILOG)
    tt.add_argument("run_config", metavar="FILE", help="the TOML or flags file")
    _run_options(tt, inputs=("run_config", "cluster"))
    tt.set_defaults(handler=_run_torchtitan)


def _run_options(p: argparse.ArgumentParser, *, inputs: tuple[str, ...]) -> None:
    p.add_argument("--cluster", metavar="SPEC",
                   help="the cluster (a topology kind with options, as 'plan --cluster' takes "
                        "it, e.g. dgx-a100,nodes=4; or a topology file); its GPUs are the run's "
                        "world size")
    p.add_argument("--gpus", type=positive_int, metavar="N",
                   help="the run uses N of the cluster's GPUs (its first: 2 of a node's 8, "
                        "as Megatron-LM's own README rows; or whole nodes; the cluster spec's "
                        "gpus=N alike): the world size is N; default: all")
    p.add_argument("-o", "--output", metavar="DIR", dest="output_dir",
                   help="write graph.json, topology.json and plan.json in this folder")
    p.add_argument("--json", action="store_true", help="print the run as read, as JSON")
    # the three files in DIR are checked by the command itself (a folder is no output file)
    declare_files(p, inputs=inputs, outputs=())


_FILES = ("graph.json", "topology.json", "plan.json")


def _topology(args: argparse.Namespace) -> Any:
    if args.cluster is None:
        return None
    from shardplan.cli.plan import _cluster

    return _cluster(args.cluster, args.gpus)


def _world_size(args: argparse.Namespace, topology: Any) -> int | None:
    """The run's world size: the (restricted) cluster's GPUs, else ``--gpus``, else None
    (the run's own arguments say)."""
    return args.gpus if topology is None else topology.num_devices


def _run_megatron(args: argparse.Namespace) -> int:
    from shardplan.importers.megatron import parse_megatron

    topology = _begin(args)
    run = parse_megatron(args.megatron_args, cluster=args.cluster,
                         num_gpus=_world_size(args, topology))
    return _finish(args, run, topology)


def _run_torchtitan(args: argparse.Namespace) -> int:
    from shardplan.importers.torchtitan import run_of_torchtitan, torchtitan_options
    from shardplan.ir.io import read_text

    topology = _begin(args)
    sections = torchtitan_options(read_text(args.run_config), source=args.run_config)
    run = run_of_torchtitan(sections, cluster=args.cluster,
                            num_gpus=_world_size(args, topology))
    return _finish(args, run, topology)


def _begin(args: argparse.Namespace) -> Any:
    """Check the outputs before any work, and build the cluster."""
    from shardplan.errors import ShardplanError
    from shardplan.ir.io import check_output

    if not args.output_dir and not args.json:
        raise ShardplanError("say where the run goes: -o DIR or --json")
    if args.output_dir:
        if os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
            raise ShardplanError(f"-o {args.output_dir} is not a folder")
        if args.cluster is None:
            raise ShardplanError("writing graph, topology and plan needs the cluster: "
                                 "--cluster SPEC")
        for name in _FILES:
            check_output(os.path.join(args.output_dir, name))
    return _topology(args)


def run_json(run: Any) -> dict[str, Any]:
    """The ``--json`` object of an imported run."""
    return {"source": run.source, "model": run.model.spec, "cluster": run.cluster,
            "num_gpus": run.num_gpus, "parallel": run.parallel.to_dict(),
            "micro_batch_size": run.micro_batch_size, "global_batch": run.global_batch,
            "execution": dict(run.execution), "notes": list(run.notes)}


def layout(graph: Any, topology: Any, run: Any) -> Any:
    """The LLM plan of ``run`` (``shardplan.strategy.llm.layout_plan``: laid out, its
    objective left for ``simulate`` to price), its execution settings in it and where it came
    from in its ``imported_from`` field."""
    from dataclasses import replace

    from shardplan.errors import ShardplanError

    settings, notes = run.settings()
    for line in notes:
        note(line)
    try:
        from shardplan.strategy.llm import layout_plan
    except ImportError:
        raise ShardplanError("this shardplan has no LLM plan layout "
                             "(shardplan.strategy.llm.layout_plan)") from None
    plan = layout_plan(graph, topology, run.parallel, settings)
    meta = {**plan.meta, "imported_from": {
        "tool": run.source, "model": run.model.spec, "cluster": run.cluster,
        "micro_batch_size": run.micro_batch_size, "global_batch": run.global_batch,
        "execution": dict(run.execution), "notes": list(run.notes)}}
    return replace(plan, meta=meta)


def _finish(args: argparse.Namespace, run: Any, topology: Any) -> int:
    from shardplan.cli._common import print_json, with_provenance
    from shardplan.ir.io import write_json

    if topology is not None:
        from shardplan.ir.hardware import check_precision

        check_precision(topology, run.execution.get("precision", "fp32"))

    for line in run.notes:
        note(line)
    if args.json:
        print_json(run_json(run))
    if not args.output_dir:
        return 0
    from shardplan.capture import capture_spec

    graph = capture_spec(run.model.spec, batch_size=run.micro_batch_size,
                         seq_len=run.model.seq_len)
    plan = layout(graph, topology, run)
    objects = (graph, topology, with_provenance(plan))
    for name, obj in zip(_FILES, objects, strict=True):  # all three made, then written
        write_json(os.path.join(args.output_dir, name), obj)
    if not args.json:
        sys.stdout.write(f"wrote {', '.join(_FILES)} to {args.output_dir} ({run.summary()})\n")
    return 0
