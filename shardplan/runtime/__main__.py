"""``torchrun --nnodes N --nproc-per-node P ... -m shardplan.runtime PLAN GRAPH TOPO --model
SPEC --steps N [...]``: the same run as ``shardplan train``, on torchrun's processes.

Rendezvous, rank and world size come from torchrun's environment (``init_process_group``
with ``env://``); nothing home-made. Rank 0 prints the result (``--json``: one JSON object).
Exit status: 0, or 2 with one ``shardplan: error: ...`` line for a user error; any other
failure propagates so that torchrun stops the other ranks.
"""

from __future__ import annotations

import os
import sys

from shardplan.cli._common import OneLineParser
from shardplan.errors import ShardplanError


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    parser = OneLineParser(prog="python -m shardplan.runtime",
                           description="Run a plan under torchrun (see shardplan train).")
    from shardplan.cli.train import add_arguments, config_from_args

    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args(args)
        import torch
        import torch.distributed as dist

        from shardplan.ir.io import dumps, write_json
        from shardplan.runtime._worker import init_distributed, run_config

        torch.set_num_threads(1)
        init_distributed(timeout=cfg.timeout)
        rank, world = dist.get_rank(), dist.get_world_size()
        result = run_config(cfg, rank, world)
        dist.barrier()
        dist.destroy_process_group()
    except ShardplanError as exc:
        sys.stderr.write(f"shardplan: error: {exc}\n")
        return 2
    if rank == 0:
        out = {**result.to_dict(), "kind": cfg.kind, "processes": world}
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
