"""`replan` against a fresh `plan` for Llama 3 405B on 16,384 H100 less a node and plus 64
GPUs (issue 48, item 2; `results/replan_405b.md`).

One run, side by side:

1. the first search, as ``plan llama3:405B --cluster dgx-h100,nodes=2048 --global-batch 2048``
   runs it (the LLM search, 60 s), whose best 20 layouts the plan file keeps for a re-plan;
2. for each change (one node removed: 16,376 GPUs; 64 GPUs added: 16,448):
   - **plan on the new cluster**: the LLM search ``plan`` runs, on exactly the new count
     (``dgx-h100,nodes=2047`` / ``2056``): an LLM layout uses ``tp x cp x pp x dp`` GPUs
     with ``dp`` dividing the global batch, and neither count is one;
   - **fresh search**: the re-plan's search without the first search's layouts and prices
     (``warm=False``), over the same device counts, with ``plan``'s 60 s;
   - **replan**: the re-plan with its default 10 s, in this process;
   - **replan command**: ``shardplan replan PLAN --remove node2047`` (``--add-gpus 64``) as
     a user runs it, from the plan file and the graph file, wall time of the whole command.

Times are wall seconds and, in brackets, CPU seconds of this process (the machine may be
shared: the CPU time is what the work costs). Step times are the one simulator's.

Run: ``python benchmarks/replan_405b.py`` (about five minutes).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shardplan.capture import capture_spec  # noqa: E402
from shardplan.ir import ExecutionSettings, Objective, save, write_atomic  # noqa: E402
from shardplan.planner._cluster_change import change_by_flags  # noqa: E402
from shardplan.planner._llm import llm_search, wide_space  # noqa: E402
from shardplan.planner._replan import CONTEXT_KEY, ReplanContext, replan  # noqa: E402
from shardplan.strategy.llm import layout_plan  # noqa: E402
from shardplan.topology import build_spec  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "replan_405b.md"
BATCH, SEQ, NODES = 2048, 8192, 2048


def _timed(fn, *args, **kw):  # type: ignore[no-untyped-def]
    w, c = time.monotonic(), time.process_time()
    out = fn(*args, **kw)
    return out, time.monotonic() - w, time.process_time() - c


def _first(graph, topology, limit):  # type: ignore[no-untyped-def]
    """The first search and the plan file ``plan -o`` writes of it."""
    st = ExecutionSettings(precision="bf16")
    found, wall, cpu = _timed(llm_search, graph, topology, st, global_batch=BATCH,
                              time_limit=limit, space=wide_space(st))
    b = found.best
    plan = layout_plan(graph, topology, b.parallel, b.settings,
                       objective=Objective("iteration_seconds", b.iteration_seconds))
    ctx = ReplanContext(global_batch=BATCH, settings=st,
                        candidates=tuple(c for c in found.ranked if c.fits)[:20],
                        cluster=f"dgx-h100,nodes={NODES}", topology=topology.name)
    from dataclasses import replace

    return replace(plan, meta={CONTEXT_KEY: ctx.to_dict()}), ctx, wall, cpu, found


def _plan_exact(graph, nodes, limit):  # type: ignore[no-untyped-def]
    """``plan``'s LLM search on exactly ``nodes`` nodes."""
    st = ExecutionSettings(precision="bf16")
    found, wall, cpu = _timed(llm_search, graph, build_spec(f"dgx-h100,nodes={nodes}"), st,
                              global_batch=BATCH, time_limit=limit, space=wide_space(st))
    return found.best, found.offered, wall, cpu


def _command(plan_file: Path, graph_file: Path, flags: list[str]) -> tuple[dict, float]:
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "shardplan", "-q", "replan", str(plan_file),
                          "--graph", str(graph_file), *flags, "--json"], cwd=ROOT,
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout), time.monotonic() - start


def _cell(c, extra: str = "") -> str:  # type: ignore[no-untyped-def]
    """Two cells: the layout (and its GPUs), its seconds per step."""
    if c is None:
        return f"no layout{extra} | -"
    return (f"{c.parallel.label()} ({c.parallel.world_size:,} GPUs){extra} | "
            f"{c.iteration_seconds:.3f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--time-limit", type=float, default=60.0, help="plan's and the fresh "
                    "search's limit (default 60)")
    ap.add_argument("--replan-limit", type=float, default=10.0)
    ap.add_argument("-o", "--output", type=Path, default=OUT)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    graph = capture_spec(f"llama3:405B,seq={SEQ}", batch_size=8, meta=True)
    topology = build_spec(f"dgx-h100,nodes={NODES}")
    plan, ctx, wall, cpu, found = _first(graph, topology, args.time_limit)
    lines = ["# Llama 3 405B: `replan` against a fresh `plan`", "",
             "Generated by `python benchmarks/replan_405b.py` (its docstring says what is "
             "compared). Global batch 2,048 sequences of 8,192 tokens, bf16, dgx-h100 nodes; "
             "seconds are wall (CPU of the process in brackets; the machine may be shared).",
             "", f"First search on 16,384 GPUs: {plan.parallel.label()}, "
             f"{plan.objective.value:.3f} s/step, {found.considered:,} of {found.offered:,} "
             f"layouts priced in {wall:.1f} s ({cpu:.1f}).", "",
             "| change | GPUs now | `plan` on exactly them | s/step | fresh search | s/step | "
             "its s | replan | s/step | replan s | reshard s (GiB moved) | what replan "
             "reused | `shardplan replan` command s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        plan_file, graph_file = Path(tmp) / "plan.json", Path(tmp) / "graph.json"
        save(plan, plan_file)
        save(graph, graph_file)
        for label, kw, flags, nodes in (
                ("one node less", {"remove": ["node2047"]}, ["--remove", "node2047"], 2047),
                ("64 GPUs more", {"add_gpus": 64}, ["--add-gpus", "64"], 2056)):
            change = change_by_flags(topology, **kw)
            exact, offered, ewall, ecpu = _plan_exact(graph, nodes, args.time_limit)
            fresh, fwall, fcpu = _timed(replan, graph, plan, change, ctx,
                                        time_limit=args.time_limit, warm=False)
            warm, rwall, rcpu = _timed(replan, graph, plan, change, ctx,
                                       time_limit=args.replan_limit)
            cmd, cwall = _command(plan_file, graph_file, flags)
            rs = warm.best.reshard
            reused = (f"{warm.reused['first_search_layouts']} layouts order the search, "
                      f"{warm.reused['times_kept']} kept their times; "
                      f"priced {warm.search.priced} of {warm.search.offered:,}")
            cut = ", timed out" if fresh.search.timed_out else ", finished"
            lines.append(
                f"| {label} | {change.num_alive:,} | {_cell(exact, f' ({offered} offered)')} | "
                f"{_cell(fresh.search.best)} | {fwall:.1f} ({fcpu:.1f}{cut}) | "
                f"{_cell(warm.search.best)} | {rwall:.1f} ({rcpu:.1f}) | "
                f"{rs.seconds:.3g} ({rs.moved_bytes / 2**30:,.0f}) | {reused} | {cwall:.1f} "
                f"(its best {cmd['best']['iteration_seconds']:.3f} s/step) |")
            print(lines[-1], flush=True)
            ok = warm.best.iteration_seconds <= fresh.best.iteration_seconds * (1 + 1e-9)
            print(f"  replan no slower than the fresh search: {ok}", flush=True)
    write_atomic(args.output, "\n".join(lines) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
