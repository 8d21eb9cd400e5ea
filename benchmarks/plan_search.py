"""``shardplan plan`` against the single-family plans a user would otherwise pick.

Run from the repository root::

    .venv/bin/python benchmarks/plan_search.py [--quick] [--time-limit SECONDS]

Writes ``benchmarks/results/plan_search.md`` (``plan_search_quick.md`` with ``--quick``).
For ResNet-152, BERT-large, GPT-2 and Swin-B (operator-level graphs at batch 8 per device,
cached by ``benchmarks._graphs.captured``) on three machines of the papers -- two DGX-1 boxes
(16 V100s, NVLink inside, Ethernet across), a two-level 4 x 4 hierarchy (50 GB/s inside a
box, 100 Gb/s across) and a 64-device 8 x 8 torus -- it runs the planner
(:func:`shardplan.planner.search`, every family, the default ``--time-limit``) at the global
batch ``8 x devices`` and compares its winner, by simulated time per iteration of that global
batch, with

- **data parallel**: one stage on every device, DDP's bucketed all-reduce (the search's own
  row for it: the same simulator, the same settings);
- **Parmesan's own (S, R)**: ``partition --algorithm parmesan`` left to choose stages and
  replicas itself (1F1B, micro-batches of 8 samples, the planner's default settings
  otherwise), consecutively mapped, as the paper's tool returns it;
- **PipeDream**: ``partition --algorithm pipedream`` (its own stages, replication and
  consecutive device ranges).

Every plan is simulated by :func:`shardplan.simulate.simulate` at the same global batch. The
ratios are "reference time / winner time" (above 1.00: the planner's plan is faster); the
planner's wall time is reported next to them (goal: under 60 s per model and machine with
2 cores). ``--quick``: ResNet-152 on the DGX-1 pair only.
"""

from __future__ import annotations

import argparse
import math
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
from shardplan.errors import ShardplanError  # noqa: E402
from shardplan.ir import ExecutionSettings, write_atomic  # noqa: E402
from shardplan.planner import search  # noqa: E402
from shardplan.simulate import simulate  # noqa: E402
from shardplan.topology import build  # noqa: E402

MODELS = {"ResNet-152": ("torchvision:resnet152", {}),
          "BERT-large": ("transformers:bert-large", {"seq_len": 128}),
          "GPT-2": ("transformers:gpt2", {"seq_len": 128}),
          "Swin-B": ("torchvision:swin_b", {})}
PER_DEVICE = 8


def machines() -> dict[str, object]:
    """The three machines, built the way ``--cluster`` builds them."""
    return {
        "2 x DGX-1": build("dgx1", boxes=2),
        "hier 4 x 4": build("hierarchical", shape=(4, 4), level_names=("box", "gpu"),
                            bandwidth=(12.5e9, 50e9), latency=(2.5e-5, 2e-6),
                            name="hier-4x4"),
        "torus 8 x 8": build("torus2d", shape=(8, 8)),
    }


def _reference(algorithm: str, graph, topo, global_batch: int, limit: float
               ) -> tuple[float, str, float]:
    """Simulated seconds of ``algorithm``'s own plan, its shape, its search seconds."""
    micro = max(1, global_batch // PER_DEVICE)
    settings, _ = ExecutionSettings().override(schedule="1f1b", microbatches=micro,
                                               microbatch_size=global_batch // micro)
    opts = {k: v for k, v in settings.to_dict().items() if k != "global_batch"}
    t0 = time.perf_counter()
    try:
        plan = registry.run("partition", algorithm, graph, topo, time_limit=limit,
                            **opts).plan
    except ShardplanError as exc:
        return math.nan, f"none ({exc})", time.perf_counter() - t0
    secs = time.perf_counter() - t0
    sim = simulate(plan, graph, topo, timeline=False)
    reps = sorted({len(st.devices) for st in plan.stages})
    shape = f"{plan.num_stages} x {'/'.join(map(str, reps))}"
    return sim.iteration_seconds if sim.fits_memory else math.inf, shape, secs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="ResNet-152 on the DGX-1 pair only")
    ap.add_argument("--time-limit", type=float, default=60.0,
                    help="the planner's --time-limit per model and machine (default 60)")
    args = ap.parse_args()
    models = {"ResNet-152": MODELS["ResNet-152"]} if args.quick else MODELS
    tops = machines()
    if args.quick:
        tops = {"2 x DGX-1": tops["2 x DGX-1"]}
    rows = []
    t_start = time.perf_counter()
    for name, (spec, extra) in models.items():
        graph = captured(spec, batch_size=PER_DEVICE, **extra)
        for mname, topo in tops.items():
            glob = PER_DEVICE * topo.num_devices
            res = search(graph, topo, global_batch=glob, time_limit=args.time_limit)
            win = res.ranked[0] if res.winner is not None else None
            dp = [r for r in res.ranked if r.family == "data-parallel"
                  and r.gradient_sync == "bucketed" and r.fits]
            dp_t = dp[0].iteration_seconds if dp else math.inf
            ref_limit = max(10.0, args.time_limit / 2)
            pm_t, pm_shape, pm_s = _reference("parmesan", graph, topo, glob, ref_limit)
            pd_t, pd_shape, pd_s = _reference("pipedream", graph, topo, glob, ref_limit)
            rows.append(dict(model=name, machine=mname, n=graph.num_nodes, win=win,
                             seconds=res.seconds, timed_out=res.timed_out,
                             candidates=len(res.ranked), dp=dp_t, pm=(pm_t, pm_shape, pm_s),
                             pd=(pd_t, pd_shape, pd_s)))
            w = win.iteration_seconds if win else math.nan
            print(f"{name:10s} {mname:11s} winner {win.family if win else '-'} "
                  f"{w * 1e3:8.2f} ms | DP {dp_t * 1e3:8.2f} | parmesan {pm_shape} "
                  f"{pm_t * 1e3:8.2f} | pipedream {pd_shape} {pd_t * 1e3:8.2f} | "
                  f"search {res.seconds:.1f} s", flush=True)
    total = time.perf_counter() - t_start
    write_atomic(_out(args), _table(rows, args, total))
    print(f"wrote {_out(args)} in {total:.0f} s")
    return 0


def _out(args: argparse.Namespace) -> Path:
    name = "plan_search_quick.md" if args.quick else "plan_search.md"
    return ROOT / "benchmarks" / "results" / name


def _ms(t: float) -> str:
    if math.isnan(t):
        return "-"
    return "no fit" if math.isinf(t) else f"{t * 1e3:.2f}"


def _ratio(ref: float, win: float) -> str:
    if not (math.isfinite(ref) and math.isfinite(win)):
        return "-"
    return f"{ref / win:.2f}x"


def _table(rows: list[dict], args: argparse.Namespace, total: float) -> str:
    lines = [
        "# `shardplan plan` against single-family plans", "",
        f"Written by `benchmarks/plan_search.py{' --quick' if args.quick else ''}` (do not "
        f"edit by hand). Batch {PER_DEVICE} per device (global batch {PER_DEVICE} x devices), "
        f"the planner's default settings (Adam, fp32, roofline compute), planner time limit "
        f"{args.time_limit:.0f} s; simulated ms per iteration of the global batch. Ratios are "
        "reference / winner (above 1.00x: the planner's plan is faster). Run took "
        f"{total:.0f} s.", "",
        "| model | machine | winner | winner ms | vs data parallel | vs Parmesan (S x R) | "
        "vs PipeDream (S x R) | candidates | search s |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    worst_dp = math.inf
    for r in rows:
        win = r["win"]
        w = win.iteration_seconds if win else math.nan
        desc = (f"{win.family} {win.stages} x {win.replicas} {win.schedule} M={win.microbatches}"
                f" {win.mapping} {win.gradient_sync}" if win else "none")
        pm_t, pm_shape, _ = r["pm"]
        pd_t, pd_shape, _ = r["pd"]
        if math.isfinite(r["dp"]) and math.isfinite(w):
            worst_dp = min(worst_dp, r["dp"] / w)
        lines.append(
            f"| {r['model']} | {r['machine']} | {desc} | {_ms(w)} | {_ratio(r['dp'], w)} | "
            f"{_ratio(pm_t, w)} ({pm_shape}, {_ms(pm_t)} ms) | "
            f"{_ratio(pd_t, w)} ({pd_shape}, {_ms(pd_t)} ms) | {r['candidates']} | "
            f"{r['seconds']:.1f}{' (limit)' if r['timed_out'] else ''} |")
    slow = max((r["seconds"] for r in rows), default=0.0)
    lines += ["", f"Slowest search: {slow:.1f} s. Smallest gain over data parallel: "
              f"{worst_dp:.2f}x (at least 1.00x by construction: data parallelism is one of "
              "the candidates the simulator ranks). The references are simulated at the same "
              "global batch with the same simulator; a reference above the winner would mean "
              "the planner missed a plan its families can build.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
