"""``shardplan train PLAN GRAPH TOPO --model SPEC --steps N``: run a plan for real.

Spawns one process per device of the plan (gloo on CPU with one thread each, NCCL with CUDA)
and trains with the plan's pipeline; ``--baseline fsdp|ddp|single`` trains the same model on
the same data with FSDP2, DDP (as many processes) or one process instead. Under ``torchrun``,
``python -m shardplan.runtime`` takes the same arguments and uses torchrun's processes.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from shardplan.cli._common import add_plan_inputs, load_plan_inputs, positive_float, positive_int

__all__ = ["add_arguments", "config_from_args", "register"]

_BASELINES = ("fsdp", "ddp", "single")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments shared by ``shardplan train`` and ``python -m shardplan.runtime``."""
    add_plan_inputs(p)
    p.add_argument("--model", default=None,
                   help="the model spec the graph was captured from (default: the graph's)")
    p.add_argument("--steps", type=positive_int, required=True, help="training iterations")
    p.add_argument("--schedule", choices=("gpipe", "1f1b", "interleaved-1f1b"),
                   default="gpipe")
    p.add_argument("--microbatches", type=positive_int, default=None,
                   help="micro-batches per step and replica (default: the number of stages)")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="global batch per step (default: the graph's)")
    p.add_argument("--seq-len", type=positive_int, default=16,
                   help="tokens per sample (language models)")
    p.add_argument("--lr", type=positive_float, default=1e-3)
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    p.add_argument("--seed", type=int, default=0, help="seeds the synthetic data")
    p.add_argument("--checkpoint-dir", default=None, metavar="D")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="K",
                   help="save every K steps (and after the last one)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest checkpoint in --checkpoint-dir")
    p.add_argument("--baseline", choices=_BASELINES, default=None,
                   help="train the same model with FSDP2, DDP or one process instead")
    p.add_argument("--nproc", type=positive_int, default=None,
                   help="processes of an fsdp/ddp baseline (default: the plan's devices)")
    p.add_argument("--timeout", type=positive_float, default=300.0,
                   help="seconds a collective may wait before the run fails")
    p.add_argument("-o", "--output", metavar="FILE", help="write the result here (atomically)")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``train`` command to ``sub``."""
    p = sub.add_parser(
        "train", help="run a plan with torch.distributed",
        description="Train MODEL for real with the plan's pipeline (or a baseline) on local "
                    "processes; prints or writes {\"losses\": [...], \"seconds_per_step\": "
                    "[...]}. Synthetic data of the model's input shape, seeded.")
    add_arguments(p)
    p.set_defaults(handler=_run)


def config_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~shardplan.runtime.TrainConfig` the arguments describe."""
    from shardplan.errors import ShardplanError
    from shardplan.runtime import TrainConfig, config_for_plan

    plan, graph, topology = load_plan_inputs(args)
    model = args.model or graph.meta.get("model")
    if not model:
        raise ShardplanError("the graph does not name its model: pass --model SPEC")
    common = dict(
        model=model, steps=args.steps, schedule=args.schedule,
        microbatches=args.microbatches or (1 if args.baseline else plan.num_stages),
        batch_size=args.batch_size or graph.batch_size, seq_len=args.seq_len, lr=args.lr,
        optimizer=args.optimizer, seed=args.seed, checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every, resume=args.resume, timeout=args.timeout)
    if args.checkpoint_every < 0:
        raise ShardplanError("--checkpoint-every must be >= 0")
    if args.baseline:
        devices = sum(len(st.devices) for st in plan.stages)
        nproc = 1 if args.baseline == "single" else (args.nproc or devices)
        return TrainConfig(kind=args.baseline, nproc=nproc, **common)
    return config_for_plan(plan, graph, **common)


def _run(args: argparse.Namespace) -> int:
    from shardplan.cli._common import emit
    from shardplan.runtime import train

    cfg = config_from_args(args)
    result = train(cfg)
    out = {**result.to_dict(), "kind": cfg.kind, "schedule": cfg.schedule,
           "processes": cfg.world_size, "microbatches": cfg.microbatches,
           "batch_size": cfg.batch_size}
    if args.output or args.json:
        emit(args, out, what="training result")
    else:
        for i, (loss, sec) in enumerate(zip(result.losses, result.seconds_per_step,
                                            strict=True)):
            sys.stdout.write(f"step {result.start_step + i + 1}: loss {loss:.6f}  "
                             f"{sec * 1e3:.2f} ms\n")
    return 0
