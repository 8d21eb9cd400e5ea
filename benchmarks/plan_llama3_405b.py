"""`shardplan plan` against Meta's published Llama 3 405B layouts (`results/plan_llama3_405b.md`).

Issue 45's check: ``plan llama3:405B,seq=8192 --global-batch 2048 --precision bf16`` on
``dgx-h100,nodes=1024`` (8,192 H100) and ``nodes=2048`` (16,384) must return within 60 s a
plan that fits and is no slower, in the same simulator, than Meta's layout imported as
torchtitan options. Meta's layouts are the Llama 3 paper's (arXiv 2407.21783, Table 4): TP 8,
CP 1, PP 16 and DP 64 on 8,192 GPUs (a DP rank's batch 32 sequences of 8,192 tokens), DP 128
on 16,384 (16 sequences), interleaved pipelining, FSDP over the data-parallel ranks; they are
written here as torchtitan's own options (``[parallelism]`` degrees, ``Interleaved1F1B``,
micro-batches of 1) and read by ``shardplan import torchtitan``'s reader, 126 blocks split
over 16 stages as torchtitan splits them. The paper does not state its activation
checkpointing: each of torchtitan's modes (none, selective per op, full) is simulated and the
fastest that fits is the baseline (the table names it).

Both are simulated on the same cluster preset; the table prints the search's seconds (the
command's wall time in this process), the winner, the two iteration times and their ratio,
side by side in one run.

Run: ``python benchmarks/plan_llama3_405b.py`` (about three minutes: two searches of up to
60 s and two captures of the 405B model on the meta device).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shardplan.capture import capture_spec  # noqa: E402
from shardplan.importers.torchtitan import run_of_torchtitan  # noqa: E402
from shardplan.ir import ExecutionSettings, write_atomic  # noqa: E402
from shardplan.planner._llm import llm_plan, llm_search, wide_space  # noqa: E402
from shardplan.topology import build_spec  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "plan_llama3_405b.md"
GLOBAL_BATCH, SEQ = 2048, 8192


def meta_layout(gpus: int, ac: str) -> dict[str, dict[str, object]]:
    """Meta's layout on ``gpus`` H100 as torchtitan options, with activation checkpointing
    ``ac`` (module docstring)."""
    dp = gpus // (8 * 16)
    checkpoint: dict[str, object] = {"mode": ac}
    if ac == "selective":
        checkpoint["selective_ac_option"] = "op"
    return {"model": {"name": "llama3", "flavor": "405B"},
            "training": {"local_batch_size": GLOBAL_BATCH // dp, "seq_len": SEQ,
                         "mixed_precision_param": "bfloat16"},
            "parallelism": {"data_parallel_shard_degree": dp, "tensor_parallel_degree": 8,
                            "pipeline_parallel_degree": 16,
                            "pipeline_parallel_schedule": "Interleaved1F1B",
                            "pipeline_parallel_microbatch_size": 1},
            "activation_checkpoint": checkpoint}


def baseline(graph: object, topology: object, gpus: int) -> tuple[object, object, str]:
    """The fastest of Meta's layout's checkpointing modes that fits (else the fastest)."""
    found = []
    for ac in ("none", "selective", "full"):
        run = run_of_torchtitan(meta_layout(gpus, ac), num_gpus=gpus)
        settings, _ = run.settings()
        _, res = llm_plan(graph, topology, run.parallel, settings)  # type: ignore[arg-type]
        found.append((not res.fits_memory, res.iteration_seconds, ac, run, res))
    _, _, ac, run, res = min(found, key=lambda x: (x[0], x[1]))
    return run, res, ac


def winner_cells(base: Any, base_gib: float, best: Any, wall: float, found: Any) -> str:
    """A result row's cells after the published layout's name: its seconds, memory and fit,
    the winner with its knobs, seconds and memory, the search's seconds and layouts, and the
    speed-up (``plan_deepseek_v3.py`` writes the same)."""
    st = best.settings
    return (f"{base.iteration_seconds:.2f} | {base_gib:.1f} | "
            f"{'yes' if base.fits_memory else 'no'} | "
            f"{best.parallel.label()}, {st.gradient_sync}, micro-batch "
            f"{(st.microbatch_size or 0) // best.parallel.data_parallel} x "
            f"{st.microbatches}, recompute {st.recompute} | "
            f"{best.iteration_seconds:.2f} | {best.peak_memory_bytes / 2**30:.1f} | "
            f"{wall:.1f} | {found.considered} / {found.offered} | "
            f"{base.iteration_seconds / best.iteration_seconds:.2f}x |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", default="1024,2048", help="cluster sizes, comma-separated")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("-o", "--output", type=Path, default=OUT)
    args = ap.parse_args(argv)
    graph = capture_spec(f"llama3:405B,seq={SEQ}", batch_size=1, meta=True)
    lines = ["# Llama 3 405B: `plan` against Meta's published layout", "",
             "Generated by `python benchmarks/plan_llama3_405b.py` (its docstring says what is "
             "compared). Seconds per iteration of 2,048 sequences of 8,192 tokens, bf16, in "
             "the one simulator; memory is what each device holds (`docs/gpu-model.md`).", "",
             "| GPUs | Meta's layout | its s/iter | its GiB | fits | plan's winner | s/iter | "
             "GiB | search s | layouts priced / offered | speed-up |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for nodes in (int(x) for x in args.nodes.split(",")):
        gpus = nodes * 8
        topology = build_spec(f"dgx-h100,nodes={nodes}")
        run, base, ac = baseline(graph, topology, gpus)
        start = time.monotonic()
        st = ExecutionSettings(precision="bf16")
        found = llm_search(graph, topology, st, global_batch=GLOBAL_BATCH,
                           time_limit=args.time_limit, space=wide_space(st))
        wall = time.monotonic() - start
        best = found.best
        if best is None:
            lines.append(f"| {gpus} | {run.parallel.label()}, checkpointing {ac} | "
                         f"{base.iteration_seconds:.2f} "
                         f"| - | - | none fits | - | - | {wall:.1f} | - | - |")
            continue
        base_gib = max(base.device_memory_bytes or base.peak_memory_bytes) / 2**30
        lines.append(f"| {gpus} | {run.parallel.label()}, checkpointing {ac} | "
                     + winner_cells(base, base_gib, best, wall, found))
        print(lines[-1], flush=True)
    write_atomic(args.output, "\n".join(lines) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
