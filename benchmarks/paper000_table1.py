"""Paper 000's Table 1 on this machine: FSDP vs DDP vs the planned pipeline, side by side.

Paper 000, section 4: an MLP (three ``Linear`` layers and a softmax; 767 bag-of-words
features of the Amazon product-review data, 10 classes; synthetic data of that shape here),
batch 8192, Adam, 3 processes. Time per training iteration, mean and standard deviation, for
PyTorch FSDP (FSDP2 ``fully_shard``, default settings), DDP, and the paper's own method: the
model captured at module level with ``Linear`` atomic (section 3.2), partitioned by
``shardplan partition --algorithm heuristic`` over the 3 devices (section 2.3; acyclic, the
default, so that it pipelines) and trained with GPipe, like the paper without
micro-batching by default. All three run in one launch on the same 3 processes, one after
another. The paper measured 12.48 ms (FSDP) and 1.89 ms (its pipeline) on 3 RTX 3090 GPUs;
here the processes are CPU processes (gloo, one thread each) sharing this machine's cores, so
compare the ratios, not the milliseconds.

Usage::

    .venv/bin/python benchmarks/paper000_table1.py            # batch 8192, 12 iterations
    .venv/bin/python benchmarks/paper000_table1.py --quick    # batch 512, 6 iterations

Writes ``benchmarks/results/paper000_table1.md``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from benchmarks._graphs import captured  # noqa: E402
from shardplan.ir import load_plan, save  # noqa: E402
from shardplan.ir.io import write_atomic  # noqa: E402
from shardplan.runtime import TrainConfig, config_for_plan, train_many  # noqa: E402
from shardplan.topology import build  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
NPROC = 3


def planned(graph: object, tmp: str, microbatches: int) -> object:
    """The plan ``shardplan partition --algorithm heuristic`` makes over 3 flat devices
    (acyclic by default; GPipe, the sharding partitioners' default schedule)."""
    topo = build("flat", num_devices=NPROC)
    gpath, tpath, ppath = (os.path.join(tmp, n) for n in ("g.json", "t.json", "p.json"))
    save(graph, gpath)
    save(topo, tpath)
    cmd = [str(ROOT / ".venv" / "bin" / "shardplan"), "partition", gpath, tpath,
           "--algorithm", "heuristic", "--seed", "0", "--microbatches", str(microbatches),
           "-o", ppath]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"partition failed: {done.stderr.strip()}")
    plan = load_plan(ppath)
    if plan.num_stages != NPROC or plan.num_replicas != 1 or plan.settings.schedule != "gpipe":
        raise SystemExit(f"unexpected plan: {plan.num_stages} stages x {plan.num_replicas}, "
                         f"{plan.settings.schedule}")
    return plan


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="batch 512, 6 iterations")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=2, help="iterations left out of the stats")
    ap.add_argument("--microbatches", type=int, default=1)
    args = ap.parse_args(argv)
    batch = 512 if args.quick else 8192
    steps = args.steps or (6 if args.quick else 12)
    graph = captured("mlp", batch_size=batch // args.microbatches, granularity="module",
                     atomic="Linear")
    with tempfile.TemporaryDirectory() as tmp:
        plan = planned(graph, tmp, args.microbatches)
    common = dict(model="mlp", steps=steps, optimizer="adam", lr=1e-3)
    micro = dict(microbatches=args.microbatches, microbatch_size=batch // args.microbatches)
    cfgs = [TrainConfig(kind="fsdp", nproc=NPROC, **micro, **common),
            TrainConfig(kind="ddp", nproc=NPROC, **micro, **common),
            config_for_plan(plan, graph, **common)]
    assert cfgs[-1].schedule == "gpipe" and cfgs[-1].global_batch == batch
    names = ["PyTorch FSDP (fully_shard)", "DDP", f"heuristic partition, GPipe, "
             f"{args.microbatches} micro-batch{'es' if args.microbatches > 1 else ''}"]
    results = train_many(cfgs)
    rows = []
    for name, res in zip(names, results, strict=True):
        t = np.asarray(res.seconds_per_step[args.warmup:]) * 1e3
        rows.append((name, float(t.mean()), float(t.std()), res.losses[-1]))
    fsdp_ms = rows[0][1]
    order = graph.stage_order(plan.assignment(graph.num_nodes), plan.num_stages)
    layers = [", ".join(graph.names[v] for v in sorted(plan.stages[s].nodes)) for s in order]
    report = plan.meta.get("acyclic", {})
    lines = [
        "# Paper 000, Table 1: time per training iteration (this machine)",
        "",
        f"MLP 767 -> 1024 -> 1024 -> 10 + softmax, batch {batch}, Adam, {NPROC} processes "
        f"(CPU, gloo, 1 thread each), {steps} iterations, first {args.warmup} left out. "
        f"Plan: `shardplan capture mlp --granularity module --atomic Linear`, then "
        f"`shardplan partition --algorithm heuristic` on 3 flat devices: stages in pipeline "
        f"order "
        f"{' | '.join(layers)}, sharding cost {plan.objective.value:.6g} (acyclic; "
        f"{report.get('unconstrained', float('nan')):.6g} without the constraint). "
        f"Generated by `benchmarks/paper000_table1.py{' --quick' if args.quick else ''}`.",
        "",
        "| method | ms / iteration (mean ± std) | FSDP / method | final loss |",
        "|---|---|---|---|",
    ]
    for name, mean, std, loss in rows:
        lines.append(f"| {name} | {mean:.2f} ± {std:.2f} | {fsdp_ms / mean:.2f}x | "
                     f"{loss:.5f} |")
    lines += ["", "Paper 000 (3 RTX 3090 GPUs): FSDP 12.48 ± 0.7 ms, its pipeline 1.89 ± 0.8 ms "
              "(6.6x)."]
    text = "\n".join(lines) + "\n"
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / ("paper000_table1_quick.md" if args.quick else "paper000_table1.md")
    write_atomic(out, text)
    sys.stdout.write(text)
    sys.stdout.write(f"wrote {out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
