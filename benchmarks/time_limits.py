"""Do searches return within their time limit? Every registered search, on an input too big to
finish, with ``time_limit`` = L: seconds taken / L (goal: at most 1.1) and the status.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/time_limits.py            # L = 2 s
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/time_limits.py --limit 5

Writes ``benchmarks/results/time_limits.md``. Timed in-process with the registry (the
command line also counts loading the input files; ``strategy`` subtracts that from its
limit), after one warm-up run of each search so that imports are not counted. Runs cut short
by a time limit may differ from run to run (how far a search got depends on the machine).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shardplan import registry  # noqa: E402
from shardplan.generate import generate, layered  # noqa: E402
from shardplan.ir import write_atomic  # noqa: E402
from shardplan.topology import build  # noqa: E402


def cases() -> list[tuple[str, str, str, object, object, dict]]:
    """(family, algorithm, input description, graph, topology, options)."""
    big = layered(num_nodes=10001, width=100, seed=0, skip_probability=0.1,
                  params_per_weight=1e4)
    mid = layered(num_nodes=2001, width=40, seed=0, skip_probability=0.1)
    small = layered(num_nodes=60, width=6, seed=0)
    flat96 = build("hierarchical", shape=(4, 24), level_names=("box", "gpu"))
    dgx = build("dgx1", boxes=2)
    tfm = generate("transformer")
    blk = build("random-blk-1", num_devices=64, seed=0)
    out: list[tuple[str, str, str, object, object, dict]] = [
        ("partition", "brute-force", "layered 60 x flat 8", small,
         build("flat", num_devices=8), {}),
        ("partition", "heuristic", "layered 10001 x 4x24", big, flat96, {"workers": 1}),
        ("partition", "hierarchical", "layered 10001 x 4x24", big, flat96, {}),
        ("partition", "parmesan", "layered 10001 x dgx1-2 (S, R search)", big, dgx, {}),
        ("partition", "pipedream", "layered 2001 x dgx1-2 (two levels)", mid, dgx, {}),
        ("partition", "pipedream-sequence", "layered 10001 x dgx1-2 (S, R search)", big, dgx,
         {}),
        ("map", "optimal", "16 stages x 4 of layered 2001 x random-blk-1 64", mid, blk,
         {"plan": registry.run("partition", "uniform", mid, blk, stages=16,
                               replicas=4).plan}),
        ("strategy", "pase", "transformer x 64", tfm, build("flat", num_devices=64), {}),
        ("strategy", "pase", "transformer x 64, default cost model", tfm,
         build("flat", num_devices=64), {"cost_model": "default"}),
    ]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=float, default=2.0, help="the time limit L (seconds)")
    ap.add_argument("--only", default=None, help="run only this algorithm (smoke runs)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/time_limits.md"))
    args = ap.parse_args()
    rows = []
    load = os.getloadavg()
    warmed: set[tuple[str, str]] = set()
    for family, name, what, g, topo, opts in cases():
        if args.only and name != args.only:
            continue
        if (family, name) not in warmed:  # imports and caches out of the measurement
            registry.run(family, name, g, topo, time_limit=1e-3, **opts)
            warmed.add((family, name))
        t0 = time.perf_counter()
        res = registry.run(family, name, g, topo, time_limit=args.limit, **opts)
        secs = time.perf_counter() - t0
        rows.append((family, name, what, secs, secs / args.limit, res.plan.status))
        print(f"{family:9s} {name:20s} {what:40s} {secs:7.2f} s  x{secs / args.limit:.2f}  "
              f"{res.plan.status}", flush=True)
    lines = ["# Time limits", "",
             f"Written by `benchmarks/time_limits.py --limit {args.limit:g}` (do not edit by "
             "hand). Each search on an input it cannot finish within the limit L = "
             f"{args.limit:g} s; `ratio` = seconds taken / L (goal <= 1.1); one core, "
             "in-process, after a warm-up run. A search that finishes early shows its own "
             f"time and status optimal or feasible. Load average during the run: "
             f"{load[0]:.1f} before, {os.getloadavg()[0]:.1f} after (2 cores; a phase "
             "that does not check the deadline stretches with the load).", "",
             "| family | algorithm | input | seconds | ratio | status |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {f} | {n} | {w} | {s:.2f} | {r:.2f} | {st} |" for f, n, w, s, r, st in rows]
    write_atomic(args.out, "\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
