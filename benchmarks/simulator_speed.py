"""How long one simulated iteration takes, against the schedule's size.

Run from the repository root::

    .venv/bin/python benchmarks/simulator_speed.py

Writes ``benchmarks/results/simulator_speed.md``: seconds to simulate one 1F1B iteration of
a uniform split of a 2,000-operator layered graph into S stages on an 8 x 8 hierarchy, for S
up to 64 and M up to 256 micro-batches (point-to-point traffic: no link carries two messages,
the fast path), and of data-parallel and pipeline plans whose ring all-reduces share links
on a 3-D torus (the progressive-filling path). Events are forward and backward actions plus
messages; the last column is microseconds per event.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from shardplan import registry  # noqa: E402
from shardplan.generate import layered  # noqa: E402
from shardplan.ir import write_atomic  # noqa: E402
from shardplan.simulate import simulate  # noqa: E402
from shardplan.topology import build  # noqa: E402


def timed(plan, graph, topo, **kw) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    res = simulate(plan, graph, topo, timeline=True, **kw)
    secs = time.perf_counter() - t0
    return secs, res.iteration_seconds, len(res.intervals)


def main() -> int:
    g = layered(num_nodes=2000, width=10, seed=0, params_per_weight=100)
    hier = build("hierarchical", shape=(8, 8), level_names=("box", "gpu"),
                 bandwidth=(1e9, 5e10), latency=(1e-5, 1e-6))
    torus = build("torus3d", shape=(4, 4, 4))
    rows = []
    for s in (8, 16, 32, 64):
        plan = registry.run("partition", "uniform", g, hier, stages=s, replicas=1).plan
        for m in (16, 64, 256):
            secs, it, events = timed(plan, g, hier, schedule="1f1b", microbatches=m)
            rows.append((f"hier 8x8, {s} x 1", m, secs, events))
            print(rows[-1], flush=True)
    for s, r in ((1, 64), (4, 16), (16, 4)):
        plan = registry.run("partition", "uniform", g, torus, stages=s, replicas=r).plan
        secs, it, events = timed(plan, g, torus, schedule="1f1b", microbatches=16)
        rows.append((f"torus 4x4x4, {s} x {r}", 16, secs, events))
        print(rows[-1], flush=True)
    lines = ["# Simulator speed", "",
             "Written by `benchmarks/simulator_speed.py` (do not edit by hand): seconds to "
             "simulate one 1F1B iteration on this machine (one thread).", "",
             "| plan | micro-batches | seconds | events | us / event |",
             "|---|---:|---:|---:|---:|"]
    for label, m, secs, events in rows:
        lines.append(f"| {label} | {m} | {secs:.3f} | {events} | "
                     f"{secs / max(events, 1) * 1e6:.1f} |")
    out = ROOT / "benchmarks/results/simulator_speed.md"
    write_atomic(out, "\n".join(lines) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
