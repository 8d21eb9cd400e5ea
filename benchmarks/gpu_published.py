"""Published GPU training runs against shardplan's simulator: ``results/gpu_published.md``.

Every row of every ``*.csv`` in the published-runs folder (``../shared/gpu-runs/`` by default;
rows are read by their column names, so new files and rows join the table) is imported from
its Megatron-LM arguments (:func:`shardplan.importers.megatron.megatron_args_of_row`, the
folder README's rules), its model captured on the meta device at one sequence (the cost model
scales to the micro-batch), laid out on exactly its number of GPUs of its cluster
(``dgx-a100`` or ``dgx2-v100`` nodes), simulated, and printed beside the published figure:
seconds per iteration, model TFLOP/s per GPU as Megatron counts them (full recompute: 96 B s l
h^2 (1 + s/(6h) + V/(16 l h)); otherwise 72 B s l h^2 (1 + s/(6h) + V/(12 l h))), the error,
the predicted peak memory against the 80 GB (or 32 GB) the run had.

No constant was set from these rows (``docs/gpu-model.md`` lists each constant's source), so
every row is out of sample; the summary gives the median and worst error over all rows and
per source (the leave-one-source-out check: no source informed a constant that predicts
another).

Run: ``python benchmarks/gpu_published.py`` (about a minute per hundred rows; ``--rows ID,...``
for some, ``--runs DIR`` for another folder, ``-o FILE`` for another output).
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shardplan.capture import capture_spec  # noqa: E402
from shardplan.errors import ShardplanError  # noqa: E402
from shardplan.importers.megatron import megatron_args_of_row, parse_megatron  # noqa: E402
from shardplan.ir import write_atomic  # noqa: E402
from shardplan.planner._llm import llm_plan  # noqa: E402
from shardplan.topology import build_spec  # noqa: E402

DEFAULT_RUNS = ROOT.parent / "shared" / "gpu-runs"
OUT = ROOT / "benchmarks" / "results" / "gpu_published.md"


def cluster_of(row: dict[str, str]) -> tuple[str, float]:
    """The cluster preset a row ran on (by its ``gpu`` column) and its GPU memory."""
    gpu = row["gpu"].upper()
    gpus = int(row["gpus"])
    if "V100" in gpu:
        return f"dgx2-v100,nodes={max(1, math.ceil(gpus / 16))}", 32 * 2**30
    if "H100" in gpu:
        return f"dgx-h100,nodes={max(1, math.ceil(gpus / 8))}", 80 * 2**30
    return f"dgx-a100,nodes={max(1, math.ceil(gpus / 8))}", 80 * 2**30


def model_tflops(row: dict[str, str], seconds: float) -> float:
    """Model TFLOP/s per GPU as Megatron-LM's papers count them (module docstring)."""
    b, s = int(row["global_batch"]), int(row["seq"])
    l_, h, v = int(row["layers"]), int(row["hidden"]), int(row["vocab"])
    if row.get("recompute", "").strip() == "full":
        flops = 96 * b * s * l_ * h * h * (1 + s / (6 * h) + v / (16 * l_ * h))
    else:
        flops = 72 * b * s * l_ * h * h * (1 + s / (6 * h) + v / (12 * l_ * h))
    return flops / seconds / int(row["gpus"]) / 1e12


def published_tflops(row: dict[str, str]) -> float:
    return model_tflops(row, float(row["iteration_s"]))


_GRAPHS: dict[str, Any] = {}


def graph_of(spec: str) -> Any:
    if spec not in _GRAPHS:
        _GRAPHS[spec] = capture_spec(spec, batch_size=1, meta=True)
    return _GRAPHS[spec]


def predict(row: dict[str, str]) -> dict[str, Any]:
    """Import, capture, lay out and simulate one row."""
    import dataclasses

    start = time.monotonic()
    spec, capacity = cluster_of(row)
    topology = build_spec(spec)
    run = parse_megatron(megatron_args_of_row(row), num_gpus=int(row["gpus"]))
    settings, _ = run.settings()
    # Megatron-LM's 2020-2022 attention wrote the s x s scores (fused scale-mask-softmax)
    if "attention" in {f.name for f in dataclasses.fields(settings)}:
        settings = dataclasses.replace(settings, attention="materialized")
    graph = graph_of(run.model.spec)
    plan, result = llm_plan(graph, topology, run.parallel, settings)
    peak = max(result.peak_memory_bytes)
    layout = run.parallel.label()
    if settings.shard_unit == "module":
        layout += " (DeepSpeed, by module)"
    return {"seconds": result.iteration_seconds, "memory": peak, "capacity": capacity,
            "fits": peak <= capacity, "layout": layout,
            "micro": run.micro_batch_size, "wall": time.monotonic() - start,
            "bubble": result.bubble_fraction}


def stack_of(row: dict[str, str]) -> str:
    """The software that ran a row: DeepSpeed where its sharding column says so, else
    Megatron-LM (every source here is a Megatron-LM publication)."""
    sharding = row.get("optimizer_sharding", "").lower()
    return "runs of DeepSpeed" if "deepspeed" in sharding else "runs of Megatron-LM"


def source_of(row_id: str) -> str:
    return row_id.split("-")[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=Path, default=DEFAULT_RUNS, help="folder of *.csv rows")
    ap.add_argument("--rows", help="comma-separated row ids (default: all)")
    ap.add_argument("-o", "--output", type=Path, default=OUT)
    args = ap.parse_args(argv)
    files = sorted(args.runs.glob("*.csv"))
    if not files:
        print(f"gpu_published: no *.csv in {args.runs}", file=sys.stderr)
        return 2
    rows = [r for f in files for r in csv.DictReader(f.open(newline=""))]
    if args.rows:
        wanted = set(args.rows.split(","))
        rows = [r for r in rows if r["id"] in wanted]
    lines = ["# Published GPU training runs: predicted against measured", "",
             "Generated by `python benchmarks/gpu_published.py` (every row of "
             "`../shared/gpu-runs/*.csv`, imported from its Megatron-LM arguments, captured "
             "on the meta device, simulated on exactly its GPUs). No constant of the model "
             "was set from these rows (`docs/gpu-model.md`): every row is out of sample. "
             "Error = predicted / published - 1. Attention is priced as Megatron-LM ran it "
             "then (scores materialized, no flash attention); rows without a published "
             "micro-batch run micro-batches of 1 (the importer's rule).", "",
             "| row | GPUs | layout | micro-batch | published s | predicted s | error | "
             "published TFLOP/s/GPU | predicted TFLOP/s/GPU | predicted peak GiB | fits | "
             "seconds to predict |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    errors: dict[str, list[float]] = {}
    stacks: dict[str, list[float]] = {}
    fits_all = True
    for row in rows:
        try:
            p = predict(row)
        except ShardplanError as e:
            lines.append(f"| {row['id']} | {row['gpus']} | error: {e} |" + " |" * 9)
            fits_all = False
            continue
        pub = float(row["iteration_s"])
        err = p["seconds"] / pub - 1.0
        errors.setdefault(source_of(row["id"]), []).append(err)
        stacks.setdefault(stack_of(row), []).append(err)
        fits_all &= p["fits"]
        lines.append(
            f"| {row['id']} | {row['gpus']} | {p['layout']} | {p['micro']} | {pub:.3f} | "
            f"{p['seconds']:.3f} | {err:+.1%} | {published_tflops(row):.1f} | "
            f"{model_tflops(row, p['seconds']):.1f} | {p['memory'] / 2**30:.1f} of "
            f"{p['capacity'] / 2**30:.0f} | {'yes' if p['fits'] else 'NO'} | {p['wall']:.1f} |")
        print(f"{row['id']}: published {pub:.3f} s, predicted {p['seconds']:.3f} s "
              f"({err:+.1%}), {p['memory'] / 2**30:.1f} GiB", flush=True)
    every = [e for errs in errors.values() for e in errs]
    lines += ["", "## Summary", "",
              "| rows | median abs error | worst abs error | median signed error |",
              "|---|---|---|---|"]

    def stats(name: str, errs: list[float]) -> str:
        a = [abs(e) for e in errs]
        return (f"| {name} ({len(errs)}) | {statistics.median(a):.1%} | {max(a):.1%} | "
                f"{statistics.median(errs):+.1%} |")

    if every:
        lines.append(stats("all", every))
        for name, errs in sorted(stacks.items()):
            lines.append(stats(name, errs))
        for src, errs in sorted(errors.items()):
            lines.append(stats(src, errs))
    lines += ["", f"Every row predicted to fit in its GPUs' memory: "
              f"{'yes' if fits_all else 'no'}.", "",
              "Which rows informed a constant: none (each constant's source is a published "
              "kernel or NCCL measurement, `docs/gpu-model.md`). Leave-one-source-out: "
              "with no row informing a constant, each source's rows above are predicted by "
              "constants set from none of them.", ""]
    write_atomic(args.output, "\n".join(lines))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
