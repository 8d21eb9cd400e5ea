"""``shardplan demo``: the longest chain of shardplan that exists, on defaults.

Today: capture a real model at operator and module level, build a DGX-1 topology (two boxes),
and validate and summarise both (the planners, simulator and runtime join this chain as their
issues land).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from shardplan.cli._common import positive_int, print_json
from shardplan.cli.inspect import summarize
from shardplan.ir import save, write_json

DEFAULT_MODEL = "torchvision:resnet50"


def run_demo(out_dir: str | Path, *, model: str = DEFAULT_MODEL, batch_size: int = 8,
             boxes: int = 2, quiet: bool = False) -> dict[str, Any]:
    """Run the demo chain, writing its files under ``out_dir``; returns what it produced."""
    from shardplan.capture import capture_spec
    from shardplan.topology import build

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    steps: list[dict[str, Any]] = []

    def say(msg: str) -> None:
        if not quiet:
            print(msg, flush=True)

    t0 = time.perf_counter()
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
    lb = summary["graph"]["lower_bounds_flops"][str(topo.num_devices)]
    say(f"lower bound on per-device work over {topo.num_devices} devices: "
        f"{lb['bound'] / 1e9:.2f} GFLOP per iteration "
        f"({lb['bound'] / topo.devices[0].flops * 1e3:.3f} ms at V100 peak)")
    say("planning, mapping, simulation and training join this demo as issues #3-#8 land; "
        f"outputs are in {out}/")
    return {"out_dir": str(out), "steps": steps, "summary_file": str(summary_file)}


def _handler(args: argparse.Namespace) -> int:
    result = run_demo(args.out_dir, model=args.model, batch_size=args.batch_size,
                      boxes=args.boxes, quiet=args.json)
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
    p.add_argument("--json", action="store_true", help="print what was produced as JSON")
    p.set_defaults(handler=_handler)
