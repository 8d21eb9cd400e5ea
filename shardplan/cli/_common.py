"""Shared pieces of the command line: the parser that fails in one line, output helpers."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NoReturn

from shardplan._argtypes import nonnegative_int, positive_float, positive_int, size_int
from shardplan.errors import ShardplanError
from shardplan.ir.io import dumps, write_json

__all__ = ["SETTING_FLAGS", "OneLineParser", "add_output", "add_settings_arguments",
           "declare_files", "emit", "note_unused_devices",
           "nonnegative_float", "nonnegative_int", "note", "plan_settings", "settings_changes",
           "parse_float_list", "parse_int_list", "parse_nonnegative_float_list",
           "positive_float", "positive_int", "print_json", "set_command_start", "set_quiet",
           "split_names", "time_left", "with_provenance"]

#: ``time.monotonic()`` when the running command started (set by :func:`shardplan.cli.main`),
#: so that ``--time-limit`` covers the whole command: start-up, loading the files, the search
#: and writing the result.
_COMMAND_START: float | None = None

#: Share of a time limit kept for what follows the search (checking and writing the plan).
_WRITE_SHARE = 0.03


def set_command_start(when: float | None) -> None:
    """Record when the running command started (``time.monotonic``); None: not known."""
    global _COMMAND_START
    _COMMAND_START = when


def time_left(time_limit: float | None) -> float | None:
    """What remains of the command's ``--time-limit`` for a search: the limit less the time
    since the command started (interpreter start-up and file loading included) and a small
    share kept for writing the result. Never below 1 ms: a search out of time still returns
    its first plan, with status ``timed_out``. None stays None."""
    if time_limit is None:
        return None
    spent = 0.0 if _COMMAND_START is None else time.monotonic() - _COMMAND_START
    return max(time_limit * (1.0 - _WRITE_SHARE) - spent, 1e-3)


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:  # noqa: D401 - argparse API
        sys.stderr.write(f"shardplan: error: {message}\n")
        sys.exit(2)


def emit(args: argparse.Namespace, obj: Any, *, what: str) -> None:
    """Write ``obj`` to ``args.output`` atomically, or print it as JSON with ``--json``.

    Prints one line saying where the output went when writing a file.
    """
    out = getattr(args, "output", None)
    as_json = getattr(args, "json", False)
    if not out and not as_json:
        raise ShardplanError(f"say where the {what} goes: -o FILE or --json")
    if out:
        write_json(out, with_provenance(obj))
        if not as_json:
            print(f"wrote {what} to {out}")
    if as_json:
        sys.stdout.write(dumps(obj) + "\n")


_QUIET = False


def set_quiet(quiet: bool) -> None:
    """``-q``: :func:`note` prints nothing."""
    global _QUIET
    _QUIET = bool(quiet)


def with_provenance(obj: Any) -> Any:
    """A plan with the sha256 of every input file the command read in its ``inputs``
    (its ``shardplan_version`` is written with every plan); anything else unchanged."""
    from shardplan.ir import Plan
    from shardplan.ir.io import inputs_read

    if not isinstance(obj, Plan):
        return obj
    from dataclasses import replace

    return replace(obj, meta={**obj.meta, "inputs": inputs_read()})


def note(message: str) -> None:
    """One line ``shardplan: note: ...`` on stderr: something the user should know that is
    not an error (a flag overriding a plan's setting, a fallback taken). Silent under
    ``-q``."""
    if not _QUIET:
        sys.stderr.write(f"shardplan: note: {message}\n")


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def nonnegative_float(text: str) -> float:
    """A finite number >= 0 (latencies, degrees)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not (v >= 0.0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return v


def parse_nonnegative_float_list(text: str) -> tuple[float, ...]:
    """``"0,1e-6"`` -> ``(0.0, 1e-06)``; every entry a finite number >= 0."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected numbers like 1e-6,2e-5, got {text!r}")
    return tuple(nonnegative_float(p.strip()) for p in parts)


def parse_int_list(text: str) -> tuple[int, ...]:
    """``"2,4,3"`` or ``"2x4x3"`` -> ``(2, 4, 3)``; every entry a positive integer."""
    parts = [p for p in text.replace("x", ",").split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected integers like 4x4 or 2,4, got {text!r}")
    return tuple(positive_int(p.strip()) for p in parts)


def parse_float_list(text: str) -> tuple[float, ...]:
    """``"1e9,2.5e10"`` -> ``(1e9, 2.5e10)``; every entry a positive number."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected numbers like 1e9,2e10, got {text!r}")
    return tuple(positive_float(p.strip()) for p in parts)


def declare_files(p: argparse.ArgumentParser, *, inputs: tuple[str, ...] = (),
                  outputs: tuple[str, ...] = ()) -> None:
    """Name the arguments (by ``dest``) of a command that are its input files and its
    outputs. Before the command runs, :func:`shardplan.cli.main.main` tells the writer the
    inputs (:func:`shardplan.ir.io.declare_inputs`; a model spec ``FILE.py:FN`` names
    ``FILE.py``) and checks every output against them and against the writer's rules
    (:func:`shardplan.ir.io.output_target`), so a refused output costs no search. Every
    command declares both, empty or not (a test holds them to it)."""
    p.set_defaults(input_args=tuple(inputs), output_args=tuple(outputs))


def add_output(p: argparse.ArgumentParser, *, json_flag: bool = True) -> None:
    p.add_argument("-o", "--output", metavar="FILE", help="write the result here (atomically)")
    if json_flag:
        p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")


def split_names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


@contextmanager
def progress_reporter(labels: Mapping[str, str] | None = None
                      ) -> Iterator[Callable[[str, float, float], None] | None]:
    """A ``progress(label, done, total)`` callback drawing rich bars on stderr when it is a
    terminal (one bar per label, renamed through ``labels``); None otherwise, so that logs
    and pipes stay quiet."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    names = dict(labels or {})
    with Progress(TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.completed:.4g}/{task.total:.4g}"), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        tasks: dict[str, Any] = {}

        def update(label: str, done: float, total: float) -> None:
            if label not in tasks:
                tasks[label] = bar.add_task(names.get(label, label), total=total)
            bar.update(tasks[label], completed=done, total=total)

        yield update


def _fraction(text: str) -> float:
    """A number in (0, 1] (argparse names the flag before the line)."""
    v = positive_float(text)
    if v > 1:
        raise argparse.ArgumentTypeError(f"a fraction in (0, 1], got {text!r}")
    return v


#: The execution-setting flags (``ExecutionSettings`` fields): dest -> (flag, keywords).
SETTING_FLAGS: dict[str, tuple[str, dict[str, Any]]] = {
    "microbatch_size": ("--microbatch-size", {
        "type": size_int("batch"), "metavar": "B",
        "help": "samples per micro-batch, shared by a stage's replicas (default: the graph's "
                "batch size)"}),
    "global_batch": ("--global-batch", {
        "type": size_int("batch"), "metavar": "B",
        "help": "samples per iteration (sets the micro-batch size to B / micro-batches)"}),
    "microbatches": ("--microbatches", {"type": size_int("microbatches"), "metavar": "M",
                                        "help": "micro-batches per iteration (default 8)"}),
    "schedule": ("--schedule", {"choices": ("gpipe", "1f1b", "interleaved-1f1b"),
                                "help": "pipeline schedule (default 1f1b)"}),
    "virtual_stages": ("--virtual-stages", {"type": size_int("degree"), "metavar": "V",
                                            "help": "interleaved-1f1b: stages per rank "
                                                    "(default 2)"}),
    "recompute": ("--recompute", {"nargs": "?", "const": "full",
                                  "choices": ("none", "selective", "op", "full"),
                                  "help": "activation recomputation: full (the backward "
                                          "re-runs the forward; plain --recompute), "
                                          "selective (attention's softmax and dropout "
                                          "only, Megatron-LM's), op (torchtitan's per-op "
                                          "policy: every other matrix product and the "
                                          "elementwise operators); selective and op are "
                                          "priced as none outside the LLM plan kind; "
                                          "none (default)"}),
    "precision": ("--precision", {"choices": ("fp32", "bf16", "fp16", "fp8"),
                                  "help": "training precision: matrix products at the "
                                          "device's fp32, tensor-core (bf16/fp16) or fp8 "
                                          "rate (H100 only); half and fp8 keep 2-byte "
                                          "weights and gradients beside fp32 master "
                                          "weights and optimizer state (default fp32)"}),
    "gradient_sync": ("--gradient-sync", {
        "choices": ("end", "bucketed", "sharded", "zero1"),
        "help": "how replicas synchronise gradients: end (one all-reduce after the last "
                "backward, default), bucketed (DDP), sharded (FSDP / ZeRO-3), zero1 (the "
                "distributed optimizer: reduce-scatter, a sharded step, all-gather)"}),
    "sequence_parallel": ("--sequence-parallel", {
        "action": "store_const", "const": True,
        "help": "Megatron's sequence parallelism (recorded; the LLM plan kind prices it)"}),
    "tp_comm_overlap": ("--tp-comm-overlap", {
        "action": "store_const", "const": True,
        "help": "Megatron's tensor-parallel communication overlap (recorded; the LLM plan "
                "kind prices it)"}),
    "attention": ("--attention", {
        "choices": ("flash", "materialized"),
        "help": "LLM plans: the attention kernel (flash, default: no s x s scores in memory; "
                "materialized: Megatron-LM's 2020-2022 fused softmax, which writes and keeps "
                "them)"}),
    "recompute_every": ("--recompute-every", {
        "type": positive_int, "metavar": "K",
        "help": "with --recompute full, checkpoint every K-th transformer block only "
                "(torchtitan's selective_ac_option K; default 1: every block)"}),
    "grad_reduce": ("--grad-reduce", {
        "choices": ("param", "fp32"),
        "help": "LLM plans: the precision gradients are reduced in (param, default: the "
                "parameters'; fp32: Megatron's fp32 gradient accumulation, FSDP2's fp32 "
                "reduce_dtype)"}),
    "shard_unit": ("--shard-unit", {
        "choices": ("block", "module"),
        "help": "LLM plans under FSDP: what is gathered at a time (block, default: one "
                "transformer block, as FSDP2 and Megatron FSDP; module: each sub-module, as "
                "DeepSpeed ZeRO-3)"}),
    "stack": ("--stack", {
        "choices": ("megatron", "megatron-core", "megatron-deepspeed", "torchtitan"),
        "help": "LLM plans: the software that runs the plan, where it prices differently "
                "(megatron, default: Megatron-LM's own modules; megatron-core: Megatron-Core "
                "with Transformer Engine, as Megatron-LM and NeMo run today; "
                "megatron-deepspeed: DeepSpeed's pipeline engine and ZeRO optimizer; "
                "torchtitan)"}),
    "expandable_segments": ("--expandable-segments", {
        "action": "store_const", "const": True,
        "help": "LLM plans: the run sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                "(the allocator reserves little beyond its tensors; torchtitan's launcher "
                "sets it)"}),
    "optimizer": ("--optimizer", {"choices": ("sgd", "sgd-momentum", "momentum", "adam",
                                              "adamw"),
                                  "help": "optimizer whose state and step are counted "
                                          "(default adam)"}),
    "efficiency": ("--efficiency", {"type": _fraction, "metavar": "F",
                                    "help": "fraction of peak FLOP/s reached, in (0, 1] "
                                            "(default: peak)"}),
    "overlap": ("--no-overlap", {"action": "store_const", "const": False,
                                 "help": "devices cannot compute while they communicate"}),
}


def add_settings_arguments(p: argparse.ArgumentParser,
                           skip: tuple[str, ...] = ()) -> None:
    """The execution-setting flags (all default None: the plan's value, or the default)."""
    for dest, (flag, kw) in SETTING_FLAGS.items():
        if dest not in skip:
            p.add_argument(flag, dest=dest, default=None, **kw)


def settings_changes(args: argparse.Namespace) -> dict[str, Any]:
    """The execution settings a user set on the command line."""
    return {dest: getattr(args, dest) for dest in SETTING_FLAGS
            if getattr(args, dest, None) is not None}


def plan_settings(plan: Any, graph: Any, args: argparse.Namespace) -> Any:
    """The plan's execution settings with the command line's overrides, each override that
    changes a plan value announced in one line (:func:`note`)."""
    settings, notes = plan.settings.override(**settings_changes(args))
    for line in notes:
        note(line)
    return settings.resolve(graph)


def add_plan_inputs(p: argparse.ArgumentParser) -> None:
    """The positional ``PLAN GRAPH TOPO`` of the commands that work on a plan."""
    p.add_argument("plan", metavar="PLAN", help="plan file (shardplan.plan/1)")
    p.add_argument("graph", metavar="GRAPH", help="graph file (shardplan.graph/1)")
    p.add_argument("topology", metavar="TOPO", help="topology file (shardplan.topology/1)")


def note_unused_devices(plan: Any, topology: Any, what: str) -> None:
    """One :func:`note` when ``plan`` uses fewer devices than ``topology`` has (a plan for 2
    devices given a 4-device topology): ``what`` (the export, the run) covers only the
    plan's devices, and the plan may have been made for another topology."""
    used = {int(d) for st in plan.stages for d in st.devices}
    n = int(topology.num_devices)
    if len(used) < n:
        made = f" (it was made for {plan.topology!r})" if plan.topology and \
            plan.topology != topology.name else ""
        note(f"the plan uses {len(used)} of the {n} devices of topology {topology.name!r}"
             f"{made}: {what} covers those {len(used)}")


def load_plan_inputs(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """``(plan, graph, topology)`` from ``args.plan``, ``args.graph``, ``args.topology``,
    the plan checked against the other two (one-line error if it does not fit them)."""
    from shardplan.ir import load_graph, load_plan, load_topology

    plan = load_plan(args.plan)
    graph = load_graph(args.graph)
    topology = load_topology(args.topology)
    plan.validate(graph, topology)
    return plan, graph, topology
