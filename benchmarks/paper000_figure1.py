"""Paper 000, Figure 1: log sharding cost over time, brute force against the heuristic.

Run: ``.venv/bin/python benchmarks/paper000_figure1.py [--quick] [--seconds S]``; writes
``benchmarks/results/paper000_figure1.md`` and ``.png``.

Two panels:

1. the paper's setting: a 1001-node layered graph (``shardplan generate layered --nodes 1001``)
   on 8 GPUs (2 boxes x 4, M = latency in microseconds: 5 across boxes, 2 inside), brute force
   (``incumbent=none``: the paper's enumeration, with our bounds) against the heuristic from
   each start (``random`` without the coarse pass is the paper's search; the coarse pass,
   ``topo`` and ``metis`` are ours), all in one process for the same time;
2. a graph small enough for brute force to finish (layered, 14 nodes, 4 GPUs): both must reach
   the same cost.

It also times the flat heuristic to its local optimum on the 1001-node graph (one restart per
start, with and without the coarse pass, and the default 8 restarts on the default workers).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from shardplan import registry  # noqa: E402
from shardplan.generate import layered  # noqa: E402
from shardplan.ir import Topology, write_atomic  # noqa: E402
from shardplan.topology import build  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def topology(boxes: int, gpus: int) -> Topology:
    t = build("hierarchical", shape=(boxes, gpus), level_names=("box", "gpu"),
              latency=(5e-6, 2e-6), bandwidth=(2.5e10, 1.5e11))
    return t.replace(cost=t.latency * 1e6)


def _label(start: str, coarsen: bool) -> str:
    if start == "metis":
        return "metis"
    return f"{start}{'' if coarsen else ' without the coarse pass'}"


def run(name: str, graph, topo, seconds: float | None, **opts):
    t0 = time.perf_counter()
    # The paper's problem: partitions need not form a DAG (shardplan's default, acyclic=true,
    # constrains them so that a pipeline can run the plan).
    res = registry.run("partition", name, graph, topo, seed=0, time_limit=seconds,
                       acyclic=False, **opts)
    return res, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small budgets (smoke run)")
    ap.add_argument("--seconds", type=float, default=None,
                    help="time per algorithm on the 1001-node graph (default 30, quick 3)")
    args = ap.parse_args()
    seconds = args.seconds or (3.0 if args.quick else 30.0)
    big = layered(1001, seed=0)
    topo8 = topology(2, 4)
    small = layered(14, width=3, seed=1)
    topo4 = topology(2, 2)

    curves: dict[str, list] = {}
    rows = []
    # Panel 1: same time for everything, one process each.
    res, secs = run("brute-force", big, topo8, seconds, incumbent="none")
    curves["big/brute-force"] = res.stats["trace"]
    rows.append(("1001 nodes, 8 GPUs", "brute-force", res.plan.objective.value,
                 res.plan.status, secs, f"{res.stats['nodes']} search nodes"))
    for start, coarsen in (("random", False), ("random", True), ("topo", True),
                           ("metis", True)):
        res, secs = run("heuristic", big, topo8, seconds, workers=1, restarts=10_000,
                        start=start, coarsen=coarsen)
        label = _label(start, coarsen)
        curves[f"big/heuristic ({label})"] = res.stats["trace"]
        rows.append(("1001 nodes, 8 GPUs", f"heuristic, start {label}",
                     res.plan.objective.value, res.plan.status, secs,
                     f"{res.stats['restarts_run']} restarts"))
    # Panel 2: brute force finishes.
    res_b, secs_b = run("brute-force", small, topo4, None, incumbent="none")
    curves["small/brute-force"] = res_b.stats["trace"]
    rows.append(("14 nodes, 4 GPUs", "brute-force", res_b.plan.objective.value,
                 res_b.plan.status, secs_b, f"{res_b.stats['nodes']} search nodes"))
    res_h, secs_h = run("heuristic", small, topo4, None, workers=1, restarts=32,
                        start="random")
    curves["small/heuristic (random)"] = res_h.stats["trace"]
    rows.append(("14 nodes, 4 GPUs", "heuristic, start random, 32 restarts",
                 res_h.plan.objective.value, res_h.plan.status, secs_h, ""))
    same = abs(res_b.plan.objective.value - res_h.plan.objective.value) <= 1e-9 * max(
        1.0, res_b.plan.objective.value)

    # Time to the local optimum on the 1001-node graph.
    conv = []
    for start, coarsen in (("random", False), ("random", True), ("topo", False),
                           ("topo", True), ("metis", True)):
        res, secs = run("heuristic", big, topo8, None, workers=1, restarts=1, start=start,
                        coarsen=coarsen)
        conv.append((f"1 restart, start {_label(start, coarsen)}, 1 worker",
                     res.plan.objective.value, secs, res.stats["restarts"][0]["passes"]))
    for start in ("random", "topo"):
        res, secs = run("heuristic", big, topo8, None, start=start)
        conv.append((f"default: 8 restarts, start {start}, {res.stats['workers']} workers",
                     res.plan.objective.value, secs,
                     max(r["passes"] for r in res.stats["restarts"])))
    res, secs = run("heuristic", big, topo8, None)
    conv.append((f"default: 8 restarts, start metis, {res.stats['workers']} workers",
                 res.plan.objective.value, secs, max(r["passes"] for r in res.stats["restarts"])))

    lines = [
        "# Paper 000, Figure 1: sharding cost over time", "",
        f"Written by `benchmarks/paper000_figure1.py{' --quick' if args.quick else ''}`; "
        f"{seconds:g} s per algorithm on the 1001-node graph, one process each. M = latency in "
        "microseconds (5 across boxes, 2 inside a box); node weights 1..10.", "",
        "| graph | algorithm | final cost | status | seconds | notes |",
        "|---|---|---:|---|---:|---|",
    ]
    for g, a, c, s, t, note in rows:
        lines.append(f"| {g} | {a} | {c:.6g} | {s} | {t:.2f} | {note} |")
    lines += ["", f"Small graph: brute force and heuristic reach the same cost: **{same}**.", "",
              "## Flat heuristic to its local optimum (1001 nodes, 8 GPUs)", "",
              "| run | cost | seconds | passes (max per restart) |", "|---|---:|---:|---:|"]
    for r, c, t, p in conv:
        lines.append(f"| {r} | {c:.6g} | {t:.2f} | {p} |")
    lines.append("")
    text = "\n".join(lines)
    RESULTS.mkdir(exist_ok=True)
    write_atomic(RESULTS / "paper000_figure1.md", text)
    print(text)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, panel, title in ((axes[0], "big", "1001 nodes, 8 GPUs"),
                             (axes[1], "small", "14 nodes, 4 GPUs")):
        for key, trace in curves.items():
            if not key.startswith(panel + "/") or not trace:
                continue
            t = np.array([p[0] for p in trace] + [None], dtype=float)
            c = np.array([p[1] for p in trace], dtype=float)
            end = seconds if panel == "big" else max(p[0] for p in trace) * 1.05 + 1e-3
            t[-1] = end
            ax.step(t, np.append(c, c[-1]), where="post", label=key.split("/", 1)[1])
        ax.set_yscale("log")
        ax.set_xlabel("seconds")
        ax.set_ylabel("sharding cost (log)")
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "paper000_figure1.png", dpi=120)
    print(f"wrote {RESULTS / 'paper000_figure1.md'} and .png")


if __name__ == "__main__":
    main()
