"""Speed-up of PaSE's strategies over data parallelism under each cost model (the paper's
Figure 6 analogue, predicted rather than run): cost(data-parallel) / cost(pase), and the
expert strategy's for comparison, with the model-parallel degree the expert chose (the
cheapest Megatron-style degree dividing p) and the devices data parallelism really uses (a
batch of 128 with the CNNs' cutoff 4 splits at most 32 ways: at 64 devices it uses 32).

    .venv/bin/python benchmarks/pase_speedup.py            # 4, 8, 16, 32, 64 devices
    .venv/bin/python benchmarks/pase_speedup.py --quick    # 4 and 8 devices

Writes ``benchmarks/results/pase_speedup.md`` and ``pase_speedup.png``. The ``pase`` model
is the prototype's (FLOP-equivalents, F = 10 TFLOP/s, B = 16 GB/s); the ``default`` model runs
on a flat topology of N V100-like devices (12.5 GB/s links, 32 GB each). Each strategy is
optimal (pase) or evaluated (baselines) under the model named in its row.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shardplan import registry  # noqa: E402
from shardplan.generate import generate  # noqa: E402
from shardplan.topology import flat  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
KINDS = ("alexnet", "inception-v3", "rnnlm", "transformer")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 and 8 devices only")
    args = ap.parse_args()
    devices = (4, 8) if args.quick else (4, 8, 16, 32, 64)
    rows = []
    for model in ("pase", "default"):
        for kind in KINDS:
            g = generate(kind)
            for p in devices:
                topo = flat(p)
                plans = {name: registry.run("strategy", name, g, topo, cost_model=model).plan
                         for name in ("pase", "data-parallel", "expert")}
                v = {name: pl.objective.value for name, pl in plans.items()}
                rows.append((model, kind, p, v["data-parallel"] / v["pase"],
                             v["data-parallel"] / v["expert"],
                             plans["expert"].meta.get("choice"),
                             plans["data-parallel"].meta["devices_used"]))
                print(f"{model:8s} {kind:13s} {p:3d}  pase x{rows[-1][3]:.2f}  "
                      f"expert x{rows[-1][4]:.2f} (m={rows[-1][5]})  "
                      f"data parallel on {rows[-1][6]}", flush=True)
    RESULTS.mkdir(exist_ok=True)
    lines = ["# Predicted speed-up over data parallelism", "",
             f"`{' '.join(['benchmarks/pase_speedup.py', *sys.argv[1:]])}`: "
             "cost(data-parallel) / cost(strategy) under each cost model. `expert m`: the "
             "model-parallel degree the expert strategy chose (the cheapest power of two "
             "dividing the devices); `data parallel on`: devices data parallelism uses, "
             "marked * when the batch does not split over all of them (its speed-ups are then "
             "over a run on fewer devices).", "",
             "| cost model | benchmark | devices | PaSE | expert | expert m | "
             "data parallel on |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {m} | {k} | {p} | {a:.2f} | {b:.2f} | {mp} | {used}{'*' if used < p else ''} |"
              for m, k, p, a, b, mp, used in rows]
    name = "pase_speedup_quick" if args.quick else "pase_speedup"
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, model in zip(axes, ("pase", "default"), strict=True):
        for kind in KINDS:
            xs = [r[2] for r in rows if r[0] == model and r[1] == kind]
            ys = [r[3] for r in rows if r[0] == model and r[1] == kind]
            ax.plot(xs, ys, marker="o", label=kind)
        ax.set_xscale("log", base=2)
        ax.set_title(f"cost model: {model}")
        ax.set_xlabel("devices")
        ax.axhline(1.0, color="grey", lw=0.5)
    axes[0].set_ylabel("speed-up over data parallel (predicted)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=120)
    print(f"wrote {RESULTS / (name + '.md')}")


if __name__ == "__main__":
    main()
