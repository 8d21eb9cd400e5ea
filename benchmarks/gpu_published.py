"""Published GPU training runs against shardplan's simulator: ``results/gpu_published.md``.

Every row of every ``*.csv`` in the published-runs folders (``../shared/gpu-runs/`` and
``benchmarks/data/gpu-runs/`` by default; rows are read by their column names, so new files and
rows join the table) is imported -- a row of Megatron-LM from its arguments
(:func:`shardplan.importers.megatron.megatron_args_of_row`, the folder README's rules), a row
whose ``framework`` is ``torchtitan`` from its ``[model]``, ``[training]`` and
``[activation_checkpoint]`` options (:func:`shardplan.importers.torchtitan.run_of_torchtitan`,
FSDP over all its GPUs) -- its model captured on the meta device at one sequence (the cost
model scales to the micro-batch), laid out on exactly its number of GPUs of its cluster
(``dgx-a100`` or ``dgx2-v100`` nodes), simulated, and printed beside the published figure:
seconds per iteration, model TFLOP/s per GPU as Megatron counts them (full recompute: 96 B s l
h^2 (1 + s/(6h) + V/(16 l h)); otherwise 72 B s l h^2 (1 + s/(6h) + V/(12 l h))), the error,
the predicted peak memory against the 80 GB (or 32 GB) the run had.

No constant was set from these rows (``docs/gpu-model.md`` lists each constant's source), so
every row is out of sample; the summary gives the median and worst error over all rows and
per source (the leave-one-source-out check: no source informed a constant that predicts
another).

torchtitan rows publish tokens per second per GPU and MFU: their seconds are ``local batch x
sequence / tokens per second``, their TFLOP/s ``MFU x`` the GPU's bf16 peak, and the predicted
TFLOP/s scale by the time (the same FLOPs); their attention is torch's flash attention.

Run: ``python benchmarks/gpu_published.py`` (about a minute per hundred rows; ``--rows ID,...``
for some, ``--runs DIR`` (repeatable) for other folders, ``-o FILE`` for another output).
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
sys.path.insert(0, str(ROOT / "benchmarks"))

from _public_models import complete  # noqa: E402

from shardplan.capture import capture_spec  # noqa: E402
from shardplan.errors import ShardplanError  # noqa: E402
from shardplan.importers.megatron import megatron_args_of_row, parse_megatron  # noqa: E402
from shardplan.ir import write_atomic  # noqa: E402
from shardplan.planner._llm import llm_plan  # noqa: E402
from shardplan.topology import build_spec  # noqa: E402

DEFAULT_RUNS = [ROOT.parent / "shared" / "gpu-runs", ROOT / "benchmarks" / "data" / "gpu-runs"]
OUT = ROOT / "benchmarks" / "results" / "gpu_published.md"


def cluster_of(row: dict[str, str]) -> str:
    """The cluster preset a row ran on (by its ``gpu`` column; its GPU memory is the
    preset's).

    An A100 row that does not say 80GB ran on the 40 GB A100 (``gpu=a100-40gb``: 1,555 GB/s
    of HBM2): the 80 GB part was announced in November 2020 (SC20), after the Megatron-LM
    README of September 2020 that the ``meg20-a100-*`` rows come from, and the rows that ran
    on the 80 GB part (Selene from 2021, torchtitan's) say so in their ``gpu`` column."""
    gpu = row["gpu"].upper().replace(" ", "")
    gpus = int(row["gpus"])
    nodes = max(1, math.ceil(gpus / 8))
    where = row.get("nodes_gpus", "").lower()
    if "jean zay" in where:
        # BLOOM paper (arXiv 2211.05100) section 3.4.1: 8 A100 80 GB per node, four
        # Omni-Path 100 Gb/s links per node
        return f"dgx-a100,nodes={nodes},nics=4,nic_gbps=100"
    if "V100" in gpu:
        return f"dgx2-v100,nodes={max(1, math.ceil(gpus / 16))}"
    if "GB200" in gpu:
        return f"gb200-nvl72,racks={max(1, math.ceil(gpus / 72))}"
    if "B200" in gpu:
        return f"dgx-b200,nodes={nodes}"
    if "H200" in gpu:
        return f"dgx-h200,nodes={nodes}"
    if "H100" in gpu and ("96GB" in gpu or "HBM2E" in gpu or "500W" in gpu
                          or "grand teton" in where):
        # Meta's Grand Teton H100 (torchtitan's H100 benchmarks): 96 GB HBM2e, 500 W
        return f"dgx-h100,nodes={nodes},gpu=h100-96gb"
    if "H100" in gpu and "PCIE" in gpu:
        return f"pcie-h100,nodes={nodes}"
    if "H100" in gpu:
        return f"dgx-h100,nodes={nodes}"
    if "80GB" in gpu:
        return f"dgx-a100,nodes={nodes}"
    return f"dgx-a100,nodes={nodes},gpu=a100-40gb"


def model_tflops(row: dict[str, str], seconds: float) -> float:
    """Model TFLOP/s per GPU as Megatron-LM's papers count them (module docstring)."""
    b, s = int(row["global_batch"]), int(row["seq"])
    l_, h, v = int(row["layers"]), int(row["hidden"]), int(row["vocab"])
    if row.get("recompute", "").strip() == "full":
        flops = 96 * b * s * l_ * h * h * (1 + s / (6 * h) + v / (16 * l_ * h))
    else:
        flops = 72 * b * s * l_ * h * h * (1 + s / (6 * h) + v / (12 * l_ * h))
    return flops / seconds / int(row["gpus"]) / 1e12


def is_torchtitan(row: dict[str, str]) -> bool:
    return row.get("framework", "").strip().lower() == "torchtitan"


def published_seconds(row: dict[str, str]) -> float:
    """Seconds per iteration as published, or derived from tokens per second per GPU."""
    if row.get("iteration_s", "").strip():
        return float(row["iteration_s"])
    if "tokens/s" in row.get("unit", ""):
        return int(row["local_batch_size"]) * int(row["seq_len"]) / float(row["published"])
    raise ShardplanError(f"row {row['id']}: no iteration_s and no tokens/s figure")


def published_tflops(row: dict[str, str]) -> float:
    if row.get("mfu", "").strip():  # MFU x the half-precision peak of the row's cluster preset
        peak = build_spec(cluster_of(row)).devices[0].flops / 1e12
        return float(row["mfu"]) * peak
    return model_tflops(row, published_seconds(row))


#: What NeMo 2.0's pre-training recipes (nemo/collections/llm/recipes, the performance
#: variants the DGX-Cloud benchmarks launch) switch on that the rows do not state: the
#: distributed optimizer (``distributed_fused_adam_with_cosine_annealing``), the DDP
#: config's overlapped gradient reduce and parameter gather, and sequence parallelism with
#: tensor-parallel communication overlap wherever TP > 1 (``MegatronCommOverlapCallback``).
NEMO_RECIPE = ("--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather",
               "--sequence-parallel --tp-comm-overlap")


#: What Megatron-Bridge's MoE performance benchmarks run since its 25.09 release (its
#: changelog, "Performance / MoE LLM": "Change the model to dropless with balanced gating",
#: "EP A2A communication overlap with computation in both 1F1B pipelining and non-pipelined
#: training"), and gradients reduced in bf16 (each MoE performance config sets
#: ``grad_reduce_in_fp32 = False``: v0.1.0rc4 ``deepseek_v3_llm_pretrain.yaml``, v0.2.0
#: ``set_qwen3_common_configs`` and ``gpt_oss_llm_pretrain.py``; Megatron-LM's
#: ``--grad-reduce-in-bf16``): on the rows of Megatron-Bridge containers 25.09 and later.
BRIDGE_MOE_RECIPE = ("--moe-router-force-load-balancing --overlap-moe-expert-parallel-comm "
                     "--grad-reduce-in-bf16")


def is_bridge_moe(row: dict[str, str]) -> bool:
    """A Megatron-Bridge 25.09-or-later mixture-of-experts row (its source id ``mbYYMM``)."""
    sid = source_of(row["id"])
    return is_moe(row) and sid.startswith("mb") and sid[2:].isdigit() and int(sid[2:]) >= 2509


#: Sources whose runs predate torch 1.13 (October 2022), which first loaded CUDA modules
#: lazily: Megatron-LM's 2020-2022 papers and BLOOM's search of February 2022 (torch 1.11).
EAGER_CUDA_SOURCES = frozenset({"meg20", "meg21", "meg21t2", "meg22", "bloom"})


def is_nemo(row: dict[str, str]) -> bool:
    return "nemo" in row.get("stack", "").lower()


def is_moe(row: dict[str, str]) -> bool:
    return int(row.get("ep", "") or 1) > 1 or int(row.get("experts", "") or 1) > 1


def megatron_text(row: dict[str, str]) -> str:
    """The row's Megatron arguments, with the NeMo recipes' settings on NeMo rows."""
    text = megatron_args_of_row(row)
    if is_nemo(row):  # a row's own performance config, where known, over the generic one
        text += " " + (row.get("nemo_recipe") or NEMO_RECIPE[0])
        if int(row.get("tp") or 1) > 1:
            text += " " + (row.get("nemo_tp_recipe") or NEMO_RECIPE[1])
    if is_bridge_moe(row):
        text += " " + BRIDGE_MOE_RECIPE
    return text


def run_of_row(row: dict[str, str]) -> Any:
    """The row's run, imported as its own framework's configuration."""
    if is_torchtitan(row):
        from shardplan.importers.torchtitan import run_of_torchtitan

        ac: dict[str, Any] = {"mode": row["ac_mode"]}
        if row.get("selective_ac_option", "").strip():
            ac["selective_ac_option"] = row["selective_ac_option"].strip()
        sections = {"model": {"name": row["model"], "flavor": row["flavor"]},
                    "training": {"local_batch_size": int(row["local_batch_size"]),
                                 "seq_len": int(row["seq_len"])},
                    "parallelism": {"data_parallel_shard_degree": -1},
                    "activation_checkpoint": ac}
        return run_of_torchtitan(sections, num_gpus=int(row["gpus"]))
    return parse_megatron(megatron_text(row), num_gpus=int(row["gpus"]))


def moe_import(row: dict[str, str]) -> dict[str, Any]:
    """A mixture-of-experts row imported as its Megatron-LM arguments (its model's public
    shapes and its stack's MoE settings from :mod:`_public_models`), not priced: the model
    spec, the layout (``ep``, ``etp``) and the batch the importer reads, or the one-line
    reason it refuses the row (``error``)."""
    full, shape_note = complete(row)
    try:
        run = run_of_row(full)
    except ShardplanError as e:
        return {"id": row["id"], "error": str(e)}
    par = run.parallel
    return {"id": row["id"], "spec": run.model.spec, "parallel": par, "ep": par.ep,
            "etp": par.expert_tp, "layout": par.label(), "global_batch": run.global_batch,
            "micro_batch": run.micro_batch_size, "notes": (shape_note, *run.notes)}


def moe_line(row: dict[str, str]) -> str:
    """``id (SPEC on LAYOUT, expert TP N, global batch B)``: how an MoE row imports."""
    got = moe_import(row)
    if "error" in got:
        return f"{row['id']} (import refused: {got['error']})"
    return (f"{got['id']} ({got['spec']} on {got['layout']}, expert TP {got['etp']}, global "
            f"batch {got['global_batch']})")


_GRAPHS: dict[str, Any] = {}


def graph_of(spec: str) -> Any:
    if spec not in _GRAPHS:
        _GRAPHS[spec] = capture_spec(spec, batch_size=1, meta=True)
    return _GRAPHS[spec]


def predict(row: dict[str, str]) -> dict[str, Any]:
    """Import, capture, lay out and simulate one row."""
    import dataclasses

    start = time.monotonic()
    row, shape_note = complete(row)
    topology = build_spec(cluster_of(row))
    capacity = float(topology.device_memory.min())
    run = run_of_row(row)
    settings, _ = run.settings()
    # Megatron-LM's 2020-2022 attention and Megatron-DeepSpeed's of 2022 wrote the s x s
    # scores (fused scale-mask-softmax); NeMo's Megatron-Core runs Transformer Engine's
    # fused (flash) attention, torchtitan torch's scaled_dot_product_attention
    if not is_torchtitan(row) and not is_nemo(row):
        settings = dataclasses.replace(settings, attention="materialized")
    if source_of(row["id"]) in EAGER_CUDA_SOURCES:
        settings = dataclasses.replace(settings, lazy_loading=False)
    graph = graph_of(run.model.spec)
    plan, result = llm_plan(graph, topology, run.parallel, settings)
    notes = [shape_note, *run.notes]
    stated = row.get("recompute", "").strip() or row.get("ac_mode", "").strip()
    if not stated and not ran_out_of_memory(row):
        # a run that ran fit its devices: an unpublished recompute is the least that fits
        for level in ("selective", "full"):
            if max(result.device_memory_bytes or result.peak_memory_bytes) <= capacity:
                break
            settings = dataclasses.replace(settings, recompute=level)
            plan, result = llm_plan(graph, topology, run.parallel, settings)
            notes.append(f"recompute not published: {level}, the least that fits")
    peak = max(result.peak_memory_bytes)
    reserved = max(result.reserved_memory_bytes or result.peak_memory_bytes)
    device = max(result.device_memory_bytes or result.peak_memory_bytes)
    layout = run.parallel.label()
    if settings.shard_unit == "module":
        layout += " (DeepSpeed, by module)"
    return {"seconds": result.iteration_seconds, "memory": peak, "reserved": reserved,
            "device": device, "capacity": capacity,
            "fits": device <= capacity, "layout": layout,
            "micro": run.micro_batch_size, "wall": time.monotonic() - start,
            "bubble": result.bubble_fraction,
            "notes": tuple(n for n in notes if n)}


def stack_of(row: dict[str, str]) -> str:
    """The software that ran a row: DeepSpeed where its sharding column says so, else
    Megatron-LM (every source here is a Megatron-LM publication)."""
    if is_torchtitan(row):
        return "runs of torchtitan (FSDP2)"
    sharding = row.get("optimizer_sharding", "").lower()
    return "runs of DeepSpeed" if "deepspeed" in sharding else "runs of Megatron-LM"


def source_of(row_id: str) -> str:
    return row_id.split("-")[0]


def read_rows(folders: list[Path], wanted: str | None = None) -> list[dict[str, str]]:
    """Every row of every ``*.csv`` in the folders (``wanted``: comma-separated ids)."""
    files = [f for d in folders for f in sorted(d.glob("*.csv"))]
    rows = [r for f in files for r in csv.DictReader(f.open(newline=""))]
    if wanted:
        keep = set(wanted.split(","))
        rows = [r for r in rows if r["id"] in keep]
    return rows


def ran_out_of_memory(row: dict[str, str]) -> bool:
    return row.get("published", "").strip().upper() == "OOM"


def published_memory(row: dict[str, str]) -> float | None:
    """The row's published per-GPU memory in bytes (the column is GiB; a source printing
    "GB" without saying which is read as GiB), or None."""
    text = row.get("memory_gib", "").strip()
    return float(text) * 2**30 if text else None


def memory_kind(row: dict[str, str]) -> str:
    """Which predicted figure a published one is compared with: ``allocated``
    (``max_memory_allocated``), ``reserved`` (``max_memory_reserved``: torchtitan's log,
    Megatron's "max reserved") or ``device`` (``nvidia-smi``, and a figure whose kind the
    source does not state: what a user reading a GPU's memory sees)."""
    kind = row.get("memory_kind", "").lower()
    if "alloc" in kind:
        return "allocated"
    if "reserv" in kind:
        return "reserved"
    return "device"


def predicted_memory(row: dict[str, str], p: dict[str, Any]) -> float:
    """The predicted figure of the kind the row publishes (:func:`memory_kind`)."""
    return float({"allocated": p["memory"], "reserved": p["reserved"],
                  "device": p["device"]}[memory_kind(row)])


HEADER = ("| row | GPUs | layout | micro-batch | published s | predicted s | error | "
          "published TFLOP/s/GPU | predicted TFLOP/s/GPU | predicted GiB (allocated / "
          "reserved / device) | published GiB | fits | seconds to predict |")


def table_line(row: dict[str, str], p: dict[str, Any]) -> str:
    """One row of the results table."""
    pub_mem = published_memory(row)
    mem = f"{p['memory'] / 2**30:.1f} / {p['reserved'] / 2**30:.1f} / " \
          f"{p['device'] / 2**30:.1f} of {p['capacity'] / 2**30:.0f}"
    pm = "" if pub_mem is None else (f"{pub_mem / 2**30:.0f} {memory_kind(row)} "
                                     f"({predicted_memory(row, p) / pub_mem - 1:+.0%})")
    fits = "yes" if p["fits"] else "NO"
    if ran_out_of_memory(row):
        return (f"| {row['id']} | {row['gpus']} | {p['layout']} | {p['micro']} | OOM | "
                f"{p['seconds']:.3f} | - | - | - | {mem} | OOM | {fits} "
                f"({'right' if not p['fits'] else 'WRONG'}) | {p['wall']:.1f} |")
    pub = published_seconds(row)
    err = p["seconds"] / pub - 1.0
    ptf = published_tflops(row)
    return (f"| {row['id']} | {row['gpus']} | {p['layout']} | {p['micro']} | {pub:.3f} | "
            f"{p['seconds']:.3f} | {err:+.1%} | {ptf:.1f} | {ptf * pub / p['seconds']:.1f} | "
            f"{mem} | {pm} | {fits} | {p['wall']:.1f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=Path, action="append",
                    help="folder of *.csv rows (repeatable; default: the shared folder and "
                         "benchmarks/data/gpu-runs)")
    ap.add_argument("--rows", help="comma-separated row ids (default: all)")
    ap.add_argument("-o", "--output", type=Path, default=OUT)
    args = ap.parse_args(argv)
    folders = args.runs or DEFAULT_RUNS
    rows = read_rows(folders, args.rows)
    if not rows:
        print(f"gpu_published: no rows in {', '.join(map(str, folders))}", file=sys.stderr)
        return 2
    lines = ["# Published GPU training runs: predicted against measured", "",
             "Generated by `python benchmarks/gpu_published.py` (every row of "
             "`../shared/gpu-runs/*.csv` and `benchmarks/data/gpu-runs/*.csv`, imported from "
             "its Megatron-LM arguments or its torchtitan options, captured on the meta "
             "device, simulated on exactly its GPUs). No constant of the model was set from "
             "these rows (`docs/gpu-model.md`): every row is out of sample. Error = predicted "
             "/ published - 1. Attention is priced as each stack ran it (Megatron-LM's "
             "2020-2022 runs and Megatron-DeepSpeed's: scores materialized; NeMo "
             "(Transformer Engine) and torchtitan: flash attention); rows without a published "
             "micro-batch run micro-batches of 1 (the importer's rule); NeMo rows run what "
             "NeMo 2.0's recipes switch on (`NEMO_RECIPE`: distributed optimizer, overlapped "
             "gradient reduce and parameter gather, sequence parallelism and TP overlap with "
             "TP > 1), unless the row's model names its own performance configuration; "
             "Megatron-Bridge 25.09+ MoE rows also run balanced gating and the all-to-all "
             "overlap (`BRIDGE_MOE_RECIPE`); a row that publishes no recompute and names "
             "none runs the least level that fits; rows that name a model without its "
             "dimensions take them from its "
             "public configuration (`benchmarks/_public_models.py`, named per row below). "
             "Memory: predicted allocated, reserved and device peaks (`docs/gpu-model.md`, "
             "\"Memory as the run reports it\"); a published figure is compared with the one "
             "of its kind (`memory_kind`: a kind the source does not state is read as "
             "nvidia-smi's, the device figure); a row fits when its device figure does. "
             "The torchtitan rows publish tokens/s per GPU and MFU (their seconds and "
             "TFLOP/s are derived from those: the script's docstring).", "", HEADER,
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    errors: dict[str, list[float]] = {}
    stacks: dict[str, list[float]] = {}
    mem_errors: list[float] = []
    notes_of: dict[str, tuple[str, ...]] = {}
    wrong_fit: list[str] = []
    for row in rows:
        try:
            p = predict(row)
        except ShardplanError as e:
            lines.append(f"| {row['id']} | {row['gpus']} | error: {e} |" + " |" * 10)
            wrong_fit.append(row["id"])
            continue
        lines.append(table_line(complete(row)[0], p))
        if p["notes"]:
            notes_of[row["id"]] = p["notes"]
        if p["fits"] == ran_out_of_memory(row):
            wrong_fit.append(row["id"])
        if ran_out_of_memory(row):
            print(f"{row['id']}: ran out of memory, predicted "
                  f"{'to fit' if p['fits'] else 'not to fit'}", flush=True)
            continue
        pub = published_seconds(row)
        err = p["seconds"] / pub - 1.0
        errors.setdefault(source_of(row["id"]), []).append(err)
        stacks.setdefault(stack_of(row), []).append(err)
        pub_mem = published_memory(row)
        if pub_mem:
            mem_errors.append(predicted_memory(row, p) / pub_mem - 1.0)
        print(f"{row['id']}: published {pub:.3f} s, predicted {p['seconds']:.3f} s "
              f"({err:+.1%}), {p['memory'] / 2**30:.1f} / {p['reserved'] / 2**30:.1f} / "
              f"{p['device'] / 2**30:.1f} GiB", flush=True)
    lines += summary_lines(errors, stacks, mem_errors, notes_of, wrong_fit)
    write_atomic(args.output, "\n".join(lines))
    print(f"wrote {args.output}")
    return 0


def _stats(name: str, errs: list[float]) -> str:
    a = [abs(e) for e in errs]
    return (f"| {name} ({len(errs)}) | {statistics.median(a):.1%} | {max(a):.1%} | "
            f"{statistics.median(errs):+.1%} |")


def summary_lines(errors: dict[str, list[float]], stacks: dict[str, list[float]],
                  mem_errors: list[float], notes_of: dict[str, tuple[str, ...]],
                  wrong_fit: list[str]) -> list[str]:
    """The notes and summary under the table."""
    lines: list[str] = []
    if notes_of:
        lines += ["", "Notes per row (dimensions taken from a public configuration, and what "
                  "the importer said it does not model):", ""]
        lines += [f"- {rid}: {'; '.join(n)}" for rid, n in notes_of.items()]
    lines += ["", "## Summary", "",
              "| rows | median abs error | worst abs error | median signed error |",
              "|---|---|---|---|"]
    every = [e for errs in errors.values() for e in errs]
    if every:
        lines.append(_stats("all", every))
        lines += [_stats(name, errs) for name, errs in sorted(stacks.items())]
        lines += [_stats(src, errs) for src, errs in sorted(errors.items())]
    if mem_errors:
        lines += ["", "Memory, predicted against the published figure of its kind:", "",
                  "| rows | median abs error | worst abs error | median signed error |",
                  "|---|---|---|---|", _stats("with a published figure", mem_errors)]
    lines += ["", "Rows whose outcome (ran / out of memory) is predicted wrong, or that could "
              f"not be predicted: {', '.join(wrong_fit) or 'none'}."]
    lines += ["", "Which rows informed a constant: none (each constant's source is a "
              "published kernel, NCCL or allocator measurement or a stack's code, "
              "`docs/gpu-model.md`). Leave-one-source-out: with no row informing a constant, "
              "each source's rows above are predicted by constants set from none of them.", ""]
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
