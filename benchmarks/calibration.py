"""Simulator calibration: predicted / measured iteration time of real runs on this machine.

For each model: measure this machine's links (``shardplan topology measure --nproc 2``),
capture the model with per-operator profiling (``shardplan capture --profile``), and for
several plans predict one training iteration with ``shardplan simulate --json``
(``iteration_seconds``) and run it with the runtime (``shardplan train``'s code path, the
same processes for every plan of one process count); report predicted / measured.

Plans: a 2-stage pipeline cut by operator count, the same on one process with 2 micro-batches
(no pipeline: the simulator's compute model alone), data parallelism over 2 replicas, and the
2-stage plan of ``shardplan partition --algorithm parmesan`` when it exists.

Usage::

    .venv/bin/python benchmarks/calibration.py            # mlp and a small transformer
    .venv/bin/python benchmarks/calibration.py --quick    # mlp only, fewer steps

Writes ``benchmarks/results/calibration.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from shardplan.ir import load_graph, load_plan, save  # noqa: E402
from shardplan.ir.io import write_atomic  # noqa: E402
from shardplan.runtime import config_for_plan, contiguous_plan, train_many  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
CLI = str(ROOT / ".venv" / "bin" / "shardplan")
MICRO = 2


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *argv], capture_output=True, text=True, check=False)


def _simulate(plan: str, graph: str, topo: str, schedule: str) -> float | None:
    done = _cli("simulate", plan, graph, topo, "--schedule", schedule, "--microbatches",
                str(MICRO), "--optimizer", "adam", "--json")
    if done.returncode != 0:
        sys.stderr.write(f"simulate failed: {done.stderr.strip()}\n")
        return None
    return float(json.loads(done.stdout)["iteration_seconds"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    steps, warmup = (5, 2) if args.quick else (10, 3)
    models = [("mlp", "mlp", 256)]
    if not args.quick:
        models.append(("transformer", "transformer,num_layers=4,d_model=128,vocab_size=2048",
                       16))
    if _cli("simulate", "--help").returncode != 0:
        sys.stderr.write("shardplan simulate is not available: nothing to calibrate\n")
        return 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        topo = os.path.join(tmp, "topo.json")
        done = _cli("topology", "measure", "--nproc", "2", "-o", topo)
        if done.returncode != 0:
            sys.stderr.write(done.stderr)
            return 2
        for label, spec, batch in models:
            gpath = os.path.join(tmp, f"{label}.json")
            done = _cli("capture", spec, "--batch-size", str(batch), "--seq-len", "32",
                        "--profile", "-o", gpath)
            if done.returncode != 0:
                sys.stderr.write(done.stderr)
                return 2
            graph = load_graph(gpath)
            plans = {"2 stages x 1 replica (operator count)": contiguous_plan(graph, 2, 1),
                     "1 stage x 2 replicas (data parallel)": contiguous_plan(graph, 1, 2)}
            ppath = os.path.join(tmp, f"{label}-parmesan.json")
            if _cli("partition", gpath, topo, "--algorithm", "parmesan", "--stages", "2",
                    "-o", ppath).returncode == 0:
                p = load_plan(ppath)
                if p.num_replicas == 1 and p.num_stages == 2:
                    plans["2 stages (parmesan)"] = p
            one = contiguous_plan(graph, 1, 1)
            cfgs, names, files = [], [], []
            for name, plan in plans.items():
                path = os.path.join(tmp, f"{label}-{len(files)}.json")
                save(plan, path)
                files.append(path)
                names.append(name)
                cfgs.append(config_for_plan(plan, graph, model=spec, steps=steps,
                                            schedule="gpipe", microbatches=MICRO,
                                            batch_size=batch, seq_len=32))
            measured = [r.seconds_per_step for r in train_many(cfgs)]
            path = os.path.join(tmp, f"{label}-one.json")
            save(one, path)
            files.append(path)
            names.append("1 stage x 1 device")
            measured += [train_many([config_for_plan(
                one, graph, model=spec, steps=steps, schedule="gpipe", microbatches=MICRO,
                batch_size=batch, seq_len=32)])[0].seconds_per_step]
            for name, path, secs in zip(names, files, measured, strict=True):
                t = float(np.mean(secs[warmup:]))
                pred = _simulate(path, gpath, topo, "gpipe")
                rows.append((label, name, pred, t))
    lines = [
        "# Simulator calibration: predicted / measured seconds per iteration",
        "",
        f"This machine, CPU processes (gloo, one thread each), topology from `shardplan "
        f"topology measure --nproc 2`, graphs captured with `--profile`, GPipe, {MICRO} "
        f"micro-batches, Adam; measured = mean of {steps - warmup} iterations after {warmup} "
        f"warm-up. Generated by `benchmarks/calibration.py{' --quick' if args.quick else ''}`.",
        "",
        "| model | plan | predicted ms | measured ms | predicted / measured |",
        "|---|---|---|---|---|",
    ]
    for label, name, pred, meas in rows:
        ratio = f"{pred / meas:.2f}" if pred else "n/a"
        ptxt = f"{pred * 1e3:.2f}" if pred else "simulate failed"
        lines.append(f"| {label} | {name} | {ptxt} | {meas * 1e3:.2f} | {ratio} |")
    text = "\n".join(lines) + "\n"
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / ("calibration_quick.md" if args.quick else "calibration.md")
    write_atomic(out, text)
    sys.stdout.write(text + f"wrote {out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
