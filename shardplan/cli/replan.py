"""``shardplan replan PLAN``: the best plan for the cluster as it is now, and the cheapest
change that keeps training (issue 48; :mod:`shardplan.planner._replan`).

The cluster now is the plan's (the ``replan`` object ``plan -o`` writes names it, or
``--old-cluster``) less the devices removed (``--remove NAME,...``: devices or nodes by name;
``--remove-nodes K``, ``--remove-gpus N``: the last ones) and with the nodes added
(``--add-nodes K``, ``--add-gpus N``), or a topology of its own (``--cluster``: devices
matched by name). ``-o`` writes the chosen plan (``--mode best`` or ``cheapest``) and
``--topology-out`` the topology it runs on: its device i runs rank i, the surviving devices
in the order that keeps the most state in place.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from shardplan._argtypes import size_int
from shardplan.cli._common import (
    declare_files,
    note,
    positive_float,
    print_json,
    split_names,
    time_left,
    with_provenance,
)
from shardplan.errors import ShardplanError

__all__ = ["register"]

#: Seconds ``replan`` takes when no ``--time-limit`` is given (issue 48's answer at 16,384
#: GPUs within 10 s).
DEFAULT_TIME_LIMIT = 10.0

#: Topologies above this many devices are written in their generator form (``pairs``).
COMPACT_ABOVE = 1024


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``replan`` command to ``sub``."""
    p = sub.add_parser(
        "replan", help="re-plan an LLM plan for the cluster as it is now",
        description="Given an LLM plan and the devices removed or added since (or the "
                    "cluster now), find the best plan for the new cluster -- a search "
                    "warm-started from the first search's priced layouts -- and the "
                    "cheapest change that keeps training (the same layout on a spare, "
                    "fewer replicas, the pipeline re-cut), each with the degrees it moves, "
                    "the bytes each device receives over NVLink, the network or from the "
                    "checkpoint, and the time to reshard beside the time per step.")
    p.add_argument("plan", metavar="PLAN", help="the LLM plan running now (plan -o writes "
                   "what the re-plan reuses)")
    g = p.add_argument_group("what changed")
    g.add_argument("--remove", metavar="NAME,...", type=split_names, default=[],
                   help="devices gone, by name (node3/gpu1) or by node (node3)")
    g.add_argument("--remove-nodes", type=size_int("devices"), default=0, metavar="K",
                   help="the last K nodes are gone")
    g.add_argument("--remove-gpus", type=size_int("devices"), default=0, metavar="N",
                   help="the last N devices are gone")
    g.add_argument("--add-nodes", type=size_int("devices"), default=0, metavar="K",
                   help="K nodes like the cluster's last joined")
    g.add_argument("--add-gpus", type=size_int("devices"), default=0, metavar="N",
                   help="N GPUs joined (whole nodes)")
    g.add_argument("--cluster", metavar="TOPO", help="the cluster now: a topology file or a "
                   "builder spec (devices matched to the old ones by name)")
    p.add_argument("--old-cluster", metavar="TOPO", help="the cluster the plan was made for "
                   "(default: the one its first search names)")
    p.add_argument("--graph", metavar="GRAPH", help="the model's graph (default: the first "
                   "search's model, captured again)")
    p.add_argument("--global-batch", type=size_int("batch"), metavar="B",
                   help="train at another global batch from now on (default: the plan's)")
    p.add_argument("--checkpoint", metavar="DIR", help="the old plan's checkpoint folder "
                   "(train --checkpoint-dir): where state no survivor holds is read from")
    p.add_argument("--storage-bandwidth", type=positive_float, metavar="BYTES_PER_S",
                   help="the aggregate bandwidth of the checkpoint's storage (default: "
                        "not a limit; each device reads at its NIC's rate)")
    p.add_argument("--mode", choices=("best", "cheapest"), default="best",
                   help="which plan -o writes: the best for the new cluster (default) or "
                        "the cheapest change that keeps training")
    p.add_argument("--time-limit", type=positive_float, metavar="SEC",
                   help=f"answer within SEC seconds (default {DEFAULT_TIME_LIMIT:g})")
    p.add_argument("-o", "--output", metavar="FILE", help="write the chosen plan here")
    p.add_argument("--topology-out", metavar="FILE", help="write the chosen plan's "
                   "topology here (needed with -o: its device order is the plan's)")
    p.add_argument("--moves", metavar="FILE.csv", help="write what every device of the "
                   "chosen plan receives, by link, as CSV")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    declare_files(p, inputs=("plan", "cluster", "old_cluster", "graph", "checkpoint"),
                  outputs=("output", "topology_out", "moves"))
    p.set_defaults(handler=_run)


def _check_args(args: argparse.Namespace) -> None:
    flags = (args.remove or args.remove_nodes or args.remove_gpus or args.add_nodes
             or args.add_gpus)
    if args.cluster and flags:
        raise ShardplanError("give the cluster now either as --cluster or as what changed "
                             "(--remove..., --add...), not both")
    if not args.cluster and not flags:
        raise ShardplanError("say what changed: --remove NAME,..., --remove-nodes K, "
                             "--remove-gpus N, --add-nodes K, --add-gpus N, or --cluster TOPO")
    if args.output and not args.topology_out:
        raise ShardplanError("-o needs --topology-out FILE too: the new plan runs on the "
                             "surviving devices in the order that file gives")
    outs = [x for x in (args.output, args.topology_out, args.moves) if x]
    if len(set(outs)) != len(outs):
        raise ShardplanError("-o, --topology-out and --moves must name different files")


def _change(args: argparse.Namespace, old: Any) -> Any:
    from shardplan.planner._cluster_change import change_by_flags, change_to

    if args.cluster:
        from shardplan.cli.plan import _cluster

        return change_to(old, _cluster(args.cluster))
    return change_by_flags(old, remove=args.remove, remove_nodes=args.remove_nodes,
                           remove_gpus=args.remove_gpus, add_nodes=args.add_nodes,
                           add_gpus=args.add_gpus)


def _run(args: argparse.Namespace) -> int:
    from shardplan.cli._replan_context import context_for
    from shardplan.cli._replan_inputs import checkpoint_info, graph_for, old_cluster
    from shardplan.ir import load_plan
    from shardplan.planner._replan import replan

    _check_args(args)
    plan = load_plan(args.plan)
    if plan.parallel is None:
        raise ShardplanError(f"{args.plan} is not an LLM plan (no 'parallel' layout): replan "
                             f"re-plans the LLM plans 'shardplan plan' writes for transformers")
    ckpt = checkpoint_info(args.checkpoint, plan) if args.checkpoint else None
    ctx, kept = context_for(plan)
    if not kept:
        note(f"{args.plan} keeps no first search (write plans with 'shardplan plan -o'): "
             f"nothing to reuse but the plan itself")
    if args.global_batch is not None and args.global_batch != ctx.global_batch:
        from dataclasses import replace

        note(f"--global-batch {args.global_batch} replaces the plan's {ctx.global_batch}: "
             f"the run trains on another batch from now on")
        ctx = replace(ctx, global_batch=args.global_batch)
    graph = graph_for(args, plan, ctx)
    old = old_cluster(args, plan, ctx)
    if plan.topology and plan.topology != old.name:
        note(f"the plan was made for cluster {plan.topology!r}; its ranks are taken to run "
             f"on {old.name!r}'s devices in order")
    change = _change(args, old)
    limit = DEFAULT_TIME_LIMIT if args.time_limit is None else args.time_limit
    result = replan(graph, plan, change, ctx, time_limit=time_left(limit) or limit,
                    storage_bandwidth=args.storage_bandwidth)
    chosen = result.best if args.mode == "best" or result.cheapest is None \
        else result.cheapest
    if args.mode == "cheapest" and result.cheapest is None:
        note("no minimal change fits the surviving devices: -o writes the best plan")
    lost = chosen.reshard.checkpoint_bytes
    if lost > 0 and ckpt is None:
        note(f"{lost / 2**30:,.1f} GiB of the optimizer state was held only by removed "
             f"devices: it comes from the last checkpoint, and the run goes back to it "
             f"(--checkpoint DIR names it)")
    _write(args, result, chosen, graph, ctx)
    data = result.to_dict()
    data["chosen"] = args.mode if chosen is not result.best else "best"
    if ckpt is not None:
        data["checkpoint"] = ckpt
    if args.json:
        print_json(data)
    else:
        _print(result, args, ckpt)
    return 0


def _write(args: argparse.Namespace, result: Any, chosen: Any, graph: Any, ctx: Any) -> None:
    """The chosen plan (with a context of its own, so it can be re-planned in turn), its
    topology, and the per-device moves."""
    from dataclasses import replace

    from shardplan.ir import save, write_atomic, write_json
    from shardplan.planner._replan import CONTEXT_CANDIDATES, CONTEXT_KEY, ReplanContext

    if args.output:
        import os

        fits = tuple(c for c in result.search.ranked if c.fits)[:CONTEXT_CANDIDATES]
        new_ctx = ReplanContext(
            global_batch=ctx.global_batch, settings=ctx.settings, candidates=fits,
            model=ctx.model, model_is_file=ctx.model_is_file, batch_size=ctx.batch_size,
            seq_len=ctx.seq_len, cluster=os.path.abspath(args.topology_out),
            topology=chosen.topology.name)
        plan = replace(chosen.plan, meta={**chosen.plan.meta, CONTEXT_KEY: new_ctx.to_dict()})
        save(with_provenance(plan), args.output)
    if args.topology_out:
        topo = chosen.topology
        dense = None if topo.num_devices <= COMPACT_ABOVE or topo.pair_model is None else False
        write_json(args.topology_out, topo.to_dict(dense=dense))
    if args.moves:
        rows = ["rank,device,old_rank,kept_bytes,nvlink_bytes,network_bytes,"
                "checkpoint_bytes,seconds"]
        per = chosen.reshard.per_rank
        base = result.change.base
        world = result.old_parallel.world_size
        old_of = {int(d): r for r, d in enumerate(result.change.old_devices[:world])
                  if d >= 0}
        for r, d in enumerate(chosen.devices):
            was = old_of.get(int(d), -1)
            rows.append(f"{r},{base.devices[int(d)].name},{was},{per['kept'][r]:.0f},"
                        f"{per['nvlink'][r]:.0f},{per['network'][r]:.0f},"
                        f"{per['checkpoint'][r]:.0f},{per['seconds'][r]:.6g}")
        write_atomic(args.moves, "\n".join(rows) + "\n")
    del graph


def _runs(runs: list[list[int]]) -> str:
    return ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in runs)


def _blocks_line(moves: Any, shown: int = 3) -> str:
    """Where the best plan's blocks come from, for its first pipeline ranks."""
    parts = [f"PP {m['pp']} holds {_runs(m['blocks'])} (from " + ", ".join(
        f"PP {q}: {_runs(r)}" for q, r in m["from"].items()) + ")" for m in moves[:shown]]
    more = f"; ... {len(moves) - shown} more" if len(moves) > shown else ""
    return ("blocks by new pipeline rank: " + "; ".join(parts) + more
            + " (--json: every rank; --moves: every device's bytes)")


def _gib(x: float) -> str:
    from shardplan.cli._llm_table import plain

    return plain(x / 2**30, 4)


def _print(result: Any, args: argparse.Namespace, ckpt: dict[str, Any] | None) -> None:
    """The answer in a table: the plan before, the best plan, each minimal change; then
    what the best moves, how it weighs against the cheapest, what was reused."""
    from rich.console import Console
    from rich.table import Table

    from shardplan.cli._llm_table import plain

    ch = result.change
    gone = f"{len(ch.removed)} removed" if ch.removed else ""
    came = f"{len(ch.added)} added" if ch.added else ""
    head = (f"cluster {ch.old.name}: {ch.old.num_devices:,} -> {ch.num_alive:,} devices "
            f"({', '.join(x for x in (gone, came) if x)}); global batch "
            f"{result.best.plan.settings.global_batch}")
    table = Table(title=head)
    for col in ("", "layout", "GPUs", "s/step", "vs before", "moved GiB", "NVLink / net / "
                "ckpt GiB", "max GiB/GPU", "reshard s"):
        table.add_column(col, justify="left" if col in ("", "layout") else "right",
                         no_wrap=True)
    old = result.old_parallel
    table.add_row("before", old.label(), f"{old.world_size:,}",
                  plain(result.old_seconds), "", "", "", "", "")
    for label, opt in (("best", result.best), *((o.kind, o) for o in result.changes)):
        rs = opt.reshard
        vs = opt.iteration_seconds / result.old_seconds - 1 if result.old_seconds > 0 else 0
        table.add_row(label + (f" (= {', '.join(opt.kinds)})" if label == "best" and opt.kinds
                               else ""),
                      opt.parallel.label(), f"{opt.parallel.world_size:,}",
                      plain(opt.iteration_seconds), f"{vs:+.1%}" if math.isfinite(vs) else "",
                      _gib(rs.moved_bytes), f"{_gib(rs.nvlink_bytes)} / "
                      f"{_gib(rs.network_bytes)} / {_gib(rs.checkpoint_bytes)}",
                      _gib(rs.max_receive_bytes), plain(rs.seconds))
    for u in result.unfit:
        table.add_row(u["kind"], u["layout"], f"{u['gpus']:,}", "no fit", "", "", "", "", "")
    Console(file=sys.stdout, width=max(180, Console().width)).print(table)
    for line in _lines(result, args, ckpt):
        sys.stdout.write(line + "\n")


def _lines(result: Any, args: argparse.Namespace, ckpt: dict[str, Any] | None) -> list[str]:
    from shardplan.cli._llm_table import plain

    best = result.best
    out = []
    if result.idle:
        out.append(f"{result.idle:,} devices idle: the best layout uses "
                   f"{best.parallel.world_size:,} of the {result.change.num_alive:,} (a layout "
                   f"takes tp x cp x pp x dp devices, dp dividing the global batch; the "
                   f"largest count any layout uses here is {result.search.counts[0]:,})"
                   if result.search.counts else f"{result.idle:,} devices idle")
    for u in result.unfit:
        if math.isfinite(u["memory_bytes"]):
            out.append(f"{u['kind']} ({u['layout']}) does not fit: "
                       f"{u['memory_bytes'] / 2**30:.1f} GiB per GPU of "
                       f"{u['capacity_bytes'] / 2**30:.1f}")
    out.append("best moves: " + (", ".join(best.moved) or "nothing (the same layout)"))
    if best.moved:
        out.append(_blocks_line(best.blocks))
    d = result.to_dict().get("best_vs_cheapest")
    if d is not None and result.cheapest is not best:
        saved = d["seconds_saved_per_step"]
        extra = d["extra_reshard_seconds"]
        steps = max(1, math.ceil(d["break_even_steps"]))
        pays = (f"pays off after {steps:,} step{'s' if steps > 1 else ''}" if extra > 0
                else "no slower to reach")
        out.append(f"best against the cheapest change ({result.cheapest.kind}): "
                   f"{plain(saved)} s saved per step for {plain(max(extra, 0.0))} s more "
                   f"resharding: {pays}")
    s = result.search
    timed = " (the time limit stopped it)" if s.timed_out else ""
    out.append(f"searched {s.priced:,} of {s.offered:,} layouts on "
               f"{len(s.counts)} device counts, simulated {s.simulated}, in "
               f"{s.seconds:.1f} s{timed}; reused: {result.reused['first_search_layouts']} "
               f"layouts of the first search (they order the search; "
               f"{result.reused['times_kept']} kept their times unsimulated), its training "
               f"settings and global batch")
    if ckpt is not None:
        out.append(f"checkpoint {ckpt['checkpoint']} (step {ckpt['step']}): state no "
                   f"survivor holds is read from it")
    for what, path in (("plan", args.output), ("topology", args.topology_out),
                       ("moves", args.moves)):
        if path:
            out.append(f"wrote {what} to {path}")
    return out
