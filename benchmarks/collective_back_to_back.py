"""Gloo all-reduce times as ``topology measure`` took them before and as it takes them now.

Two gloo processes (one thread each) all-reduce float32 tensors of each size: timed with a
barrier before every call (the ranks start together: how the curves were measured until
stop 29), and as 4 calls one after another (how training issues its collectives, and how
``topology measure`` now times them: :data:`shardplan.measure._timing.BACK_TO_BACK`).
Per call, medians of 12 rounds after 2 warm-up ones. Printed only; writes nothing.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/collective_back_to_back.py
"""

from __future__ import annotations

import os
import socket
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIZES = (1 << 16, 1 << 17, 1 << 20, 1 << 22)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, port: int, out) -> None:
    import torch
    import torch.distributed as dist

    from shardplan.measure._timing import BACK_TO_BACK

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    rows = []
    for nbytes in SIZES:
        x = torch.ones(nbytes // 4)
        synced, loop = [], []
        for it in range(14):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            t1 = time.perf_counter()
            dist.barrier()
            t2 = time.perf_counter()
            for _ in range(BACK_TO_BACK):
                dist.all_reduce(x)
            t3 = time.perf_counter()
            if it >= 2:
                synced.append(t1 - t0)
                loop.append((t3 - t2) / BACK_TO_BACK)
        rows.append((nbytes, statistics.median(synced), statistics.median(loop)))
    if rank == 0:
        out.put(rows)
    dist.destroy_process_group()


def main() -> int:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    rows = q.get()
    for p in procs:
        p.join()
    print("| bytes | barrier before each call, ms | back to back, ms per call | ratio |")
    print("|---:|---:|---:|---:|")
    for nbytes, synced, loop in rows:
        print(f"| {nbytes} | {synced * 1e3:.3f} | {loop * 1e3:.3f} | {loop / synced:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
