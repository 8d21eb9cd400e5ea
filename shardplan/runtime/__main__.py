"""``torchrun --nnodes N --nproc-per-node P ... -m shardplan.runtime PLAN GRAPH TOPO --steps
N [...]``: the same run as ``shardplan train``, on torchrun's processes.

Rendezvous, rank and world size come from torchrun's environment (``init_process_group``
with ``env://``); nothing home-made. Global rank ``g`` runs the ``g``-th device of the plan
(devices in increasing order), so with ``--nnodes 2 --nproc-per-node 2`` node 0 runs the
first two devices. Rank 0 prints the notes and the result (``--json``: one JSON object).
Exit status: 0, or 2 with one ``shardplan: error: ...`` line for a user error (checked
before joining the group where possible); any other failure propagates so that torchrun
stops the other ranks.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from shardplan.errors import ShardplanError

_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # noqa: D401 - argparse API
        sys.stderr.write(f"shardplan: error: {message}\n")
        sys.exit(2)


def _fail(message: str) -> int:
    sys.stderr.write(f"shardplan: error: {message}\n")
    return 2


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from shardplan.runtime._args import add_arguments, config_from_args

    parser = _Parser(prog="python -m shardplan.runtime",
                     description="Run a plan under torchrun (see shardplan train).")
    add_arguments(parser)
    args = parser.parse_args(argv)
    missing = [v for v in _TORCHRUN_ENV if v not in os.environ]
    if missing:
        return _fail(f"python -m shardplan.runtime runs under torchrun ({', '.join(missing)} "
                     f"not set); on one machine use shardplan train")
    rank_env = int(os.environ["RANK"])
    try:
        prepared = config_from_args(args)
        cfg = prepared.config
        world_env = int(os.environ["WORLD_SIZE"])
        if cfg.world_size != world_env:
            raise ShardplanError(f"this run needs {cfg.world_size} processes, torchrun started "
                                 f"{world_env} (--nnodes x --nproc-per-node)")
    except ShardplanError as exc:  # every rank finds it; rank 0 says it
        return _fail(str(exc)) if rank_env == 0 else 2
    try:
        if rank_env == 0:
            for line in prepared.notes:
                sys.stderr.write(f"shardplan: note: {line}\n")
        import torch
        import torch.distributed as dist

        from shardplan._ranks import retain_freed_memory
        from shardplan.ir.io import dumps, write_json
        from shardplan.runtime._worker import init_distributed, run_config

        retain_freed_memory()  # as the local launcher's ranks do

        torch.set_num_threads(1)
        init_distributed(timeout=cfg.timeout)
        rank, world = dist.get_rank(), dist.get_world_size()
        result = run_config(cfg, rank, world)
        dist.barrier()
        dist.destroy_process_group()
    except ShardplanError as exc:
        return _fail(str(exc))
    if rank == 0:
        out = {**result.to_dict(), **prepared.summary()}
        if args.output:
            write_json(args.output, out)
        if args.json:
            sys.stdout.write(dumps(out) + "\n")
        elif not args.output:
            for i, loss in enumerate(result.losses):
                sys.stdout.write(f"step {result.start_step + i + 1}: loss {loss:.6f}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
