"""``shardplan demo``: the main job end to end on defaults.

Capture a real model (operator level, and module level for ResNets), build a DGX-1 topology
(two boxes), partition it into pipeline stages (Parmesan), map the stages onto devices
(Parmesan's optimal mapping), simulate a 1F1B iteration (and GPipe for comparison), and write
an HTML report with the timeline, the partitioned graph and the bandwidth heat map.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from shardplan.cli._common import positive_float, positive_int, print_json
from shardplan.cli.inspect import summarize
from shardplan.errors import ShardplanError
from shardplan.ir import Graph, Plan, Topology, save, write_atomic, write_json

DEFAULT_MODEL = "torchvision:resnet50"


def run_demo(out_dir: str | Path, *, model: str = DEFAULT_MODEL, batch_size: int = 8,
             boxes: int = 2, stages: int = 4, replicas: int = 4, microbatches: int = 8,
             time_limit: float = 30.0, quiet: bool = False) -> dict[str, Any]:
    """Run the demo chain, writing its files under ``out_dir``; returns what it produced."""
    from shardplan.capture import capture_spec
    from shardplan.topology import build

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    steps: list[dict[str, Any]] = []

    def say(msg: str) -> None:
        if not quiet:
            print(msg, flush=True)

    t_start = t0 = time.perf_counter()
    graph = capture_spec(model, batch_size=batch_size)
    save(graph, out / "graph.json")
    steps.append({"step": "capture (operator level)", "file": str(out / "graph.json"),
                  "seconds": time.perf_counter() - t0,
                  "nodes": graph.num_nodes, "edges": graph.num_edges})
    say(f"captured {model} at batch {batch_size}: {graph.num_nodes} operators, "
        f"{graph.fwd_flops.sum() / 1e9:.1f} GFLOP forward -> {out / 'graph.json'}")

    t0 = time.perf_counter()
    atomic = {"torchvision:resnet18": ["BasicBlock"], "torchvision:resnet34": ["BasicBlock"],
              }.get(model, ["Bottleneck"] if model.startswith("torchvision:resnet") else None)
    if atomic:
        mgraph = capture_spec(model, batch_size=batch_size, granularity="module", atomic=atomic)
        save(mgraph, out / "graph-module.json")
        steps.append({"step": "capture (module level)", "file": str(out / "graph-module.json"),
                      "seconds": time.perf_counter() - t0, "nodes": mgraph.num_nodes})
        say(f"captured at module level ({', '.join(atomic)} atomic): {mgraph.num_nodes} "
            f"nodes -> {out / 'graph-module.json'}")

    t0 = time.perf_counter()
    topo = build("dgx1", boxes=boxes)
    save(topo, out / "topology.json")
    steps.append({"step": "topology", "file": str(out / "topology.json"),
                  "seconds": time.perf_counter() - t0, "devices": topo.num_devices})
    say(f"built a DGX-1 V100 topology with {boxes} boxes: {topo.num_devices} devices -> "
        f"{out / 'topology.json'}")

    summary = {"graph": summarize(graph, devices=topo.num_devices),
               "topology": summarize(topo)}
    summary_file = out / "summary.json"
    write_json(summary_file, summary)

    plan, how = _partition(graph, topo, stages, replicas, microbatches, time_limit)
    steps.append({"step": "partition", "algorithm": plan.algorithm, "how": how,
                  "seconds": plan.search_seconds, "stages": plan.num_stages,
                  "replicas": plan.num_replicas})
    say(f"partitioned into {plan.num_stages} stages x {plan.num_replicas} replicas with "
        f"{how} in {plan.search_seconds:.2f} s")
    plan, how = _map(plan, graph, topo, time_limit)
    save(plan, out / "plan.json")
    steps.append({"step": "map", "how": how, "file": str(out / "plan.json"),
                  "objective": plan.objective.to_dict()})
    say(f"mapped the stages onto devices with {how}: {plan.objective.name} = "
        f"{plan.objective.value:.4g} -> {out / 'plan.json'}")

    from shardplan.report import write_report
    from shardplan.simulate import simulate

    t0 = time.perf_counter()
    result = simulate(plan, graph, topo)  # the plan's settings: 1F1B, its micro-batches
    gpipe = simulate(plan, graph, topo, schedule="gpipe", timeline=False)
    write_json(out / "simulation.json", result.to_dict())
    write_atomic(out / "schedule.txt", result.schedule.to_text())
    steps.append({"step": "simulate", "file": str(out / "simulation.json"),
                  "seconds": time.perf_counter() - t0,
                  "iteration_seconds": result.iteration_seconds,
                  "throughput": result.throughput, "bubble_fraction": result.bubble_fraction,
                  "peak_memory_bytes": max(result.peak_memory_bytes),
                  "gpipe_iteration_seconds": gpipe.iteration_seconds,
                  "gpipe_peak_memory_bytes": max(gpipe.peak_memory_bytes)})
    say(f"simulated 1F1B with {microbatches} micro-batches: "
        f"{result.iteration_seconds * 1e3:.2f} ms per iteration, {result.throughput:.1f} "
        f"samples/s, bubble {result.bubble_fraction:.0%}, peak memory "
        f"{max(result.peak_memory_bytes) / 2**30:.2f} GiB (GPipe: "
        f"{gpipe.iteration_seconds * 1e3:.2f} ms, {max(gpipe.peak_memory_bytes) / 2**30:.2f} "
        f"GiB) -> {out / 'simulation.json'}, {out / 'schedule.txt'}")

    t0 = time.perf_counter()
    rep = write_report(plan, graph, topo, out / "report.html", result=result, png_dir=out)
    steps.append({"step": "report", "file": rep["html"], "pngs": rep["pngs"],
                  "seconds": time.perf_counter() - t0})
    say(f"wrote the report to {out / 'report.html'} (pictures: "
        f"{', '.join(sorted(rep['pngs'].values()))})")
    say(f"done in {time.perf_counter() - t_start:.1f} s; outputs are in {out}/")
    return {"out_dir": str(out), "steps": steps, "summary_file": str(summary_file),
            "report": rep["html"]}


def _partition(graph: Graph, topo: Topology, stages: int, replicas: int, microbatches: int,
               time_limit: float) -> tuple[Plan, str]:
    """Parmesan's partitioner (issue #4) into ``stages`` x ``replicas``."""
    from shardplan import registry

    res = registry.run("partition", "parmesan", graph, topo, time_limit=time_limit,
                       stages=stages, replicas=replicas, microbatches=microbatches)
    return res.plan, "parmesan"


def _map(plan: Plan, graph: Graph, topo: Topology, time_limit: float) -> tuple[Plan, str]:
    """Parmesan's optimal mapping (issue #5) of the plan's stages onto devices."""
    from shardplan import registry

    res = registry.run("map", "optimal", graph, topo, plan=plan, time_limit=time_limit)
    return res.plan, "optimal"


def _handler(args: argparse.Namespace) -> int:
    if args.stages * args.replicas > 8 * args.boxes:
        raise ShardplanError(f"{args.stages} stages x {args.replicas} replicas need more than "
                             f"the {8 * args.boxes} GPUs of {args.boxes} DGX-1 boxes")
    result = run_demo(args.out_dir, model=args.model, batch_size=args.batch_size,
                      boxes=args.boxes, stages=args.stages, replicas=args.replicas,
                      microbatches=args.microbatches, time_limit=args.time_limit,
                      quiet=args.json)
    if args.json:
        print_json(result)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the main job end to end on a default model and topology",
                       description=__doc__)
    p.add_argument("--out-dir", default="demo-out", help="where to write (default: demo-out)")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"model spec (default {DEFAULT_MODEL})")
    p.add_argument("--batch-size", type=positive_int, default=8)
    p.add_argument("--boxes", type=positive_int, default=2, help="DGX-1 boxes (default 2)")
    p.add_argument("--stages", type=positive_int, default=4, help="pipeline stages (default 4)")
    p.add_argument("--replicas", type=positive_int, default=4,
                   help="replicas per stage (default 4)")
    p.add_argument("--microbatches", type=positive_int, default=8,
                   help="micro-batches per iteration (default 8)")
    p.add_argument("--time-limit", type=positive_float, default=30.0, metavar="SEC",
                   help="time limit of each search (default 30)")
    p.add_argument("--json", action="store_true", help="print what was produced as JSON")
    p.set_defaults(handler=_handler)
