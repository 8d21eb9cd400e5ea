"""``simulate --failures RATE --checkpoint-interval MIN``: the expected goodput of a plan when
its devices fail, with and without re-planning (issue 48, item 4;
:mod:`shardplan.simulate._failures`).

With re-planning, one node of the plan is taken away -- the node of the plan's last device --
and ``replan`` answers (:func:`shardplan.planner._replan.replan`, within ``--replan-time-limit``);
its better answer for a failure (the best plan or the cheapest change, whichever loses less)
is the recovery: its step, its reshard there and back, its search, and whether the node held
state no survivor holds (then the run also goes back to the checkpoint).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from shardplan.cli._common import nonnegative_float, note, positive_float
from shardplan.errors import ShardplanError

__all__ = ["add_failure_options", "check_failure_args", "failure_lines", "failure_report",
           "prefer_resilient", "print_failures"]

#: Assumed minutes a restart from a checkpoint takes when ``--restart-minutes`` is not given.
DEFAULT_RESTART_MINUTES = 10.0


def add_failure_options(p: argparse.ArgumentParser) -> None:
    """The options of ``simulate --failures``."""
    g = p.add_argument_group("failures (expected goodput, issue 48)")
    g.add_argument("--failures", metavar="RATE",
                   help="failures per device per hour, or llama3 (the Llama 3 report's 419 "
                        "unexpected interruptions in 54 days on 16,384 GPUs: 1.97e-5): report "
                        "the expected goodput with and without re-planning")
    g.add_argument("--checkpoint-interval", type=positive_float, metavar="MIN",
                   help="minutes between checkpoints (needed with --failures)")
    g.add_argument("--checkpoint-seconds", type=nonnegative_float, metavar="S",
                   help="seconds a checkpoint takes to write (default: the largest "
                        "device's share of the state over its NIC)")
    g.add_argument("--restart-minutes", type=nonnegative_float, metavar="MIN",
                   help=f"minutes a restart from the checkpoint takes (default "
                        f"{DEFAULT_RESTART_MINUTES:g}, assumed)")
    g.add_argument("--repair-hours", type=nonnegative_float, metavar="H",
                   help="hours until the failed node, or a spare, joins the run again "
                        "(default: the restart's time: a spare joins as fast as a restart)")
    g.add_argument("--replan-time-limit", type=positive_float, default=10.0, metavar="SEC",
                   help="seconds the re-plan after a failure may search (default 10)")


def check_failure_args(args: argparse.Namespace) -> None:
    """The failure flags go together: one line (exit 2) otherwise."""
    if args.failures is None:
        for flag in ("checkpoint_interval", "checkpoint_seconds", "restart_minutes",
                     "repair_hours"):
            if getattr(args, flag) is not None:
                raise ShardplanError(f"--{flag.replace('_', '-')} needs --failures RATE")
    elif args.checkpoint_interval is None:
        raise ShardplanError("--failures needs --checkpoint-interval MIN")


def failure_report(args: argparse.Namespace, plan: Any, graph: Any, topology: Any,
                   result: Any, *, quick: bool = False) -> dict[str, Any] | None:
    """The ``failures`` object of ``simulate --json`` (None without ``--failures``): the
    model's figures, the goodput with and without re-planning, the recovery chosen, and the
    assumptions taken. ``quick``: the re-plan prices only the cheapest changes."""
    from shardplan.simulate._failures import goodput, parse_rate

    check_failure_args(args)
    if args.failures is None:
        return None
    rate = parse_rate(args.failures)
    step = float(result.iteration_seconds)
    model, assumed = _model(args, plan, graph, topology, rate, len(result.devices))
    recovery, how = (None, None)
    if plan.parallel is not None and rate > 0:
        recovery, how = _recovery(args, plan, graph, topology, step, model, quick=quick)
    elif plan.parallel is None:
        assumed["replan"] = "re-planning covers LLM plans: with and without are the same"
    good = goodput(step, model, recovery)
    out: dict[str, Any] = {"rate_per_device_hour": rate, "devices": model.devices,
                           "checkpoint_interval_seconds": model.checkpoint_interval,
                           "checkpoint_write_seconds": model.checkpoint_write,
                           "restart_seconds": model.restart, "repair_seconds": model.repair,
                           "step_seconds": step, **good.to_dict(), "assumed": assumed}
    if how is not None:
        out["replan"] = how
    return out


def _model(args: argparse.Namespace, plan: Any, graph: Any, topology: Any, rate: float,
           devices: int) -> tuple[Any, dict[str, str]]:
    """The :class:`~shardplan.simulate._failures.FailureModel` of the flags, and the
    defaults taken in words."""
    from shardplan.simulate._failures import FailureModel

    assumed: dict[str, str] = {}
    restart = args.restart_minutes
    if restart is None:
        restart = DEFAULT_RESTART_MINUTES
        assumed["restart"] = f"a restart takes {restart:g} min (--restart-minutes)"
    repair_h = args.repair_hours
    if repair_h is None:
        repair_h = restart / 60.0
        assumed["repair"] = ("the failed node or a spare joins as fast as a restart "
                             "(--repair-hours)")
    write = args.checkpoint_seconds
    if write is None:
        write, why = _write_seconds(plan, graph, topology)
        assumed["checkpoint"] = why
    return FailureModel(rate=rate, devices=devices,
                        checkpoint_interval=args.checkpoint_interval * 60.0,
                        checkpoint_write=write, restart=restart * 60.0,
                        repair=repair_h * 3600.0), assumed


def prefer_resilient(result: Any, args: argparse.Namespace, graph: Any, topology: Any
                     ) -> tuple[Any, list[str]]:
    """``plan --failures``: the first :data:`RERANKED` LLM rows that fit, ranked again by
    their expected seconds per useful step (step / goodput with re-planning, the re-plan
    pricing the cheapest changes only), each row's note saying its goodput; the winner the
    new first. ``(result, lines to print)``; the result unchanged without ``--failures``.
    O(rows x one quick re-plan)."""
    import math
    from dataclasses import replace

    from shardplan.ir import Plan

    check_failure_args(args)
    if args.failures is None:
        return result, []
    rows = list(result.ranked)
    top = [i for i, r in enumerate(rows[:RERANKED]) if r.fits
           and Plan.from_dict(r.plan).parallel is not None]
    scored = []
    for i in top:
        row = rows[i]
        plan = Plan.from_dict(row.plan)
        data = failure_report(args, plan, graph, topology, _Result(row, plan), quick=True)
        assert data is not None
        good = data["goodput_with_replan"]
        expected = row.iteration_seconds / good if good > 0 else math.inf
        note = f"{row.note}; goodput {good:.4f} under failures: {expected:.4g} s per " \
               f"useful step"
        scored.append((expected, i, replace(row, note=note)))
    if not scored:
        return result, ["--failures: no LLM plan to rank by its goodput"]
    order = [r for _, _, r in sorted(scored, key=lambda x: (x[0], x[1]))]
    for i, r in zip(sorted(top), order, strict=True):
        rows[i] = r
    from shardplan.planner._search import _comparisons

    winner = Plan.from_dict(rows[0].plan) if rows[0].fits else result.winner
    best = min(scored, key=lambda x: (x[0], x[1]))
    line = (f"ranked by expected seconds per useful step under {args.failures} failures per "
            f"device-hour (the first {len(top)} plans): the winner takes {best[0]:.4g} s")
    return replace(result, ranked=tuple(rows), winner=winner,
                   comparisons=_comparisons(rows)), [line]


#: Rows ``plan --failures`` ranks again by their goodput.
RERANKED = 5


class _Result:
    """What :func:`failure_report` reads of a simulation, for a ranked row."""

    def __init__(self, row: Any, plan: Any) -> None:
        self.iteration_seconds = row.iteration_seconds
        self.devices = range(plan.parallel.world_size)


def _write_seconds(plan: Any, graph: Any, topology: Any) -> tuple[float, str]:
    """The default checkpoint write time: every device writes its share of the state (the
    largest share bounds it) through its NIC at once."""
    if plan.parallel is None:
        return 0.0, "a checkpoint costs no time to write (--checkpoint-seconds)"
    from shardplan.planner._reshard import device_state_bytes, fabric_of

    st = plan.settings.resolve(graph)
    nbytes = device_state_bytes(graph, plan.parallel, st)
    bw = fabric_of(topology).inter_bandwidth
    secs = nbytes / bw
    return secs, (f"a checkpoint writes in {secs:.3g} s: the largest device's "
                  f"{nbytes / 2**30:.3g} GiB of state over its NIC (--checkpoint-seconds)")


def _recovery(args: argparse.Namespace, plan: Any, graph: Any, topology: Any, step: float,
              model: Any, *, quick: bool = False) -> tuple[Any, dict[str, Any] | None]:
    """The recovery after one node of the plan fails (module docstring)."""
    from shardplan.cli._replan_context import context_for
    from shardplan.planner._cluster_change import change_by_flags
    from shardplan.planner._replan import replan, reshard_back
    from shardplan.simulate._failures import Recovery, replan_loss

    last = topology.devices[plan.parallel.world_size - 1].name
    victim = last.rsplit("/", 1)[0] if "/" in last else last
    ctx, _ = context_for(plan, graph)
    try:
        change = change_by_flags(topology, remove=[victim])
        res = replan(graph, plan, change, ctx, time_limit=args.replan_time_limit,
                     search=not quick)
    except ShardplanError as exc:
        note(f"no re-plan after losing {victim}: {exc}")
        return None, {"failed_node": victim, "error": str(exc)}
    best = None
    for opt in (res.best, *res.changes):
        back = reshard_back(graph, res, opt)
        rec = Recovery(step_seconds=opt.iteration_seconds,
                       reshard_seconds=opt.reshard.seconds,
                       reshard_back_seconds=back.seconds, plan_seconds=res.search.seconds,
                       rollback=opt.reshard.checkpoint_bytes > 0)
        loss = replan_loss(step, model, rec)
        if best is None or loss < best[0]:
            best = (loss, rec, opt)
    assert best is not None
    _, rec, opt = best
    return rec, {"failed_node": victim, "kind": opt.kind, "layout": opt.parallel.label(),
                 "gpus": opt.parallel.world_size, "step_seconds": rec.step_seconds,
                 "reshard_seconds": rec.reshard_seconds,
                 "reshard_back_seconds": rec.reshard_back_seconds,
                 "plan_seconds": rec.plan_seconds, "rollback": rec.rollback}


def failure_lines(data: dict[str, Any]) -> list[str]:
    """The text ``simulate --failures`` prints under the iteration."""
    lam = data["failures_per_hour"]
    every = f", one every {1 / lam:.3g} h" if lam > 0 else ""
    lines = [f"failures: {data['rate_per_device_hour']:.3g} per device-hour x "
             f"{data['devices']:,} devices = {lam:.3g} per hour{every}; checkpoint every "
             f"{data['checkpoint_interval_seconds'] / 60:g} min",
             f"goodput without re-planning {data['goodput_without_replan']:.4f} (a failure "
             f"costs {data['seconds_lost_per_failure_restart'] / 60:.3g} min: half an "
             f"interval of work, the checkpoint's write, the restart)"]
    how = data.get("replan")
    if how and "layout" in how:
        used = "re-plans" if data["replan_chosen"] else "restarts (cheaper than re-planning)"
        lines.append(
            f"goodput with re-planning {data['goodput_with_replan']:.4f} (after losing "
            f"{how['failed_node']} it {used}: {how['kind']} {how['layout']} on "
            f"{how['gpus']:,} GPUs, {how['step_seconds']:.4g} s/step, reshard "
            f"{how['reshard_seconds']:.3g} s there and {how['reshard_back_seconds']:.3g} s "
            f"back, re-plan {how['plan_seconds']:.3g} s"
            f"{', back to the checkpoint' if how['rollback'] else ''}: "
            f"{data['seconds_lost_per_failure_replan'] / 60:.3g} min per failure)")
    else:
        lines.append(f"goodput with re-planning {data['goodput_with_replan']:.4f} (no re-plan)")
    if data["nodes_down"] > 0.5:
        lines.append(f"note: {data['nodes_down']:.2g} nodes are down at once on average: "
                     f"failures overlap, which this first-order estimate leaves out")
    if data["assumed"]:
        lines.append("assumed: " + "; ".join(data["assumed"].values()))
    return lines


def print_failures(data: dict[str, Any] | None) -> None:
    if data is not None:
        for line in failure_lines(data):
            sys.stdout.write(line + "\n")
