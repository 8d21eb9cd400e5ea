"""What point-to-point messages take from the computing processes of one host.

Two gloo processes (one thread each, as the runtime runs them) compute the same matrix
products (paper 000's MLP's first layer at 64 samples); in one round they compute alone, in
the other rank 0 sends and rank 1 receives a message of ``--kib`` KiB before every group of
products (``isend`` / ``irecv``, waited for after the products, as torch's pipelining posts
them). The difference is the CPU the transfers took from the computation on both ends:
what ``topology measure`` records more directly as ``comm_cpu_share`` (the process's CPU
seconds per second a message is in flight) and the simulator charges to computing ends (a
GPU's copy engines take nothing from its compute; gloo on shared cores does).
Rounds alternate, medians of 10 timed repetitions after 2 warm-up ones.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/p2p_cpu_cost.py [--kib 256] [--messages 8]

Prints one line per round and the extra seconds per message and per byte; writes nothing.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, port: int, send: bool, kib: int, messages: int, out) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    x, w = torch.randn(64, 767), torch.randn(1024, 767)
    buf = torch.randn(kib * 256)  # kib KiB of float32
    times = []
    for it in range(12):
        dist.barrier()
        reqs = []
        t0 = time.perf_counter()
        for _ in range(messages):
            if send:
                reqs.append(dist.isend(buf, 1) if rank == 0 else dist.irecv(buf, 0))
            for _ in range(4):
                torch.nn.functional.linear(x, w)
        t1 = time.perf_counter()
        for r in reqs:
            r.wait()
        if it >= 2:
            times.append(t1 - t0)
    out.put((rank, statistics.median(times)))
    dist.destroy_process_group()


def _round(send: bool, kib: int, messages: int) -> float:
    """The slower rank's median seconds of the products in one round."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, send, kib, messages, q))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return max(q.get()[1] for _ in range(2))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kib", type=int, default=256, help="message size (the MLP's activation)")
    ap.add_argument("--messages", type=int, default=8, help="messages per repetition")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of each kind, alternating")
    args = ap.parse_args(argv)
    alone, sending = [], []
    for _ in range(args.rounds):
        alone.append(_round(False, args.kib, args.messages))
        sending.append(_round(True, args.kib, args.messages))
        print(f"compute alone {alone[-1] * 1e3:.2f} ms, with {args.messages} messages of "
              f"{args.kib} KiB {sending[-1] * 1e3:.2f} ms")
    extra = (statistics.median(sending) - statistics.median(alone)) / args.messages
    print(f"extra compute seconds per message: {extra * 1e3:.3f} ms "
          f"({extra / (args.kib * 1024) * 1e9:.2f} ns per byte); "
          f"ratio with / alone {statistics.median(sending) / statistics.median(alone):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
