"""Parmesan Table 2 in our cost model: speed-up of optimal over consecutive (CS) mapping.

For a skip-connection-heavy captured model (``benchmarks/models/unet.py:unet``, a U-Net with
an FPN head; the paper used SemanticFPN), partitioned into S stages x R replicas by a
registered partitioner (``--partitioner``, default ``parmesan``) on a flat topology of S R
devices (phase 1 assumes a flattened topology, paper section 6), every cell maps the same
partition onto one topology with ``consecutive`` and with ``optimal`` (model chosen
automatically, section 5.2) and reports the ratio of their max stage times, the optimal
search's status and its time. A cell whose search hits its time limit reports the best
mapping found (status ``timed_out``); inner searches also stop after a quarter of the cell's
limit and count as "not found" (the paper's per-thread timeout heuristic).

Run::

    .venv/bin/python benchmarks/parmesan_table2.py            # 64 and 128 devices, ~10 min
    .venv/bin/python benchmarks/parmesan_table2.py --quick    # 16 devices, smoke run

Options: ``--time-limit SEC`` per cell (default 6), ``--partitioner NAME``, ``--workers N``
(targets per bisection round in worker processes), ``--seed``, ``--model auto|p2p|allreduce``.
Writes ``benchmarks/results/parmesan_table2.md`` (``--quick`` adds ``_quick``, a forced model
adds ``_p2p`` / ``_allreduce`` before it).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from benchmarks._graphs import captured  # noqa: E402
from shardplan import registry  # noqa: E402
from shardplan.ir import Graph, Plan, Topology, write_atomic  # noqa: E402
from shardplan.topology import build  # noqa: E402

MODEL = "benchmarks/models/unet.py:unet"
RESULTS = Path(__file__).resolve().parent / "results"
TOPOLOGIES = ("mesh2d", "torus2d", "mesh3d", "torus3d", "random-blk-1", "random-blk-2",
              "uniform-dist")
FULL_CONFIGS = ((4, 16), (8, 8), (16, 4), (4, 32), (8, 16), (16, 8))
QUICK_CONFIGS = ((4, 4), (8, 2))
SHAPES = {16: {2: (4, 4), 3: (2, 2, 4)}, 64: {2: (8, 8), 3: (4, 4, 4)},
          128: {2: (8, 16), 3: (4, 4, 8)}}


def topology(kind: str, num_devices: int, seed: int) -> Topology | None:
    """The cell's topology, or None when D devices cannot form it (a torus needs >= 3 per
    dimension; the paper's "-")."""
    if kind.startswith("torus") and min(SHAPES[num_devices][int(kind[-2])]) < 3:
        return None
    if kind in ("mesh2d", "torus2d"):
        return build(kind, shape=SHAPES[num_devices][2])
    if kind in ("mesh3d", "torus3d"):
        return build(kind, shape=SHAPES[num_devices][3])
    if kind == "random-blk-2" and num_devices < 16:
        return build(kind, num_devices=num_devices, seed=seed, super_block_size=8)
    return build(kind, num_devices=num_devices, seed=seed)


def partition(graph: Graph, name: str, num_stages: int, num_replicas: int, seed: int,
              time_limit: float) -> tuple[Plan, str]:
    """The registered partitioner ``name`` on a flat topology of S x R devices; a plan of
    another shape (metis may return fewer stages) cannot fill the (S, R) cell."""
    flat = build("flat", num_devices=num_stages * num_replicas)
    plan = registry.run("partition", name, graph, flat, seed=seed, time_limit=time_limit,
                        stages=num_stages, replicas=num_replicas).plan
    if plan.num_stages != num_stages or {len(st.devices) for st in plan.stages} != \
            {num_replicas}:
        raise SystemExit(f"{name} returned {plan.num_stages} stages of "
                         f"{sorted({len(st.devices) for st in plan.stages})} replicas, not "
                         f"{num_stages} x {num_replicas}: pick another --partitioner")
    return plan, name


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="16 devices, 1 s per cell")
    ap.add_argument("--time-limit", type=float, default=None, help="seconds per cell")
    ap.add_argument("--partitioner", default="parmesan")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", choices=("auto", "p2p", "allreduce"), default="auto",
                    help="stage-time model (default: section 5.2's automatic choice)")
    args = ap.parse_args()
    limit = args.time_limit or (1.0 if args.quick else 6.0)
    configs = QUICK_CONFIGS if args.quick else FULL_CONFIGS
    t_start = time.perf_counter()
    graph = captured(MODEL, granularity="op")
    print(f"{MODEL}: {graph.num_nodes} nodes, {graph.num_edges} edges", flush=True)
    cells: dict[tuple[str, tuple[int, int]], dict] = {}
    used_partitioner = {}
    for s_count, r_count in configs:
        plan, used = partition(graph, args.partitioner, s_count, r_count, args.seed,
                               4 * limit)
        used_partitioner[(s_count, r_count)] = used
        print(f"({s_count},{r_count}): partition by {used}", flush=True)
        for kind in TOPOLOGIES:
            topo = topology(kind, s_count * r_count, args.seed)
            if topo is None:
                cells[(kind, (s_count, r_count))] = None
                continue
            cs = registry.run("map", "consecutive", graph, topo, plan=plan, model=args.model)
            t0 = time.perf_counter()
            opt = registry.run("map", "optimal", graph, topo, plan=plan, seed=args.seed,
                               time_limit=limit, target_time_limit=limit / 4,
                               workers=args.workers, model=args.model)
            secs = time.perf_counter() - t0
            assert opt.plan.options["model"] == cs.plan.options["model"]
            cell = {"cs": cs.objective, "opt": opt.objective, "status": opt.status,
                    "seconds": secs, "model": opt.plan.options["model"],
                    "lower_bound": opt.plan.objective.lower_bound}
            cells[(kind, (s_count, r_count))] = cell
            print(f"  ({s_count},{r_count}) {kind:13s} {cell['model']:9s} "
                  f"cs {cs.objective:.4g} opt {opt.objective:.4g} "
                  f"x{cs.objective / opt.objective:.2f} {opt.status} {secs:.1f}s", flush=True)
    total = time.perf_counter() - t_start
    write(cells, configs, used_partitioner, graph, limit, total, args)
    return 0


def write(cells, configs, used_partitioner, graph, limit, total, args) -> None:
    head = "| topology | " + " | ".join(f"({s},{r})" for s, r in configs) + " |"
    sep = "|---" * (len(configs) + 1) + "|"
    lines = [
        "# Parmesan Table 2 in our cost model: optimal vs consecutive (CS) mapping",
        "",
        f"Generated by `benchmarks/parmesan_table2.py{' --quick' if args.quick else ''}` on "
        f"this machine (2 shared cores, 1 thread), {total:.0f} s in all. Model "
        f"`{MODEL}` ({graph.num_nodes} operators, {graph.num_edges} edges, op granularity, "
        f"batch 8), partitioned per (S, R) on a flat topology by: "
        + ", ".join(f"({s},{r}) {used_partitioner[(s, r)]}" for s, r in configs) + ".",
        f"Time limit {limit:g} s per cell (inner searches {limit / 4:g} s), "
        f"{args.workers} worker(s), seed {args.seed}, model {args.model}.",
        "",
        "Speed-up = CS max stage time / optimal max stage time (stage-time model chosen "
        "automatically, section 5.2; `*` marks a cell whose search timed out: the best mapping "
        "found, not proven optimal; `-`: the D devices cannot form that torus).",
        "",
        head, sep,
    ]
    for kind in TOPOLOGIES:
        row = [kind]
        for cfg in configs:
            c = cells[(kind, cfg)]
            if c is None:
                row.append("-")
                continue
            mark = "" if c["status"] == "optimal" else "*"
            row.append(f"{c['cs'] / c['opt']:.2f}x{mark}")
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Search seconds per cell (optimal mapping):", "", head, sep]
    for kind in TOPOLOGIES:
        row = [kind] + [f"{cells[(kind, cfg)]['seconds']:.1f}" if cells[(kind, cfg)] else "-"
                        for cfg in configs]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Model and gap to the proven lower bound (optimal value / lower bound):", "",
              head, sep]
    for kind in TOPOLOGIES:
        row = [kind]
        for cfg in configs:
            c = cells[(kind, cfg)]
            if c is None:
                row.append("-")
                continue
            lb = c["lower_bound"]
            gap = f"{c['opt'] / lb:.3f}" if lb else "-"
            row.append(f"{c['model']} {gap}")
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    ok = all(c["opt"] <= c["cs"] * (1 + 1e-12) for c in cells.values()
             if c is not None and c["status"] == "optimal")
    lines.append(f"Every `optimal` cell at least as good as CS: {'yes' if ok else 'NO'}.")
    lines.append("")
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "parmesan_table2" + ("" if args.model == "auto" else f"_{args.model}") + \
        ("_quick" if args.quick else "") + ".md"
    write_atomic(RESULTS / name, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
