"""Speed-up of PaSE's strategies over data parallelism under each cost model (the paper's
Figure 6 analogue, predicted rather than run): cost(data-parallel) / cost(pase), and the
expert strategy's for comparison.

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
                v = {name: registry.run("strategy", name, g, topo, cost_model=model)
                     .plan.objective.value for name in ("pase", "data-parallel", "expert")}
                rows.append((model, kind, p, v["data-parallel"] / v["pase"],
                             v["data-parallel"] / v["expert"]))
                print(f"{model:8s} {kind:13s} {p:3d}  pase x{rows[-1][3]:.2f}  "
                      f"expert x{rows[-1][4]:.2f}", flush=True)
    RESULTS.mkdir(exist_ok=True)
    lines = ["# Predicted speed-up over data parallelism", "",
             f"`{' '.join(['benchmarks/pase_speedup.py', *sys.argv[1:]])}`: "
             "cost(data-parallel) / cost(strategy) under each cost model.", "",
             "| cost model | benchmark | devices | PaSE | expert |", "|---|---|---|---|---|"]
    lines += [f"| {m} | {k} | {p} | {a:.2f} | {b:.2f} |" for m, k, p, a, b in rows]
    name = "pase_speedup_quick" if args.quick else "pase_speedup"
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, model in zip(axes, ("pase", "default"), strict=True):
        for kind in KINDS:
            xs = [p for m, k, p, _, _ in rows if m == model and k == kind]
            ys = [a for m, k, _, a, _ in rows if m == model and k == kind]
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
