"""Memory of an LLM plan per pipeline rank: parameters, gradients, optimizer state, what
FSDP holds gathered, activations at the schedule's peak, each stack's own buffers, and what
the allocator and the device hold (:mod:`shardplan.cost._reserved`).

The "Memory" part of :mod:`shardplan.cost._llm`'s module docstring; ``docs/gpu-model.md``,
"Memory as the run reports it", says where each figure comes from.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from shardplan.cost._formulas import OPTIMIZER_STATE
from shardplan.cost._llm_layout import BlockLayout, Pricing, keeps_gathered, recompute_mask
from shardplan.cost._llm_moe import expert_shard
from shardplan.cost._reserved import device_bytes, reserved_bytes
from shardplan.ir import ExecutionSettings, Graph, ParallelConfig

__all__ = ["DEEPSPEED_BUCKET", "ZERO3_MAX_LIVE_PARAMS", "ZERO3_PREFETCH_PARAMS",
           "ZERO3_REDUCE_BUCKET", "rank_memory"]

#: DeepSpeed ZeRO-3's defaults (``deepspeed/runtime/zero/config.py``), in elements: the
#: prefetch bucket (``stage3_prefetch_bucket_size``), the most parameters gathered at once
#: (``stage3_max_live_parameters``; a larger module is still gathered whole) and the
#: gradient bucket reduced at a time (``reduce_bucket_size``).
ZERO3_PREFETCH_PARAMS = 5e7


ZERO3_MAX_LIVE_PARAMS = 1e9


ZERO3_REDUCE_BUCKET = 5e8


#: DeepSpeed's ZeRO buckets, elements (``reduce_bucket_size`` and ``allgather_bucket_size``
#: default 5e8, deepspeed/runtime/zero/config.py): a flat gradient bucket is reduced at a time.
DEEPSPEED_BUCKET = 5e8


def rank_memory(pr: Pricing, times: Any, p_dev: np.ndarray, rank_params: np.ndarray,
                send_bytes: np.ndarray | None = None, *,
                expert_params: np.ndarray | None = None
                ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Bytes per device of every pipeline rank by kind (:class:`~shardplan.cost.LLMCosts`'s
    ``memory``), and the micro-batches each virtual stage holds at its peak. ``times`` is
    the compute step's :class:`~shardplan.cost._llm.NodeTimes`; ``send_bytes`` what each
    stage sends on per micro-batch (DeepSpeed's pipeline engine keeps it);
    ``expert_params`` the routed experts' share of ``p_dev``, sharded over their own
    replicas (:func:`~shardplan.cost._llm_moe.expert_shard`). O(n + pp vp m)."""
    par, st, pp = pr.parallel, pr.settings, pr.parallel.pp
    in_flight = _in_flight(par, st)
    act_held = _activations_held(pr, times, in_flight)
    if st.stack == "megatron-deepspeed" and send_bytes is not None:
        # DeepSpeed's pipeline engine keeps each micro-batch's stage output in its pipe
        # buffers (pipe_buffers['outputs']) until that micro-batch's backward
        act_held = act_held + send_bytes * in_flight
    state = OPTIMIZER_STATE[st.optimizer] * 4.0  # fp32 moments
    mem: dict[str, np.ndarray] = {k: np.zeros(pp) for k in
                                  ("params", "gradients", "master", "optimizer", "activations",
                                   "gathered")}
    d = pr.gradient_group
    shard = par.dp_shard * par.cp if par.dp_shard > 1 else (
        d if st.gradient_sync == "sharded" else 1)
    zero1 = st.gradient_sync == "zero1"
    # torch FSDP2 under mixed precision (MixedPrecisionPolicy): the sharded parameters are the
    # fp32 ones the optimizer steps, cast to half precision as they are all-gathered, and
    # their gradients are fp32 whatever the reduce_dtype; no half-precision shard is kept
    fsdp2_mixed = shard > 1 and st.shard_unit == "block" and pr.master_bytes > 0
    experts = np.zeros(par.num_stages) if expert_params is None else expert_params
    opt_div = shard if shard > 1 else (d if zero1 else 1)
    e_shard, e_opt = expert_shard(par, shard), expert_shard(par, opt_div)
    for j in range(par.num_stages):
        r = j % pp
        dense, e = p_dev[j] - experts[j], experts[j]
        held = dense / shard + e / e_shard  # parameters and gradients as sharded
        stepped = dense / opt_div + e / e_opt  # master weights and optimizer state
        if not fsdp2_mixed:
            mem["params"][r] += held * pr.w_bytes
        mem["gradients"][r] += held * (4 if fsdp2_mixed else pr.g_bytes)
        mem["master"][r] += stepped * pr.master_bytes
        mem["optimizer"][r] += stepped * state
        mem["activations"][r] += act_held[j]
    # the loss's backward on the last stage allocates the logits' gradients while that
    # micro-batch's activations are held
    mem["activations"][(par.num_stages - 1) % pp] += times.loss_gradient
    if shard > 1 and keeps_gathered(st, par):
        # kept gathered across micro-batches (torchtitan's apply_fsdp under a pipeline): the
        # rank's stages whole, at the parameters' compute precision
        for j in range(par.num_stages):
            mem["gathered"][j % pp] += p_dev[j] * pr.w_bytes
    elif shard > 1:
        mem["gathered"] = _gathered(pr)
    # the model's buffers (rotary tables, ...), as captured, on every rank: each stage's
    # blocks read them
    meta = pr.graph.meta
    buffers = float(meta.get("buffer_bytes", 0) or 0) if isinstance(meta, dict) else 0.0
    mem["buffers"] = np.full(pp, buffers)
    if st.stack == "megatron-deepspeed":
        _deepspeed_buffers(mem, rank_params, st, d, pr.g_bytes)
    mem["total"] = np.sum([mem[k] for k in ("params", "gradients", "master", "optimizer",
                                            "activations", "gathered", "buffers")], axis=0)
    largest = np.zeros(pp)
    for j, nodes in enumerate(pr.stages):
        largest[j % pp] = max(largest[j % pp],
                              float((times.out_bytes[nodes] / pr.div[nodes]).max(initial=0.0)))
    if pr.hw is not None:  # a GPU: the caching allocator, the CUDA context, NCCL
        mem["reserved"] = reserved_bytes(mem["total"], largest,
                                         expandable_segments=st.expandable_segments)
        mem["device"] = device_bytes(mem["reserved"], par, lazy_loading=st.lazy_loading)
    else:
        mem["reserved"] = mem["total"].copy()
        mem["device"] = mem["total"].copy()
    return mem, in_flight


def _gathered(pr: Pricing) -> np.ndarray:
    """What FSDP holds gathered per rank: DeepSpeed ZeRO-3's running module whole, plus what
    its prefetch bucket fetches ahead while the live parameters stay under
    stage3_max_live_parameters, plus one gradient bucket being reduced (DeepSpeed's
    defaults); FSDP2's running and prefetched block whole."""
    par, pp, stages = pr.parallel, pr.parallel.pp, pr.stages
    out = np.zeros(pp)
    for r in range(pp):
        mine = range(r, par.num_stages, pp)
        if pr.settings.shard_unit == "module":
            largest = max(float((pr.n_params[stages[j]] / pr.param_div[stages[j]])
                                .max(initial=0.0)) for j in mine)
            live = max(largest, min(largest + ZERO3_PREFETCH_PARAMS, ZERO3_MAX_LIVE_PARAMS))
            out[r] = live * pr.w_bytes + ZERO3_REDUCE_BUCKET * pr.g_bytes
        else:
            unit = max(_largest_block_params(pr.layout, stages[j], pr.n_params, pr.param_div)
                       for j in mine)
            out[r] = 2.0 * unit * pr.w_bytes
    return out


def _activations_held(pr: Pricing, times: Any, in_flight: np.ndarray) -> np.ndarray:
    """Activation bytes each virtual stage holds at its rank's peak: every node's kept output
    per micro-batch in flight; full (and per-op) recompute keeps each checkpointed block's
    input and one block's activations while it is recomputed; selective recompute re-runs
    the attention cores one block at a time. O(n + pp vp m)."""
    par, st, layout, div = pr.parallel, pr.settings, pr.layout, pr.div
    out_bytes, scaled = times.out_bytes, times.scaled
    s_count = par.num_stages
    if st.recompute in ("full", "op"):
        saved = times.op_saved if st.recompute == "op" else np.zeros(pr.graph.num_nodes, bool)
        kept = np.zeros(s_count)
        largest_block = np.zeros(s_count)
        for j, nodes in enumerate(pr.stages):
            blocks = layout.block[nodes]
            inside = nodes[(blocks >= 0) & (blocks < layout.num_blocks)]
            outside = nodes[~np.isin(nodes, inside)]
            kept[j] = (out_bytes[outside] / div[outside]).sum()
            if inside.size:
                per_block = np.bincount(layout.block[inside],
                                        weights=out_bytes[inside] / div[inside])
                mine_ckpt = np.zeros(per_block.size, dtype=bool)
                mine_ckpt[np.unique(layout.block[inside[times.ckpt_node[inside]]])] = True
                nb = int(np.count_nonzero(per_block[mine_ckpt]))
                largest_block[j] = per_block[mine_ckpt].max(initial=0.0)
                # a checkpointed block keeps its input (the hidden state, split under
                # sequence parallelism); the others keep all they would without recompute
                kept[j] += nb * _block_input_bytes(scaled, layout, inside) / \
                    (par.cp * (par.tp if pr.sp else 1)) + float(per_block[~mine_ckpt].sum())
                # per-op checkpointing also keeps the outputs its policy saves
                mine = inside[saved[inside]]
                kept[j] += float((scaled.output_bytes[mine] / div[mine]).sum())
        return _held_at_rank_peak(par, st, kept, in_flight) + largest_block
    act = np.array([(out_bytes[nodes] / div[nodes]).sum() for nodes in pr.stages])
    if st.recompute == "selective":  # what it re-runs is not kept, one block's at a time
        again = recompute_mask(pr.graph, st.recompute_modules)
        core = np.zeros(s_count)
        one_core = np.zeros(s_count)
        for j, nodes in enumerate(pr.stages):
            mine = nodes[again[nodes]]
            if mine.size:
                per = np.bincount(np.maximum(layout.block[mine], 0),
                                  weights=out_bytes[mine] / div[mine])
                core[j], one_core[j] = per.sum(), per.max()
        return _held_at_rank_peak(par, st, act - core, in_flight) + one_core
    return _held_at_rank_peak(par, st, act, in_flight)


def _deepspeed_buffers(mem: dict[str, np.ndarray], rank_params: np.ndarray,
                       settings: ExecutionSettings, d: int, g_bytes: int) -> None:
    """DeepSpeed's optimizer buffers beside the parameters, gradients and states (in place,
    per pipeline rank): its BF16 optimizer (``deepspeed/runtime/bf16_optimizer.py``)
    accumulates every gradient in an fp32 copy of all the rank's parameters, unsharded; its
    fp16 ZeRO-1 / 2 optimizer (``zero/stage_1_and_2.py``) keeps the fp32 gradients of its
    partition; both reduce a flat bucket of :data:`DEEPSPEED_BUCKET` gradients at a time."""
    if settings.precision == "bf16":
        mem["gradients"] += rank_params * 4.0
    elif settings.precision == "fp16" and settings.gradient_sync == "zero1" and d > 1:
        mem["gradients"] += rank_params * 4.0 / d
    if d > 1:
        mem["gathered"] += np.minimum(rank_params, DEEPSPEED_BUCKET) * g_bytes


def _block_input_bytes(graph: Graph, layout: BlockLayout, inside: np.ndarray) -> float:
    """Bytes of one block's input (the hidden state entering the first block of
    ``inside``), counted once per source."""
    first = int(layout.block[inside].min())
    mine = np.zeros(graph.num_nodes, dtype=bool)
    mine[inside[layout.block[inside] == first]] = True
    entering = mine[graph.dst] & ~mine[graph.src]
    seen: dict[int, float] = {}
    for e in np.flatnonzero(entering):
        seen[int(graph.src[e])] = float(graph.edge_bytes[e])
    return float(sum(seen.values()))


def _largest_block_params(layout: BlockLayout, nodes: np.ndarray, n_params: np.ndarray,
                          param_div: np.ndarray) -> float:
    blocks = layout.block[nodes]
    inside = nodes[(blocks >= 0) & (blocks < layout.num_blocks)]
    if not inside.size:
        return float((n_params[nodes] / param_div[nodes]).sum())
    return float(np.bincount(layout.block[inside],
                             weights=n_params[inside] / param_div[inside]).max())


def _in_flight(parallel: ParallelConfig, settings: ExecutionSettings) -> np.ndarray:
    """Micro-batches each virtual stage holds at its peak: GPipe ``M``, 1F1B
    ``min(S - s, M)``, interleaved 1F1B by its action lists
    (:meth:`~shardplan.ir.schedule.Schedule.in_flight`)."""
    m = settings.microbatches
    s = parallel.num_stages
    if parallel.vp > 1:
        return np.asarray(_interleaved_in_flight(parallel.pp, parallel.vp, m),
                          dtype=np.float64)
    if settings.schedule == "gpipe":
        return np.full(s, float(m))
    return np.minimum(s - np.arange(s), m).astype(np.float64)


@lru_cache(maxsize=256)
def _interleaved_in_flight(pp: int, vp: int, m: int) -> tuple[int, ...]:
    from shardplan.ir.schedule import make_schedule

    return make_schedule("interleaved-1f1b", pp * vp, m, virtual_stages=vp).in_flight()


@lru_cache(maxsize=64)
def _interleaved_timeline(pp: int, vp: int, m: int
                          ) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """Per pipeline rank of interleaved 1F1B: its virtual stages and the micro-batches each
    holds after each action (:meth:`~shardplan.ir.schedule.Schedule.rank_in_flight`)."""
    from shardplan.ir.schedule import make_schedule

    sched = make_schedule("interleaved-1f1b", pp * vp, m, virtual_stages=vp)
    out = []
    for r in range(pp):
        stages, counts = sched.rank_in_flight(r)
        out.append((np.asarray(stages, dtype=np.int64), np.asarray(counts, dtype=np.float64)))
    return tuple(out)


def _held_at_rank_peak(parallel: ParallelConfig, settings: ExecutionSettings,
                       per_mb: np.ndarray, in_flight: np.ndarray) -> np.ndarray:
    """Activation bytes each virtual stage holds when its rank's activations peak: with
    one stage per rank ``per_mb x in_flight``; under interleaving the counts at the action
    where the rank's stages together hold the most (their own peaks come at different
    times, so summing them would count memory no moment holds). O(m vp) per rank."""
    if parallel.vp == 1:
        return per_mb * in_flight
    held = np.zeros_like(per_mb)
    for stages, counts in _interleaved_timeline(parallel.pp, parallel.vp,
                                                settings.microbatches):
        if counts.size:
            t = int(np.argmax(counts @ per_mb[stages]))
            held[stages] = counts[t] * per_mb[stages]
    return held
