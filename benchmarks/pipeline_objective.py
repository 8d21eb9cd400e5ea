"""Parmesan's objective against the simulator: equation 3 versus the overlap view.

Run from the repository root::

    .venv/bin/python benchmarks/pipeline_objective.py [--quick]

Writes ``benchmarks/results/pipeline_objective.md``. For ResNet-50, ResNet-101 and
DenseNet-121 (operator-level graphs at micro-batch 8, cached by
``benchmarks._graphs.captured``) on the paper's two-level machine (4 boxes x 4 GPUs, 50 GB/s
inside a box, 100 Gb/s Ethernet across) and S = 4, 8, 16 stages of one replica each, it
partitions with

- ``pipedream-sequence`` -- PipeDream's DP on a topological order (the baseline), or
  ``pipedream`` where that is the only sequence baseline registered,
- ``parmesan --objective eq3`` -- the paper's equation 3 (transfers added to compute),
- ``parmesan --objective overlap`` -- the default: the simulator's model (compute and sends
  overlap, all-reduce spread over the iteration), candidates judged by the simulator,

all with the same execution settings (1F1B, 8 micro-batches, Adam), and simulates one
iteration of each plan with those settings (``shardplan.simulate``). The table gives the
simulated milliseconds per iteration and each Parmesan plan relative to the baseline
(below 1.00 is faster). ``--quick``: ResNet-50 only.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)
os.environ.setdefault("OMP_NUM_THREADS", "1")

from benchmarks._graphs import captured  # noqa: E402
from shardplan import registry  # noqa: E402
from shardplan.ir import write_atomic  # noqa: E402
from shardplan.simulate import simulate  # noqa: E402
from shardplan.topology import build  # noqa: E402

MODELS = {"ResNet-50": "torchvision:resnet50", "ResNet-101": "torchvision:resnet101",
          "DenseNet-121": "torchvision:densenet121"}
STAGES = (4, 8, 16)
SETTINGS = {"microbatches": 8, "schedule": "1f1b", "optimizer": "adam"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="ResNet-50 only")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/pipeline_objective.md"))
    args = ap.parse_args()
    models = {"ResNet-50": MODELS["ResNet-50"]} if args.quick else MODELS
    topo = build("hierarchical", shape=(4, 4), level_names=("box", "gpu"),
                 bandwidth=(12.5e9, 50e9), latency=(2.5e-5, 2e-6), name="hier-4x4")
    baseline = "pipedream-sequence" if "pipedream-sequence" in registry.available(
        "partition") else "pipedream"
    flows = ((baseline, baseline, {}), ("Parmesan, eq. 3", "parmesan", {"objective": "eq3"}),
             ("Parmesan, overlap", "parmesan", {"objective": "overlap"}))
    rows = []
    t_start = time.perf_counter()
    for name, spec in models.items():
        graph = captured(spec, batch_size=8)
        for s in STAGES:
            cells = {}
            for label, algo, extra in flows:
                t0 = time.perf_counter()
                plan = registry.run("partition", algo, graph, topo, stages=s, replicas=1,
                                    **SETTINGS, **extra).plan
                secs = time.perf_counter() - t0
                sim = simulate(plan, graph, topo, timeline=False)
                cells[label] = (sim.iteration_seconds, secs)
                print(f"{name:12s} S={s:2d} {label:18s} {sim.iteration_seconds * 1e3:8.2f} ms "
                      f"({secs:.1f} s search)", flush=True)
            rows.append((name, graph.num_nodes, s, cells))
    total = time.perf_counter() - t_start
    labels = [f[0] for f in flows]
    lines = ["# Parmesan's objective against the simulator", "",
             "Written by `benchmarks/pipeline_objective.py"
             f"{' --quick' if args.quick else ''}` (do not edit by hand). Simulated ms per "
             "iteration of each partition (hier 4 x 4 machine, S stages x 1 replica, 1F1B, 8 "
             "micro-batches of 8 samples, Adam; partition and simulation with the same "
             "settings); in brackets the ratio to the baseline "
             f"({baseline}) and the search seconds. Run took {total:.0f} s.", "",
             "| model | operators | S | " + " | ".join(labels) + " |",
             "|---|---:|---:|" + "---:|" * len(labels)]
    worst = 0.0
    for name, n, s, cells in rows:
        ref = cells[labels[0]][0]
        out = []
        for label in labels:
            t, secs = cells[label]
            out.append(f"{t * 1e3:.2f} ({t / ref:.2f}x, {secs:.1f} s)")
        worst = max(worst, cells[labels[2]][0] / ref)
        lines.append(f"| {name} | {n} | {s} | " + " | ".join(out) + " |")
    lines += ["", f"Largest ratio of the overlap objective's plan to the baseline: "
              f"{worst:.3f}x (at most 1.00x: the baseline's split is one of Parmesan's "
              "candidates and the simulator picks among them).", ""]
    write_atomic(args.out, "\n".join(lines))
    print(f"wrote {args.out} in {total:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
