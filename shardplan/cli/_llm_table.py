"""``shardplan plan``'s ranking in an LLM user's terms (issue 45, item 3).

An LLM row (a plan with a ``parallel`` layout) reads as a Megatron-LM or torchtitan user sets
and measures a run: the degrees (``TP x PP x DP``, and ``CP``, ``FSDP`` shard, ``VP`` where
used), the micro-batch and their count, precision, recompute, sequence parallelism, seconds per
step, tokens per second per GPU, MFU, the device memory and the search's seconds; every number
plain (no scientific notation). The other families' rows keep the papers' table.

MFU counts model FLOPs as Megatron-LM does (Narayanan et al. 2021, appendix: ``72 B s l h^2
(1 + s / 6h + V / 12 l h)`` without recompute, which is ``6 x parameters x tokens`` plus
attention's ``12 l h s`` per token): ``6 N + 12 l h s`` per token, ``N`` the parameters that
multiply (the embedding table, a lookup, left out unless tied to the head; a GPT's position
table too), against the GPUs' dense bf16 tensor-core peak (their fp8 peak under fp8). Recompute
is not counted (it is hardware FLOPs, not model FLOPs).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from shardplan.ir import Graph, Plan, Topology

__all__ = ["LLM_COLUMNS", "llm_fields", "model_flops_per_token", "plain"]

#: Columns of the LLM table, in order.
LLM_COLUMNS = ("#", "TP x PP x DP", "micro-batch x count", "precision", "recompute", "SP",
               "s/step", "tokens/s/GPU", "MFU %", "memory GiB", "search s")


def plain(x: float, digits: int = 4) -> str:
    """``x`` with about ``digits`` significant digits and never an exponent: ``0.0001234``,
    ``12.35``, ``12,346``; ``-`` when not finite.

    Examples
    --------
    >>> plain(1.23456e-4), plain(12.3456), plain(123456.7), plain(0.0)
    ('0.0001235', '12.35', '123,457', '0')
    """
    if not math.isfinite(x):
        return "-"
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:,.{decimals}f}"


def model_flops_per_token(transformer: Mapping[str, Any]) -> float:
    """Model FLOPs per trained token (forward and backward) of a graph's
    ``meta["transformer"]``: ``6 N + 12 l h s`` (module docstring), ``N`` a mixture of
    experts' active parameters (``active_parameters``); 0 when its dimensions are not
    known.

    Examples
    --------
    >>> t = {"hidden": 4096, "layers": 32, "vocab": 128256, "seq": 8192, "tied": False,
    ...      "parameters": 8030261248, "family": "llama"}
    >>> round(model_flops_per_token(t) / 1e9, 1)  # GFLOPs: 6 x 7.5 B + attention
    57.9
    """
    try:
        h, layers = int(transformer["hidden"]), int(transformer["layers"])
        vocab, seq = int(transformer["vocab"]), int(transformer["seq"])
        # a mixture of experts: the parameters a token uses (its top-k experts)
        params = float(transformer.get("active_parameters") or transformer["parameters"])
    except (KeyError, TypeError, ValueError):
        return 0.0
    dense = params - (0 if transformer.get("tied") else vocab * h)
    if transformer.get("family") == "gpt":
        dense -= seq * h  # the learned position table: a lookup
    return 6.0 * dense + 12.0 * layers * h * seq


def _peak(topology: Topology, precision: str, devices: int) -> float:
    """Dense peak FLOP/s of the first ``devices`` GPUs: bf16 tensor cores (fp8 under
    fp8)."""
    used = topology.devices[:max(1, devices)]
    if precision == "fp8":
        rates = [float(d.extra.get("fp8_flops") or d.flops) for d in used]
    else:
        rates = [float(d.flops) for d in used]
    return min(rates) * len(used)


def llm_fields(row: Any, graph: Graph, topology: Topology, global_batch: int
               ) -> dict[str, Any] | None:
    """The user's terms of one ranked row (:class:`~shardplan.planner.Evaluated`) whose plan
    is an LLM plan, None for other rows: degrees, ``micro_batch`` (sequences per replica and
    micro-batch), ``microbatches``, ``precision``, ``recompute``, ``sequence_parallel``,
    ``seconds_per_step``, ``tokens_per_second_per_gpu``, ``mfu`` (a fraction),
    ``device_memory_bytes`` (what the busiest device holds, as the simulator's
    ``device_memory_bytes``: the LLM search's price of it) and ``search_seconds``. O(1)."""
    from shardplan.planner._llm import knobs

    plan = Plan.from_dict(row.plan)
    par = plan.parallel
    if par is None:
        return None
    settings = plan.settings
    k = knobs(par, settings)
    meta = graph.meta.get("transformer") if isinstance(graph.meta, Mapping) else None
    seq = int(meta.get("seq", 0)) if isinstance(meta, Mapping) else 0
    gpus = par.world_size
    step = float(row.iteration_seconds)
    ok = bool(row.fits) and math.isfinite(step) and step > 0
    tokens = global_batch * seq
    per_gpu = tokens / step / gpus if ok and seq else 0.0
    flops = model_flops_per_token(meta) if isinstance(meta, Mapping) else 0.0
    peak = _peak(topology, settings.precision, gpus)
    mfu = flops * tokens / step / peak if ok and flops and peak > 0 else 0.0
    return {"tp": par.tp, "pp": par.pp, "dp": par.dp, "cp": par.cp, "vp": par.vp,
            "fsdp": par.dp_shard, "layout": par.label(), "micro_batch": k["micro-batch"],
            "microbatches": settings.microbatches, "precision": settings.precision,
            "recompute": settings.recompute, "sequence_parallel": settings.sequence_parallel,
            "gradient_sync": settings.gradient_sync, "stack": settings.stack,
            "sequence": seq, "gpus": gpus, "seconds_per_step": step if ok else math.inf,
            "tokens_per_second_per_gpu": per_gpu, "mfu": mfu,
            "device_memory_bytes": float(row.peak_memory_bytes),
            "search_seconds": float(row.search_seconds)}


def _degrees(f: Mapping[str, Any]) -> str:
    """``4 x 2 x 1`` and the other degrees where used: ``x CP 2``, ``x FSDP 8``, ``x VP 2``."""
    out = f"{f['tp']} x {f['pp']} x {f['dp']}"
    for name, key in (("CP", "cp"), ("FSDP", "fsdp"), ("VP", "vp")):
        if f[key] > 1:
            out += f" x {name} {f[key]}"
    return out


def llm_table_rows(rows: Sequence[tuple[int, Any, Mapping[str, Any]]]) -> list[list[str]]:
    """The cells of the LLM table (:data:`LLM_COLUMNS`) for ``(rank, row, fields)``."""
    out = []
    for rank, row, f in rows:
        step = plain(f["seconds_per_step"])
        out.append([str(rank), _degrees(f), f"{f['micro_batch']} x {f['microbatches']}",
                    f["precision"], f["recompute"], "yes" if f["sequence_parallel"] else "no",
                    step if row.fits else f"{step} (no fit)",
                    f"{f['tokens_per_second_per_gpu']:,.0f}", f"{100 * f['mfu']:.1f}",
                    plain(f["device_memory_bytes"] / 2**30, 3),
                    plain(f["search_seconds"], 2)])
    return out
