"""``shardplan demo``: the main job end to end on defaults.

1. On a cluster this machine does not have: capture a real model (ResNet-50; operator level,
   and module level with its bottleneck blocks atomic), build two DGX-1 boxes (16 V100s),
   and let ``shardplan plan`` weigh every family of plan with the simulator; write the
   winner, its simulated iteration and schedule, and an HTML report with the ranking, the
   timeline, the partitioned graph and the bandwidth heat map.
2. The LLM story: import a published Megatron-LM run (GPT-3 175B on 96 DGX A100, TP 8 x
   PP 12, arXiv 2104.04473 Table 2), let the LLM search find a faster layout in the same
   simulator, and print the Megatron-LM arguments that launch it.
3. On this machine, for real: measure two local processes (``topology measure``), plan a
   small model on them, train the winner for a few steps with torch.distributed (on targets
   a model can learn, so the loss falls), and print the predicted against the measured time
   per step.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from shardplan.cli._common import declare_files, positive_float, positive_int, print_json
from shardplan.cli.inspect import summarize
from shardplan.errors import ShardplanError
from shardplan.ir import Plan, save, write_json

DEFAULT_MODEL = "torchvision:resnet50"
LOCAL_MODEL = "mlp"


def run_demo(out_dir: str | Path, *, model: str = DEFAULT_MODEL, batch_size: int = 8,
             boxes: int = 2, time_limit: float = 60.0, run: bool = True, steps: int = 5,
             quiet: bool = False, llm: bool = True) -> dict[str, Any]:
    """Run the demo (see the module docstring), writing its files under ``out_dir``;
    returns what it produced."""
    from shardplan.capture import capture_spec
    from shardplan.planner import search
    from shardplan.topology import build

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    done: list[dict[str, Any]] = []

    def say(msg: str) -> None:
        if not quiet:
            print(msg, flush=True)

    t_start = t0 = time.perf_counter()
    graph = capture_spec(model, batch_size=batch_size)
    save(graph, out / "graph.json")
    done.append({"step": "capture (operator level)", "file": str(out / "graph.json"),
                 "seconds": time.perf_counter() - t0, "nodes": graph.num_nodes,
                 "edges": graph.num_edges})
    say(f"captured {model} at batch {batch_size}: {graph.num_nodes} operators, "
        f"{graph.fwd_flops.sum() / 1e9:.1f} GFLOP forward -> {out / 'graph.json'}")
    atomic = {"torchvision:resnet18": ["BasicBlock"], "torchvision:resnet34": ["BasicBlock"],
              }.get(model, ["Bottleneck"] if model.startswith("torchvision:resnet") else None)
    if atomic:
        t0 = time.perf_counter()
        mgraph = capture_spec(model, batch_size=batch_size, granularity="module", atomic=atomic)
        save(mgraph, out / "graph-module.json")
        done.append({"step": "capture (module level)", "file": str(out / "graph-module.json"),
                     "seconds": time.perf_counter() - t0, "nodes": mgraph.num_nodes})
        say(f"captured at module level ({', '.join(atomic)} atomic): {mgraph.num_nodes} "
            f"nodes -> {out / 'graph-module.json'}")
    topo = build("dgx1", boxes=boxes)
    save(topo, out / "topology.json")
    write_json(out / "summary.json", {"graph": summarize(graph, devices=topo.num_devices),
                                      "topology": summarize(topo)})
    say(f"built a DGX-1 V100 topology with {boxes} boxes: {topo.num_devices} devices -> "
        f"{out / 'topology.json'}")

    t0 = time.perf_counter()
    found = search(graph, topo, time_limit=time_limit)
    plan = _winner(found)
    save(plan, out / "plan.json")
    best = found.ranked[0]
    comp = found.comparisons
    done.append({"step": "plan", "file": str(out / "plan.json"),
                 "seconds": time.perf_counter() - t0, "candidates": len(found.ranked),
                 "winner": best.row(), "comparisons": comp})
    say(f"weighed {len(found.ranked)} candidate plans of {len({r.family for r in found.ranked})}"
        f" families in {found.seconds:.1f} s (global batch {found.global_batch}):")
    shown: set[str] = set()
    for r in found.ranked:  # the best of each family
        if r.family in shown or not r.fits:
            continue
        shown.add(r.family)
        say(f"  {r.family:18s} {r.stages:>2} x {r.replicas:<2} {r.schedule:16s} "
            f"M={r.microbatches:<3} {r.gradient_sync:8s} {r.iteration_seconds * 1e3:8.2f} ms "
            f"per iteration")
    say(f"winner: {best.family}, {best.stages} stages x {best.replicas} replicas, "
        f"{best.schedule}, {best.microbatches} micro-batches: "
        f"{comp.get('speedup_over_data_parallel', 1.0):.2f}x faster than data parallelism "
        f"-> {out / 'plan.json'}")

    from shardplan.report import write_report
    from shardplan.simulate import save_schedule, simulate

    t0 = time.perf_counter()
    result = simulate(plan, graph, topo)
    write_json(out / "simulation.json", result.to_dict())
    save_schedule(result.schedule, out / "schedule.txt")
    rep = write_report(plan, graph, topo, out / "report.html", result=result, png_dir=out,
                       ranking=[r.row() for r in found.ranked[:20]])
    done.append({"step": "report", "file": rep["html"], "pngs": rep["pngs"],
                 "seconds": time.perf_counter() - t0,
                 "iteration_seconds": result.iteration_seconds,
                 "throughput": result.throughput, "bubble_fraction": result.bubble_fraction,
                 "peak_memory_bytes": max(result.peak_memory_bytes)})
    say(f"simulated the winner: {result.iteration_seconds * 1e3:.2f} ms per iteration, "
        f"{result.throughput:.0f} samples/s, bubble {result.bubble_fraction:.0%}, peak memory "
        f"{max(result.peak_memory_bytes) / 2**30:.2f} GiB; report -> {out / 'report.html'}")
    if llm:
        done.append(_llm_story(out, say, min(time_limit, 20.0)))
    if run:
        done.append(_local_run(out, steps, say))
    say(f"done in {time.perf_counter() - t_start:.1f} s; outputs are in {out}/")
    return {"out_dir": str(out), "steps": done, "summary_file": str(out / "summary.json"),
            "report": rep["html"]}


#: The published run the LLM story imports: Megatron-LM's GPT-3 175B on 768 A100 (arXiv
#: 2104.04473 Table 2, the row meg21t2-ptdp-174B-768 of ../shared/gpu-runs).
GPT3_175B = ("--num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 "
             "--max-position-embeddings 2048 --vocab-size 51200 --micro-batch-size 1 "
             "--global-batch-size 1536 --tensor-model-parallel-size 8 "
             "--pipeline-model-parallel-size 12 --fp16 --recompute-granularity full "
             "--recompute-method uniform --recompute-num-layers 1 --transformer-impl local")


def _llm_story(out: Path, say: Any, time_limit: float) -> dict[str, Any]:
    """Import a published Megatron-LM run, search a faster layout, print its arguments."""
    import dataclasses

    from shardplan.capture import capture_spec
    from shardplan.export import export
    from shardplan.importers.megatron import parse_megatron
    from shardplan.planner._llm import llm_plan, llm_search, wide_space
    from shardplan.strategy.llm import layout_plan
    from shardplan.topology import build_spec

    t0 = time.perf_counter()
    run = parse_megatron(GPT3_175B, num_gpus=768, cluster="dgx-a100,nodes=96")
    settings, _ = run.settings()
    # Megatron-LM's 2021 attention wrote its scores (docs/gpu-model.md)
    settings = dataclasses.replace(settings, attention="materialized")
    graph = capture_spec(run.model.spec, batch_size=1, meta=True)
    topo = build_spec("dgx-a100,nodes=96")
    _, base = llm_plan(graph, topo, run.parallel, settings)
    found = llm_search(graph, topo, dataclasses.replace(settings, gradient_sync="end"),
                       global_batch=run.global_batch, time_limit=time_limit,
                       include=[(run.parallel, settings)], space=wide_space(settings))
    best = found.best
    if best is None:
        raise ShardplanError("the LLM search found no layout that fits")
    plan = layout_plan(graph, topo, best.parallel, best.settings)
    save(plan, out / "llm-plan.json")
    args = export(plan, graph, topo, "megatron")
    write_json(out / "llm-megatron.json", {"args_text": args.text})
    import json

    text = json.loads(args.text)["args_text"]
    say(f"LLM: imported Megatron-LM's GPT-3 175B on 768 A100 ({run.parallel.label()}): "
        f"{base.iteration_seconds:.1f} s per iteration in the simulator; the search "
        f"({found.considered} layouts, {found.seconds:.0f} s) found {best.parallel.label()}, "
        f"{best.iteration_seconds:.1f} s ({base.iteration_seconds / best.iteration_seconds:.2f}x)"
        f" -> {out / 'llm-plan.json'}")
    say(f"  launch it with Megatron-LM's pretrain_gpt.py and: {text}")
    return {"step": "llm", "seconds": time.perf_counter() - t0,
            "baseline": run.parallel.label(), "baseline_seconds": base.iteration_seconds,
            "winner": best.parallel.label(), "winner_seconds": best.iteration_seconds,
            "megatron_args": text}


def _local_run(out: Path, steps: int, say: Any) -> dict[str, Any]:
    """Plan a small model on two measured local processes and train the winner for real."""
    import shardplan.measure  # noqa: F401 - registers the topology kind 'measure'
    from shardplan.capture import capture_spec
    from shardplan.planner import search
    from shardplan.runtime import config_for_plan, train
    from shardplan.simulate import simulate
    from shardplan.topology import build

    t0 = time.perf_counter()
    topo = build("measure", nproc=2, repeats=3)
    save(topo, out / "local-topology.json")
    graph = capture_spec(LOCAL_MODEL, batch_size=64, profile=True)
    save(graph, out / "local-graph.json")
    found = search(graph, topo, global_batch=256, families=["data-parallel", "parmesan",
                                                            "uniform"], time_limit=20)
    plan = _winner(found)
    save(plan, out / "local-plan.json")
    cfg = config_for_plan(plan, graph, steps=steps)
    res = train(cfg)
    measured = statistics.median(res.seconds_per_step[1:] or res.seconds_per_step)
    predicted = simulate(plan, graph, topo, timeline=False).iteration_seconds
    best = found.ranked[0]
    say(f"on this machine: measured 2 processes, planned {LOCAL_MODEL} (global batch 256): "
        f"{best.family} {best.stages} x {best.replicas}, {best.schedule}, "
        f"{best.microbatches} micro-batches; trained {steps} steps, loss "
        f"{res.losses[0]:.4f} -> {res.losses[-1]:.4f}; predicted {predicted * 1e3:.1f} ms per "
        f"step, measured {measured * 1e3:.1f} ms (predicted / measured "
        f"{predicted / measured:.2f}) -> {out / 'local-plan.json'}")
    return {"step": "local run", "seconds": time.perf_counter() - t0,
            "plan": str(out / "local-plan.json"), "losses": list(res.losses),
            "predicted_seconds": predicted, "measured_seconds": measured}


def _handler(args: argparse.Namespace) -> int:
    result = run_demo(args.out_dir, model=args.model, batch_size=args.batch_size,
                      boxes=args.boxes, time_limit=args.time_limit, run=not args.no_run,
                      steps=args.steps, quiet=args.json, llm=not args.no_llm)
    if args.json:
        print_json(result)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the main job end to end on a default model and topology",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", default="demo-out", help="where to write (default: demo-out)")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"model spec (default {DEFAULT_MODEL})")
    p.add_argument("--batch-size", type=positive_int, default=8)
    p.add_argument("--boxes", type=positive_int, default=2, help="DGX-1 boxes (default 2)")
    p.add_argument("--time-limit", type=positive_float, default=60.0, metavar="SEC",
                   help="time limit of the plan search (default 60)")
    p.add_argument("--no-run", action="store_true", help="skip the real run on 2 local "
                                                         "processes")
    p.add_argument("--steps", type=positive_int, default=5, help="steps of the real run "
                                                                 "(default 5)")
    p.add_argument("--no-llm", action="store_true", help="skip the LLM story (a published "
                                                         "Megatron-LM run imported and "
                                                         "planned faster)")
    p.add_argument("--json", action="store_true", help="print what was produced as JSON")
    declare_files(p, inputs=("model",))
    p.set_defaults(handler=_handler)


def _winner(found: Any) -> Plan:
    """The search's winner; None only when the time limit ran out before any candidate."""
    if found.winner is None:
        raise ShardplanError("the time limit ran out before any candidate was evaluated")
    return found.winner
