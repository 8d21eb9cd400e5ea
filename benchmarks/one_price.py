"""One price (issue 33): the planners that split layers, judged by the simulator they search in.

Run from the repository root::

    .venv/bin/python benchmarks/one_price.py [--quick] [--time-limit SECONDS]

Writes ``benchmarks/results/one_price.md`` (``one_price_quick.md`` with ``--quick``: the
first row only). For every row it runs ``shardplan plan``'s search
(:func:`shardplan.planner.search`) once, with the families data-parallel, PaSE, Parmesan and
the hybrid, and reports side by side, from that one run:

- **PaSE**: its best plan's simulated iteration, the best data-parallel family row's (every
  gradient sync: an all-reduce at the end, DDP's buckets, FSDP), and their ratio (goal: PaSE
  no slower within 2%, faster on AlexNet); the largest gap between a PaSE plan's own cost
  and its simulated iteration over all its rows (goal: within 10%);
- **hybrid**: per stages x replicas shape, the hybrid's best simulated iteration against the
  same Parmesan stages with the replicas as data-parallel replicas (goal: no slower, 2%).

Rows: ResNet-50 captured at batch 8 on two DGX-1 boxes at global batch 128 (the demo), GPT-2
captured at batch 8 on a 4 x 4 hierarchy, PaSE's own Transformer and AlexNet benchmarks on
flat machines of 8, 16 and 32 devices (their graphs' batch, as the paper splits it), and
BERT-base on two DGX-1 boxes.
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
from shardplan.generate import generate  # noqa: E402
from shardplan.ir import write_atomic  # noqa: E402
from shardplan.planner import search  # noqa: E402
from shardplan.topology import build  # noqa: E402

FAMILIES = ["data-parallel", "pase", "parmesan", "hybrid"]


def rows(quick: bool) -> list[tuple[str, object, object, int | None]]:
    """``(label, graph, topology, global batch)`` of every row."""
    out: list[tuple[str, object, object, int | None]] = [
        ("ResNet-50 (batch 8), dgx1 x2, 128",
         captured("torchvision:resnet50", batch_size=8), build("dgx1", boxes=2), 128)]
    if quick:
        return out
    out.append(("GPT-2 (batch 8), hierarchical 4x4, 128",
                captured("transformers:gpt2", batch_size=8, seq_len=128),
                build("hierarchical", shape=(4, 4)), 128))
    for kind in ("transformer", "alexnet"):
        g = generate(kind)
        for n in (8, 16, 32):
            out.append((f"PaSE {kind} (batch {g.batch_size}), flat {n}", g,
                        build("flat", num_devices=n), g.batch_size))
    out.append(("BERT-base (batch 8), dgx1 x2, 128",
                captured("transformers:bert-base", batch_size=8, seq_len=128),
                build("dgx1", boxes=2), 128))
    return out


def _best(rows_: list, family: str) -> object | None:
    fit = [r for r in rows_ if r.family == family and r.fits and math.isfinite(r.iteration_seconds)]
    return min(fit, key=lambda r: r.iteration_seconds) if fit else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--time-limit", type=float, default=120.0)
    args = ap.parse_args()
    lines = ["# One price: PaSE and the hybrid judged by the simulator they search in", "",
             "Regenerate: `.venv/bin/python benchmarks/one_price.py"
             + (" --quick" if args.quick else "") + "` (one `plan` search per row, families "
             + ", ".join(FAMILIES) + f", time limit {args.time_limit:g} s).", "",
             "| row | PaSE ms | data-parallel best ms (sync) | DP / PaSE | PaSE own cost / "
             "simulated (worst) | search s |", "|---|---|---|---|---|---|"]
    hybrid = ["", "| row | S x R | hybrid ms | Parmesan same stages, replicated, ms | "
              "Parmesan / hybrid |", "|---|---|---|---|---|"]
    for label, g, topo, batch in rows(args.quick):
        t0 = time.perf_counter()
        res = search(g, topo, global_batch=batch, families=FAMILIES,
                     time_limit=args.time_limit, workers=1)
        secs = time.perf_counter() - t0
        ranked = list(res.ranked)
        pase, dp = _best(ranked, "pase"), _best(ranked, "data-parallel")
        ratios = [r.objective_over_simulated for r in ranked
                  if r.family == "pase" and r.objective_over_simulated is not None]
        worst = max(ratios, key=lambda x: abs(x - 1.0)) if ratios else math.nan
        if pase is None or dp is None:
            lines.append(f"| {label} | - | - | - | - | {secs:.0f} |")
        else:
            lines.append(f"| {label} | {pase.iteration_seconds * 1e3:.2f} | "
                         f"{dp.iteration_seconds * 1e3:.2f} ({dp.gradient_sync}) | "
                         f"{dp.iteration_seconds / pase.iteration_seconds:.3f} | "
                         f"{worst:.3f} | {secs:.0f} |")
        shapes = sorted({(r.stages, r.replicas) for r in ranked if r.family == "hybrid"})
        for s, r in shapes:
            h = _best([x for x in ranked if (x.stages, x.replicas) == (s, r)], "hybrid")
            p = _best([x for x in ranked if (x.stages, x.replicas) == (s, r)], "parmesan")
            if h is None or p is None:
                continue
            hybrid.append(f"| {label} | {s} x {r} | {h.iteration_seconds * 1e3:.2f} | "
                          f"{p.iteration_seconds * 1e3:.2f} | "
                          f"{p.iteration_seconds / h.iteration_seconds:.3f} |")
        print(lines[-1], flush=True)
    out = ROOT / "benchmarks" / "results" / ("one_price_quick.md" if args.quick
                                             else "one_price.md")
    write_atomic(out, "\n".join(lines + hybrid) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
