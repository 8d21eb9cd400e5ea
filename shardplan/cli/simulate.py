"""``shardplan simulate PLAN GRAPH TOPO``: simulate one training iteration of a plan."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from shardplan.cli._common import (
    add_plan_inputs,
    add_settings_arguments,
    declare_files,
    load_plan_inputs,
    plan_settings,
    print_json,
)
from shardplan.cli._failures import add_failure_options, failure_report, print_failures
from shardplan.errors import ShardplanError

__all__ = ["add_simulation_options", "register", "simulation_kwargs"]


def add_simulation_options(p: argparse.ArgumentParser) -> None:
    """The options ``simulate`` and ``report`` share: the execution-setting flags (each
    overrides the plan's setting and says so) and a schedule file."""
    add_settings_arguments(p)
    p.add_argument("--schedule-file", metavar="FILE",
                   help="run this schedule instead: a CSV as --schedule-out writes it or "
                        "torch's _dump_csv / get_schedule_ops give it (F, B, I, W, "
                        "REDUCE_GRAD, OVERLAP_F_B; FILE.meta.json beside it is read too)")


def simulation_kwargs(args: argparse.Namespace, plan: Any, graph: Any) -> dict[str, Any]:
    """``simulate``'s keywords: the plan's settings with the flags' overrides (each change
    noted on stderr), and the schedule file's schedule when one is given."""
    _check_llm_overrides(args, plan)
    out: dict[str, Any] = {"settings": plan_settings(plan, graph, args)}
    if args.schedule_file:
        from shardplan.simulate import load_schedule

        out["schedule"] = load_schedule(args.schedule_file)
    return out


def _check_llm_overrides(args: argparse.Namespace, plan: Any) -> None:
    """``--recompute-every K`` needs full recompute (the plan's or ``--recompute full``).
    An LLM plan's virtual stages are its layout (``parallel.vp``, with its stages in the
    plan file): ``--virtual-stages`` cannot change them, and was silently ignored after a note
    saying it overrode them. One line instead, naming the flag."""
    every = getattr(args, "recompute_every", None)
    recompute = getattr(args, "recompute", None) or plan.settings.recompute
    if every is not None and every != 1 and recompute != "full":
        # the flag only thins full recompute; under any other it changed nothing
        raise ShardplanError(f"--recompute-every {every} thins full recompute (one block in "
                             f"{every}), and the recompute is {recompute}: add --recompute "
                             f"full")
    par = getattr(plan, "parallel", None)
    vp = getattr(args, "virtual_stages", None)
    if par is not None and vp is not None and vp != par.vp:
        raise ShardplanError(
            f"--virtual-stages {vp}: an LLM plan's virtual stages are its layout ({par.vp} "
            f"per pipeline rank in this plan's stages) and a flag cannot change them; plan "
            f"again with --virtual-stages {vp} (shardplan plan ... --virtual-stages {vp})")


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``simulate`` command to ``sub``."""
    p = sub.add_parser(
        "simulate", help="simulate a plan's training iteration",
        description="Simulate one training iteration of PLAN with its execution settings "
                    "(flags override them): per-stage compute from the cost model, "
                    "activations and gradients over the topology's routed and shared links, "
                    "ring all-reduce of each stage's gradients, optimizer step. Prints "
                    "iteration seconds, throughput, bubble fraction and peak memory per "
                    "device.")
    add_plan_inputs(p)
    add_simulation_options(p)
    p.add_argument("--timeline", metavar="FILE.png", help="draw the pipeline timeline here")
    p.add_argument("--schedule-out", metavar="FILE",
                   help="write the schedule run here as the CSV torch.distributed.pipelining "
                        "loads (_load_csv), its name and placement in FILE.meta.json")
    p.add_argument("--intervals", action="store_true",
                   help="with --json or -o: include every busy interval")
    p.add_argument("-o", "--output", metavar="FILE", help="write the result as JSON here")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_failure_options(p)
    declare_files(p, inputs=("plan", "graph", "topology", "schedule_file"),
                  outputs=("output", "schedule_out", "timeline"))
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from shardplan.ir import write_json
    from shardplan.simulate import simulate

    plan, graph, topology = load_plan_inputs(args)
    kw = simulation_kwargs(args, plan, graph)
    from shardplan.ir.hardware import check_precision

    check_precision(topology, kw["settings"].precision)
    result = simulate(plan, graph, topology, **kw)
    data = result.to_dict(timeline=args.intervals)
    failures = failure_report(args, plan, graph, topology, result)  # issue 48
    if failures is not None:
        data["failures"] = failures
    if plan.objective.lower_bound is not None:
        data["plan_lower_bound"] = plan.objective.lower_bound
    if args.schedule_out:
        from shardplan.simulate import save_schedule

        save_schedule(result.schedule, args.schedule_out)
    if args.timeline:
        from shardplan.report import timeline_png
        from shardplan.report._png import plan_label

        timeline_png(result, args.timeline, topology=topology,
                     title=f"{plan.graph} on {plan.topology}: {plan_label(plan)}")
    if args.output:
        write_json(args.output, data)
    if args.json:
        print_json(data)
    else:
        mem = f"peak memory {max(result.peak_memory_bytes) / 2**30:.2f} GiB"
        if result.device_memory_bytes:  # LLM plans on GPUs: as runs report it
            mem += (f" allocated, {max(result.reserved_memory_bytes) / 2**30:.2f} reserved, "
                    f"{max(result.device_memory_bytes) / 2**30:.2f} on the device")
        sys.stdout.write(
            f"{result.schedule.name}, {result.num_microbatches} micro-batches on "
            f"{len(result.devices)} devices: {result.iteration_seconds * 1e3:.3f} ms per "
            f"iteration, {result.throughput:.4g} samples/s, bubble "
            f"{result.bubble_fraction:.1%}, {mem}"
            f"{'' if result.fits_memory else ' (DOES NOT FIT)'}\n")
        print_failures(failures)
        for what, path in (("timeline", args.timeline), ("schedule", args.schedule_out),
                           ("result", args.output)):
            if path:
                sys.stdout.write(f"wrote {what} to {path}\n")
    return 0
