"""``shardplan train PLAN GRAPH TOPO --steps N``: run a plan for real.

Spawns one process per device of the plan (gloo on CPU with one thread each, NCCL with CUDA)
and trains with the plan's execution settings: a pipeline plan with the schedule the
simulator simulates, a strategy plan (PaSE, data-parallel, expert) with every layer split
over the devices as configured (DTensor), a hybrid plan as a pipeline whose stages do so;
``--baseline fsdp|ddp|single`` trains the same model on the same data with FSDP2, DDP or one
process instead. Under ``torchrun``, ``python -m shardplan.runtime`` takes the
same arguments (:mod:`shardplan.runtime._args`) and uses torchrun's processes.
"""

from __future__ import annotations

import argparse
import sys

from shardplan.cli._common import declare_files, note
from shardplan.runtime._args import add_arguments, config_from_args

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``train`` command to ``sub``."""
    p = sub.add_parser(
        "train", help="run a plan with torch.distributed",
        description="Train the graph's model for real with the plan's pipeline, micro-batching "
                    "and schedule (or a baseline) on local processes; prints or writes "
                    "{\"losses\": [...], \"seconds_per_step\": [...], \"settings\": {...}}. "
                    "Synthetic data of the graph's input shapes, seeded.")
    add_arguments(p)
    declare_files(p, inputs=("plan", "graph", "topology", "model"), outputs=("output",))
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from shardplan._ranks import Terminated
    from shardplan.cli._common import emit
    from shardplan.runtime import train

    prepared = config_from_args(args)
    for line in prepared.notes:
        note(line)
    cfg = prepared.config
    try:
        result = train(cfg)
    except Terminated as exc:
        sys.stderr.write(f"shardplan: error: {exc}: the {cfg.world_size} training "
                         f"process{'es were' if cfg.world_size > 1 else ' was'} stopped and "
                         f"the temporary folder removed\n")
        return 128 + exc.signum
    if result.replicated:
        shown = ", ".join(result.replicated[:4])
        more = f" and {len(result.replicated) - 4} more" if len(result.replicated) > 4 else ""
        note(f"{len(result.replicated)} operator{'s' if len(result.replicated) > 1 else ''} "
             f"ran whole on every device of {'their' if len(result.replicated) > 1 else 'its'} "
             f"stage ({shown}{more}): no DTensor rule for it, or random")
    out = {**result.to_dict(), **prepared.summary()}
    if args.output or args.json:
        emit(args, out, what="training result")
    else:
        for i, (loss, sec) in enumerate(zip(result.losses, result.seconds_per_step,
                                            strict=True)):
            sys.stdout.write(f"step {result.start_step + i + 1}: loss {loss:.6f}  "
                             f"{sec * 1e3:.2f} ms\n")
    return 0
