"""``shardplan train``'s step time against a hand-written torch.distributed.pipelining split.

The same model (the zoo's GPT-style ``transformer``), the same 2-stage split (embeddings and
the first half of the blocks | the rest and the head), 1F1B, the same micro-batching, on the
same 2 processes (gloo, one thread each), one after the other and repeated: once as eager
``nn.Module`` stages built by hand with ``PipelineStage`` + ``Schedule1F1B``, once as
shardplan runs a plan (exported program cut by the plan, the simulator's action lists on
``_PipelineScheduleRuntime``, seeded forwards, its gradient sync). Prints and writes the
median seconds per step of each and their ratio (shardplan / hand-written; 1.0 = no
overhead).

Usage::

    .venv/bin/python benchmarks/runtime_overhead.py            # 30 steps, 3 rounds
    .venv/bin/python benchmarks/runtime_overhead.py --quick    # 8 steps, 1 round

Writes ``benchmarks/results/runtime_overhead.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shardplan._ranks import read_rank_errors, run_ranks  # noqa: E402
from shardplan.ir import Objective, Plan, Stage  # noqa: E402
from shardplan.ir.io import write_atomic  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SPEC = "transformer,num_layers=4,d_model=256,num_heads=4,vocab_size=2048"
SEQ, MICRO, MBS, WARMUP = 64, 4, 8, 3


def _plan(graph: object) -> Plan:
    """Stage 1: the modules a hand-written split puts there (blocks 2-3, ln_f, head)."""
    late = ("blocks.2", "blocks.3", "ln_f", "head")
    s1 = tuple(i for i, m in enumerate(graph.modules) if m.startswith(late))
    s0 = tuple(i for i in range(graph.num_nodes) if i not in set(s1))
    return Plan(graph=graph.name, topology="", algorithm="hand", objective=Objective("n", 0.0),
                stages=(Stage(s0, (0,)), Stage(s1, (1,))))


def _hand(cfg: object, rank: int) -> list[float]:
    """The hand-written pipeline: eager stage modules, PipelineStage, Schedule1F1B."""
    import time

    import torch
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from shardplan.runtime._data import chunks
    from shardplan.workload import batch_for_step, build, loss_fn_for

    model, inputs, _ = build(cfg.model, batch_size=cfg.chunk_size, seq_len=SEQ)

    class First(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok_emb, self.pos_emb = model.tok_emb, model.pos_emb
            self.blocks = nn.ModuleList(model.blocks[:2])

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.tok_emb(ids) + self.pos_emb(torch.arange(ids.shape[1]))
            for b in self.blocks:
                x = b(x)
            return x

    class Last(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(model.blocks[2:])
            self.ln_f, self.head = model.ln_f, model.head

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                x = b(x)
            return self.head(self.ln_f(x))

    mod = First() if rank == 0 else Last()
    hidden = torch.zeros(cfg.chunk_size, SEQ, 256).requires_grad_()
    example = inputs[0] if rank == 0 else hidden
    stage = PipelineStage(mod, rank, 2, torch.device("cpu"), input_args=(example,),
                          output_args=(hidden if rank == 0 else
                                       torch.zeros(cfg.chunk_size, SEQ, 2048),))
    sched = Schedule1F1B(stage, n_microbatches=cfg.microbatches,
                         loss_fn=loss_fn_for(cfg.model))
    opt = torch.optim.Adam(mod.parameters(), lr=cfg.lr)
    times = []
    for step in range(cfg.steps):
        x, y = batch_for_step(inputs, 2048, batch_size=cfg.global_batch, seed=0, step=step)
        parts = chunks(x, y, cfg.microbatches, 1)
        t0 = time.perf_counter()
        if rank == 0:
            sched.step(arg_mbs=[xs for xs, _ in parts], return_outputs=False)
        else:
            sched.step(target_mbs=[ys for _, ys in parts], losses=[], return_outputs=False)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return times


def _rank(rank: int, cfg: object, rounds: int, tmp: str) -> None:
    import torch
    import torch.distributed as dist

    from shardplan.runtime._worker import init_distributed, run_config

    torch.set_num_threads(1)
    init_distributed(rank, 2, os.path.join(tmp, "store"), 300.0)
    out: dict[str, list[float]] = {"hand": [], "shardplan": []}
    for _ in range(rounds):
        out["hand"] += _hand(cfg, rank)[WARMUP:]
        dist.barrier()
        out["shardplan"] += run_config(cfg, rank, 2).seconds_per_step[WARMUP:]
        dist.barrier()
    if rank == 0:
        write_atomic(os.path.join(tmp, "result.json"), json.dumps(out))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="8 steps, 1 round")
    args = ap.parse_args(argv)
    steps, rounds = (WARMUP + 5, 1) if args.quick else (30, 3)

    from shardplan.capture import capture_spec
    from shardplan.runtime import config_for_plan

    graph = capture_spec(SPEC, batch_size=MBS, seq_len=SEQ)
    cfg = config_for_plan(_plan(graph), graph, model=SPEC, steps=steps, schedule="1f1b",
                          microbatches=MICRO, microbatch_size=MBS, optimizer="adam")
    with tempfile.TemporaryDirectory() as tmp:
        run_ranks(_rank, lambda r: (r, cfg, rounds, tmp), 2, timeout=1800.0,
                  what="benchmark", failure=lambda p, r, d: str(read_rank_errors(tmp, 2)))
        with open(os.path.join(tmp, "result.json"), encoding="utf-8") as fh:
            res = json.load(fh)
    hand = statistics.median(res["hand"]) * 1e3
    ours = statistics.median(res["shardplan"]) * 1e3
    lines = [
        "# shardplan train vs a hand-written torch.distributed.pipelining split",
        "",
        f"`{SPEC}`, seq {SEQ}, 2 stages (blocks 0-1 | blocks 2-3 + head), 1F1B, "
        f"{MICRO} micro-batches of {MBS} samples, Adam; 2 CPU processes (gloo, 1 thread "
        f"each), {steps} steps x {rounds} rounds alternating, first {WARMUP} of each left "
        f"out. Generated by `benchmarks/runtime_overhead.py{' --quick' if args.quick else ''}`.",
        "",
        "| run | median ms / step |",
        "|---|---|",
        f"| hand-written split (eager stages, Schedule1F1B) | {hand:.1f} |",
        f"| shardplan train (plan, action lists) | {ours:.1f} |",
        "",
        f"Ratio shardplan / hand-written: **{ours / hand:.3f}**",
        "",
    ]
    text = "\n".join(lines)
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_atomic(str(RESULTS / "runtime_overhead.md"), text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
