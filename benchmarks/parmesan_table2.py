"""Parmesan Table 2 in our cost model: speed-up of optimal over consecutive (CS) mapping.

For a skip-connection-heavy captured model (``benchmarks/models/unet.py:unet``, a U-Net with
an FPN head; the paper used SemanticFPN), partitioned into S stages x R replicas by a
registered partitioner (``--partitioner``, default ``parmesan``) on a flat topology of S R
devices (phase 1 assumes a flattened topology, paper section 6), every cell maps the same
partition onto one topology with ``consecutive`` and with ``optimal`` and reports:

- the *model's* ratio: CS max stage time / optimal max stage time, under the stage-time
  model the mapper optimises (``--model``, default ``auto``: the overlap view) with link
  contention, which is on where the topology has physical links (the meshes and tori; the
  random topologies have none, so nothing changes there);
- the *simulated* ratio: the simulator's iteration time of the CS mapping / that of the
  model's optimum (the simulator shares links max-min fairly between the messages in
  flight; the plan's settings: 1F1B, 8 micro-batches); ``optimal`` keeps CS when it
  simulates faster (its judge), marked;
- on the grids, the same two ratios without contention (``contention=False``: every
  transfer alone on its route, the model before link contention);
- the optimal search's status, time and gap to its proven lower bound.

A cell whose search hits its time limit reports the best mapping found (status
``timed_out``); inner searches also stop after a quarter of the cell's limit and count as
"not found" (the paper's per-thread timeout heuristic).

Run::

    .venv/bin/python benchmarks/parmesan_table2.py            # 64 and 128 devices
    .venv/bin/python benchmarks/parmesan_table2.py --quick    # 16 devices, smoke run

Options: ``--time-limit SEC`` per cell (default 6), ``--partitioner NAME``, ``--workers N``
(targets per bisection round in worker processes), ``--seed``, ``--model auto|p2p|allreduce``,
``--configs 16x4,8x8`` and ``--topologies mesh2d,...`` (a subset), ``--out NAME.md``.
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
GRIDS = TOPOLOGIES[:4]
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


def map_cell(graph: Graph, topo: Topology, plan: Plan, args: argparse.Namespace,
             limit: float, contention: str | bool) -> dict:
    """CS and optimal mapping of ``plan`` on ``topo``: model values, simulated seconds (the
    optimal mapper's judge simulates both), status, seconds."""
    cs = registry.run("map", "consecutive", graph, topo, plan=plan, model=args.model,
                      contention=contention)
    t0 = time.perf_counter()
    opt = registry.run("map", "optimal", graph, topo, plan=plan, seed=args.seed,
                       time_limit=limit, target_time_limit=limit / 4, workers=args.workers,
                       model=args.model, contention=contention)
    secs = time.perf_counter() - t0
    assert opt.plan.options["model"] == cs.plan.options["model"]
    judge = opt.stats.get("judge")
    value = float(opt.stats["value"])  # the model's optimum, before the judge
    if judge is None:  # the model's optimum is the CS mapping itself
        sim_opt = sim_cs = simulated(cs.plan, graph, topo)
        kept = "optimal"
    else:
        sim_opt, sim_cs = judge["simulated_seconds"], judge["consecutive_simulated_seconds"]
        kept = judge["kept"]
    return {"cs": cs.objective, "opt": value, "status": opt.stats["search_status"],
            "seconds": secs,
            "model": opt.plan.options["model"], "contention": opt.stats["contention"],
            "lower_bound": opt.plan.objective.lower_bound, "sim_cs": sim_cs,
            "sim_opt": sim_opt, "kept": kept}


def simulated(plan: Plan, graph: Graph, topo: Topology) -> float:
    from shardplan.simulate import simulate

    return float(simulate(plan, graph, topo, timeline=False).iteration_seconds)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="16 devices, 1 s per cell")
    ap.add_argument("--time-limit", type=float, default=None, help="seconds per cell")
    ap.add_argument("--partitioner", default="parmesan")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", choices=("auto", "p2p", "allreduce"), default="auto",
                    help="stage-time model (default: the plan's, overlap)")
    ap.add_argument("--configs", default=None, metavar="SxR,...",
                    help="only these (S, R), e.g. 16x4,8x8 (S R must be 16, 64 or 128)")
    ap.add_argument("--topologies", default=None, metavar="KIND,...",
                    help=f"only these of {', '.join(TOPOLOGIES)}")
    ap.add_argument("--out", default=None, help="results file name in benchmarks/results")
    args = ap.parse_args()
    limit = args.time_limit or (1.0 if args.quick else 6.0)
    configs = QUICK_CONFIGS if args.quick else FULL_CONFIGS
    if args.configs:
        try:
            configs = tuple((int(c.split("x")[0]), int(c.split("x")[1]))
                            for c in args.configs.split(","))
        except (ValueError, IndexError):
            raise SystemExit("--configs: a list like 16x4,8x8") from None
        if any(s * r not in SHAPES for s, r in configs):
            raise SystemExit(f"--configs: S x R must be one of {sorted(SHAPES)}")
    kinds = TOPOLOGIES
    if args.topologies:
        kinds = tuple(args.topologies.split(","))
        if not set(kinds) <= set(TOPOLOGIES):
            raise SystemExit(f"--topologies: choose from {', '.join(TOPOLOGIES)}")
    t_start = time.perf_counter()
    graph = captured(MODEL, granularity="op")
    print(f"{MODEL}: {graph.num_nodes} nodes, {graph.num_edges} edges", flush=True)
    cells: dict[tuple[str, tuple[int, int]], dict | None] = {}
    plain: dict[tuple[str, tuple[int, int]], dict | None] = {}
    used_partitioner = {}
    for s_count, r_count in configs:
        plan, used = partition(graph, args.partitioner, s_count, r_count, args.seed,
                               4 * limit)
        used_partitioner[(s_count, r_count)] = used
        print(f"({s_count},{r_count}): partition by {used}", flush=True)
        for kind in kinds:
            topo = topology(kind, s_count * r_count, args.seed)
            key = (kind, (s_count, r_count))
            if topo is None:
                cells[key] = plain[key] = None
                continue
            # the allreduce view charges no transfers: nothing to share, one run is enough
            grid = kind in GRIDS and args.model != "allreduce"
            runs = [("auto", cells)] + ([(False, plain)] if grid else [])
            for contention, into in runs:
                cell = map_cell(graph, topo, plan, args, limit, contention)
                cell["key"] = key
                into[key] = cell
                print(f"  ({s_count},{r_count}) {kind:13s} {cell['model']:9s} contention "
                      f"{'on ' if cell['contention'] else 'off'} cs {cell['cs']:.4g} opt "
                      f"{cell['opt']:.4g} x{cell['cs'] / cell['opt']:.2f} simulated "
                      f"x{cell['sim_cs'] / cell['sim_opt']:.2f} kept {cell['kept']} "
                      f"{cell['status']} {cell['seconds']:.1f}s", flush=True)
    total = time.perf_counter() - t_start
    write(cells, plain, configs, kinds, used_partitioner, graph, limit, total, args)
    return 0


def _table(title: str, configs, rows, cell_text) -> list[str]:
    head = "| topology | " + " | ".join(f"({s},{r})" for s, r in configs) + " |"
    sep = "|---" * (len(configs) + 1) + "|"
    lines = [title, "", head, sep]
    for kind, cells in rows:
        row = [kind]
        for cfg in configs:
            c = cells.get((kind, cfg))
            row.append("-" if c is None else cell_text(c))
        lines.append("| " + " | ".join(row) + " |")
    return lines + [""]


def _seconds(c: dict) -> str:
    return f"{c['seconds']:.1f}" + ("" if c["status"] == "optimal" else "*")


def _key(c: dict) -> tuple[str, tuple[int, int]]:
    return c["key"]


def _model_ratio(c: dict) -> str:
    return f"{c['cs'] / c['opt']:.2f}x" + ("" if c["status"] == "optimal" else "*")


def _sim_ratio(c: dict) -> str:
    return f"{c['sim_cs'] / c['sim_opt']:.2f}x" + ("" if c["kept"] == "optimal" else " (CS)")


def write(cells, plain, configs, kinds, used_partitioner, graph, limit, total, args) -> None:
    command = "benchmarks/parmesan_table2.py" + "".join(
        f" {flag}" for flag, on in (("--quick", args.quick),) if on) + "".join(
        f" --{k.replace('_', '-')} {v}" for k, v in
        (("time_limit", args.time_limit), ("model", None if args.model == "auto" else
                                           args.model), ("configs", args.configs),
         ("topologies", args.topologies), ("out", args.out)) if v)
    lines = [
        "# Parmesan Table 2 in our cost model: optimal vs consecutive (CS) mapping",
        "",
        f"Generated by `{command}` on "
        f"this machine (2 shared cores, 1 thread), {total:.0f} s in all. Model "
        f"`{MODEL}` ({graph.num_nodes} operators, {graph.num_edges} edges, op granularity, "
        f"batch 8), partitioned per (S, R) on a flat topology by: "
        + ", ".join(f"({s},{r}) {used_partitioner[(s, r)]}" for s, r in configs) + ". "
        "Plan settings: 1F1B, 8 micro-batches of 8 samples (each replica 8 / R).",
        f"Time limit {limit:g} s per cell (inner searches {limit / 4:g} s), "
        f"{args.workers} worker(s), seed {args.seed}, model {args.model}. Grids of "
        + ", ".join(f"{d} devices: {SHAPES[d][2][0]}x{SHAPES[d][2][1]} (2-D), "
                    + "x".join(map(str, SHAPES[d][3])) + " (3-D)"
                    for d in sorted({s * r for s, r in configs}))
        + "; links of 100 GB/s per direction, 1 us per hop.",
        "",
        "Link contention is on where the topology has physical links (the grids); the "
        "random topologies have none, so there it is the plain model. `*`: the search "
        "timed out (the best mapping found, not proven optimal); `-`: the D devices cannot "
        "form that torus.",
        "",
    ]
    rows = [(k, cells) for k in kinds]
    lines += _table("Speed-up in the model (CS max stage time / optimal max stage time):",
                    configs, rows, _model_ratio)
    lines += _table("Speed-up in the simulator (CS iteration / iteration of the model's "
                    "optimum; `(CS)`: slower in simulation, so `optimal` kept CS):",
                    configs, rows, _sim_ratio)
    if any(c is not None for c in plain.values()):
        grid_rows = [(k, plain) for k in kinds if k in GRIDS]
        lines += _table("Without contention (`contention=False`, every transfer alone on its "
                        "route: the model before), in the model:", configs, grid_rows,
                        _model_ratio)
        lines += _table("Without contention, in the simulator:", configs, grid_rows,
                        _sim_ratio)
    lines += _table("Seconds of `optimal` per cell (search, local search and the judge's two "
                    "simulations; `*`: the search timed out) with contention on the grids, and "
                    "after `/` without:", configs, rows,
                    lambda c: _seconds(c) + ("" if plain.get(_key(c)) is None
                                             else " / " + _seconds(plain[_key(c)])))
    lines += _table("Model and gap to the proven lower bound (optimal value / lower bound):",
                    configs, rows,
                    lambda c: f"{c['model']}{'+contention' if c['contention'] else ''} "
                              + (f"{c['opt'] / c['lower_bound']:.3f}" if c["lower_bound"]
                                 else "-"))
    ok = all(c["opt"] <= c["cs"] * (1 + 1e-12) for c in (*cells.values(), *plain.values())
             if c is not None and c["status"] == "optimal")
    lines.append(f"Every `optimal` cell at least as good as CS in the model: "
                 f"{'yes' if ok else 'NO'}.")
    lines.append("")
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = args.out or "parmesan_table2" + ("" if args.model == "auto" else
                                            f"_{args.model}") + \
        ("_quick" if args.quick else "") + ".md"
    write_atomic(RESULTS / name, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
