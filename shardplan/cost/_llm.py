"""The LLM plan kind's costs: what one micro-batch of each virtual stage takes, and memory.

A plan with a :class:`~shardplan.ir.ParallelConfig` runs whole transformer blocks per virtual
stage, each block split over ``tp`` devices the way Megatron-LM splits it (arXiv 1909.08053,
section 3; the layout is in :mod:`shardplan.ir.parallel`). This module prices that layout
from the captured graph, node by node, so any captured transformer (the zoo's GPT and Llama
or a user's) is priced the same way:

- **Which nodes split.** A node belongs to block ``N`` when its module path holds
  ``layers.N`` (``h.N``, ``layer.N``, ``blocks.N`` too). Inside a block, the nodes of its
  attention and feed-forward sub-modules (:data:`TP_REGIONS`) are split over the
  tensor-parallel group (attention by heads, the MLP by its hidden width: the column- then
  row-parallel pairs); the block's norms and residual additions are replicated, or split by
  ``tp`` along the sequence under sequence parallelism (arXiv 2205.05198, section 4.2.2).
  The vocabulary-parallel embedding, output head and loss (:data:`VOCAB_MODULES`) split by
  ``tp``. Context parallelism divides every token-wise node by ``cp``.
- **Compute.** Every node by the roofline of :func:`~shardplan.cost.roofline_seconds` at the
  plan's precision, on the per-replica micro-batch, divided by its split. Full recompute adds
  a block's forward to its backward; selective recompute adds the forward of the attention
  core (the nodes of the attention region that hold no parameters). A graph that ends at the
  logits is charged the loss's memory-bound passes over them (:data:`LOSS_BYTES_FORWARD`);
  the optimizer step is :func:`~shardplan.cost._formulas.optimizer_seconds` at the plan's
  precision. Under FSDP (``shard_unit`` ``block``, torch's ``fully_shard``) its copies out of
  the all-gather buffer and into the reduce-scatter buffer (:data:`FSDP_COPY_OUT`) are
  memory-bound compute of every forward and backward.
- **Tensor-parallel communication.** Each split region all-reduces its outputs in the forward
  (the row-parallel product's partial sums) and the gradients of its inputs in the backward
  (the column-parallel product's), one collective per distinct tensor crossing the region's
  border: Megatron's two all-reduces per block in each pass (four with full recompute, which
  repeats the forward's). Sequence parallelism turns each into a reduce-scatter plus an
  all-gather of the same bytes, priced as the all-reduce. With ``tp_comm_overlap`` a region's
  collectives hide behind its own compute (Megatron's ``--tp-comm-overlap``): only what
  exceeds it is exposed.
- **Memory.** Per device: parameters, gradients, fp32 master weights and optimizer state
  (bytes per parameter from the precision, ZeRO's 16 for mixed-precision Adam, arXiv
  1910.02054), divided by ``tp`` where split, master weights and state by the data-parallel
  size under ZeRO-1 and everything by ``dp_shard`` under FSDP, plus what FSDP holds
  gathered (two blocks; under ``shard_unit`` ``module``, DeepSpeed ZeRO-3's running module,
  its prefetch and a gradient bucket); activations: every node's output
  of one micro-batch (at the activation precision, divided as the node is split), kept for
  each micro-batch in flight of the schedule; full recompute keeps only each block's input
  and one block's activations while it is recomputed.

Graphs are captured in fp32 unless their ``meta`` says ``dtype_bytes``; activations and
parameters are rescaled to the plan's precision.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from shardplan.cost._collectives import collective_seconds
from shardplan.cost._compute import is_matmul, matmul_peak_flops, roofline_seconds
from shardplan.cost._formulas import optimizer_seconds
from shardplan.cost._gpu import (
    GPUModel,
    gpu_model,
    group_collective_seconds,
    node_ids,
    wave_efficiency,
)
from shardplan.cost._llm_comm import (  # noqa: F401  (re-exported: their home before the split)
    FSDP_COPY_OUT,
    _gather_units,
    data_parallel,
    pipeline_messages,
    tensor_parallel_seconds,
)
from shardplan.cost._llm_layout import (  # noqa: F401
    _ACT_BYTES,
    _BLOCK,
    _LOSS_OPS,
    _PARAM_BYTES,
    TP_REGIONS,
    VOCAB_MODULES,
    BlockLayout,
    Pricing,
    _groups,
    _rank_devices,
    _tied_embedding_params,
    block_layout,
    keeps_gathered,
    precision_bytes,
    recompute_mask,
    stage_nodes,
)
from shardplan.cost._llm_memory import (  # noqa: F401
    DEEPSPEED_BUCKET,
    ZERO3_MAX_LIVE_PARAMS,
    ZERO3_PREFETCH_PARAMS,
    ZERO3_REDUCE_BUCKET,
    _held_at_rank_peak,
    _in_flight,
    rank_memory,
)
from shardplan.cost._llm_moe import (
    check_experts,
    expert_comm_seconds,
    expert_factors,
    expert_shard,
    exposed_expert_comm,
    straggler_factor,
)
from shardplan.errors import ShardplanError
from shardplan.ir import ExecutionSettings, Graph, ParallelConfig, Topology
from shardplan.ir.settings import ATTENTION_KERNELS

__all__ = ["ATTENTION_KERNELS", "TP_REGIONS", "VOCAB_MODULES", "BlockLayout", "LLMCosts",
           "block_layout", "check_layout", "llm_costs", "precision_bytes", "saved_bytes",
           "stage_nodes"]

#: How attention runs (:data:`~shardplan.ir.settings.ATTENTION_KERNELS`): ``flash`` keeps no
#: s x s matrix (FlashAttention, Dao et al. 2022; torch's scaled_dot_product_attention);
#: ``materialized`` writes the scores to memory (Megatron-LM's fused scale-mask-softmax
#: kernels of 2020-2022).
#:
#: Half-precision bytes moved per score element by materialized attention. Forward: the
#: Q K^T product writes the scores (2), the fused scale-mask-softmax reads them and writes the
#: probabilities (2 + 2), dropout reads those and writes its output and its one-byte mask
#: (2 + 2 + 1), the product with V reads the dropped probabilities (2): 13. Backward: the
#: gradient of the probabilities written (2), dropout's backward reads it and the mask and
#: writes (2 + 1 + 2), softmax's backward reads gradient and probabilities and writes (2 + 2 +
#: 2), the two products with Q and K read the score gradient (2 + 2): 19.
SCORE_BYTES_FORWARD = 13.0


SCORE_BYTES_BACKWARD = 19.0


#: Bytes per score element kept for the backward: softmax output (2), dropout mask (1) and
#: dropout output (2), Korthikanti et al. 2022's 5 a s^2 b.
SCORE_BYTES_KEPT = 5.0


#: Bytes moved per logit element by the training loss when the captured graph ends at the
#: logits (it holds no loss node), counted from Megatron-LM's vocabulary-parallel cross
#: entropy on fp32 logits (``tensor_parallel/cross_entropy.py``, called on
#: ``output.float()``). Forward: the maximum (4 read), subtracting it (4 + 4), the
#: exponential (4 + 4), its sum (4), dividing by the sum (4 + 4): 32. Backward: the softmax
#: scaled by the loss's gradient in place (4 + 4): 8. Half-precision logits add the cast to
#: fp32 (2 read + 4 written) and its backward (4 + 2): :data:`LOSS_CAST_BYTES` each way.
LOSS_BYTES_FORWARD = 32.0


LOSS_BYTES_BACKWARD = 8.0


LOSS_CAST_BYTES = 6.0


_SDPA = re.compile(r"scaled_dot_product|attention")


#: Operators whose backward reads their inputs (autograd saves them): matrix products,
#: products and quotients, powers, activations computed from their input, normalisations,
#: attention (its queries, keys and values), the loss.
SAVES_INPUTS = frozenset({"linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "mul", "div",
                          "pow", "silu", "gelu", "relu", "layer_norm", "rms_norm",
                          "group_norm", "batch_norm", "scaled_dot_product_attention",
                          "cross_entropy", "nll_loss", "conv1d", "conv2d", "einsum"})


#: Operators whose backward reads their own output.
SAVES_OUTPUT = frozenset({"rsqrt", "sqrt", "exp", "tanh", "sigmoid", "softmax",
                          "log_softmax", "scaled_dot_product_attention"})


#: Operators that keep a one-byte mask per element of their output.
SAVES_MASK = frozenset({"dropout", "native_dropout"})


#: Operators that return a view of their input: no kernel runs, no memory is kept (the
#: captured graph lists them with their output's bytes).
VIEW_OPS = frozenset({"view", "_unsafe_view", "transpose", "t", "permute", "split",
                      "split_with_sizes", "unbind", "expand", "unsqueeze", "squeeze", "select",
                      "slice", "alias", "detach", "chunk", "narrow", "as_strided",
                      "view_as", "flatten", "unflatten"})


@dataclass(frozen=True)
class LLMCosts:
    """One micro-batch of every virtual stage, and every pipeline rank's memory and step.

    Seconds are per device (all devices of a stage do the same work at once). Arrays over
    virtual stages have shape ``(pp * vp,)``; over pipeline ranks ``(pp,)``.

    Attributes
    ----------
    forward, backward : ndarray
        Compute plus exposed tensor-parallel communication of one micro-batch.
    tp_comm_forward, tp_comm_backward : ndarray
        Tensor-parallel communication of one micro-batch (before overlap).
    send_bytes, send_seconds : ndarray
        Activations virtual stage j sends to j + 1 per device per micro-batch (the last: 0),
        and the seconds that message takes.
    grad_bytes : ndarray
        Gradient bytes per device of each virtual stage (what data parallelism reduces).
    grad_sync_seconds : ndarray
        Each virtual stage's gradient reduction over the data-parallel group (all-reduce;
        reduce-scatter under ZeRO-1 and FSDP).
    param_gather_seconds : ndarray
        ZeRO-1: each virtual stage's parameter all-gather after the step; FSDP: the gathers
        of the stage's parameters, unit by unit (done before each forward and each
        backward): one collective per block, or per parameterized module under
        ``shard_unit`` ``module``, each with its latency.
    gather_units : ndarray
        FSDP: how many gathers each virtual stage's pass makes (its blocks, or its
        parameterized modules); the first is never hidden behind compute.
    gathers_once : bool
        FSDP keeps each stage's parameters gathered from its first forward to the end of the
        iteration (torchtitan under a pipeline: ``reshard_after_forward`` off, "to avoid
        per-microbatch all-gathers", its ``apply_fsdp``), instead of gathering them for every
        micro-batch's forward and backward.
    optimizer_seconds : ndarray
        Each pipeline rank's optimizer step.
    memory : dict of str to ndarray
        Per pipeline rank, bytes per device: ``params, gradients, master, optimizer,
        activations, gathered, buffers, total`` (what the tensors hold at the peak), and on
        GPUs ``reserved`` (the caching allocator's) and ``device`` (with the CUDA context
        and NCCL's buffers: what runs out of memory), ``shardplan/cost/_reserved.py``; off
        GPUs both are ``total``.
    in_flight : ndarray
        Micro-batches each virtual stage holds at its peak.
    microbatches : int
    replica_batch : int
        Sequences per micro-batch per data-parallel replica.
    alone_forward, alone_backward : ndarray or None
        Under ``moe_a2a_overlap``: what a forward or a backward that runs without the other
        pass of another micro-batch beside it (a pipeline's warm-up and cool-down) adds to
        ``forward`` / ``backward``: its dispatch and combine, none of it hidden. None
        otherwise.
    """

    forward: np.ndarray
    backward: np.ndarray
    tp_comm_forward: np.ndarray
    tp_comm_backward: np.ndarray
    send_bytes: np.ndarray
    send_seconds: np.ndarray
    grad_bytes: np.ndarray
    grad_sync_seconds: np.ndarray
    param_gather_seconds: np.ndarray
    optimizer_seconds: np.ndarray
    memory: dict[str, np.ndarray]
    in_flight: np.ndarray
    microbatches: int
    replica_batch: int
    gather_units: np.ndarray
    gathers_once: bool = False
    alone_forward: np.ndarray | None = None
    alone_backward: np.ndarray | None = None


def check_layout(graph: Graph, topology: Topology, parallel: ParallelConfig,
                 settings: ExecutionSettings) -> None:
    """Refuse a layout that cannot run, with the reason: more devices than the topology has,
    a tensor-parallel degree that does not divide the heads (when the graph says how many),
    blocks that do not fill the virtual stages, a micro-batch that does not divide over the
    data-parallel replicas, interleaved micro-batches that do not fill its rounds. The one
    check of an LLM layout: pricing (:func:`llm_costs`) and laying out
    (:func:`shardplan.strategy.llm.layout_plan`) both call it. O(n)."""
    if parallel.world_size > topology.num_devices:
        raise ShardplanError(f"{parallel.label()} needs {parallel.world_size} devices, the "
                             f"topology has {topology.num_devices}")
    dims = graph.meta.get("transformer")
    if isinstance(dims, Mapping):
        for key in ("heads", "kv_heads"):
            h = dims.get(key)
            if isinstance(h, int) and h % parallel.tp:
                raise ShardplanError(f"tensor parallelism {parallel.tp} does not divide the "
                                     f"model's {h} {key.replace('_', ' ')}")
    parallel.layers_per_stage(block_layout(graph).num_blocks)
    check_experts(graph, parallel)
    mb = settings.microbatch_size or graph.batch_size
    if mb % parallel.data_parallel:
        raise ShardplanError(f"a micro-batch of {mb} sequences does not divide over "
                             f"{parallel.data_parallel} data-parallel replicas")
    if parallel.vp > 1:
        rounds = max(1, settings.microbatches // parallel.pp)
        if settings.microbatches % rounds:
            raise ShardplanError(f"interleaved 1F1B needs the micro-batches "
                                 f"({settings.microbatches}) to be a multiple of "
                                 f"max(1, M // pp) = {rounds}")


def llm_costs(graph: Graph, topology: Topology, parallel: ParallelConfig,
              settings: ExecutionSettings) -> LLMCosts:
    """Price one micro-batch of every virtual stage and every rank's memory (module
    docstring): the nodes' compute (:func:`node_seconds`), the tensor-parallel collectives
    and the pipeline's messages (:mod:`shardplan.cost._llm_comm`), data parallelism, the
    optimizer step and the memory per rank (:mod:`shardplan.cost._llm_memory`).
    O(n + m + pp * vp) plus one collective per region and stage.

    Raises
    ------
    ShardplanError
        When the layout does not fit the graph or the topology (too few devices, a
        micro-batch that does not divide over the replicas, too few blocks).
    """
    check_layout(graph, topology, parallel, settings)
    pr = pricing(graph, topology, parallel, settings)
    times = node_seconds(pr)
    edge_bytes = times.scaled.edge_bytes.astype(np.float64) / parallel.cp
    tp_f, tp_b, exposed_f, exposed_b = tensor_parallel_seconds(pr, times.fwd, times.bwd,
                                                               times.ckpt_node, edge_bytes)
    compute_f = np.array([times.fwd[nodes].sum() for nodes in pr.stages])
    compute_b = np.array([times.bwd[nodes].sum() for nodes in pr.stages])
    routed = [nodes[pr.layout.expert[nodes]] for nodes in pr.stages]
    comm_f, comm_b = expert_comm_seconds(pr)
    moe_f, moe_b = exposed_expert_comm(pr, comm_f, comm_b, compute_f, compute_b,
                                       np.array([times.fwd[n].sum() for n in routed]),
                                       np.array([times.bwd[n].sum() for n in routed]))
    alone = (comm_f - moe_f, comm_b - moe_b) if settings.moe_a2a_overlap else (None, None)
    forward = compute_f + exposed_f + moe_f
    backward = compute_b + exposed_b + moe_b
    send, send_s, forward, backward = pipeline_messages(pr, edge_bytes, forward, backward)
    dp = data_parallel(pr)
    forward, backward = forward + dp.copy_forward, backward + dp.copy_backward
    # optimizer step per pipeline rank, over its (sharded) parameters
    pp = parallel.pp
    rank_params = np.zeros(pp)
    for j in range(parallel.num_stages):
        rank_params[j % pp] += dp.params[j]
    rank_experts = np.zeros(pp)
    for j in range(parallel.num_stages):
        rank_experts[j % pp] += dp.expert_params[j]
    sharded = parallel.dp_shard > 1 or settings.gradient_sync in ("sharded", "zero1")
    opt_share = pr.gradient_group if sharded else 1
    stepped = (rank_params - rank_experts) / opt_share + \
        rank_experts / expert_shard(parallel, opt_share)
    opt = np.asarray(optimizer_seconds(stepped * 4.0, settings.optimizer,
                                       pr.fp32, pr.bw, settings.precision,
                                       settings.grad_reduce == "fp32"), dtype=np.float64)
    mem, in_flight = rank_memory(pr, times, dp.params, rank_params, send,
                                 expert_params=dp.expert_params)
    return LLMCosts(forward=forward, backward=backward, tp_comm_forward=tp_f,
                    tp_comm_backward=tp_b, send_bytes=send, send_seconds=send_s,
                    grad_bytes=dp.grad_bytes, grad_sync_seconds=dp.sync,
                    param_gather_seconds=dp.gather, optimizer_seconds=opt, memory=mem,
                    in_flight=in_flight, microbatches=settings.microbatches,
                    replica_batch=pr.rb, gather_units=dp.units,
                    gathers_once=keeps_gathered(settings, parallel),
                    alone_forward=alone[0], alone_backward=alone[1])



def pricing(graph: Graph, topology: Topology, parallel: ParallelConfig,
            settings: ExecutionSettings) -> Pricing:
    """The facts of one layout every pricing step reads (:class:`Pricing`): the roles and
    stages of the nodes, what their activations and parameters are divided by on a device,
    the bytes per parameter, and the rates the GPU's kernels reach (``docs/gpu-model.md``).
    O(n)."""
    precision = settings.precision
    w_bytes, g_bytes, master_bytes = precision_bytes(precision)
    if settings.grad_reduce == "fp32":  # accumulated, reduced and held in fp32
        g_bytes = 4
    dtype_bytes = float(graph.meta.get("dtype_bytes", 4)) if isinstance(graph.meta, dict) \
        else 4.0
    layout = block_layout(graph)
    tp, cp = parallel.tp, parallel.cp
    sp = settings.sequence_parallel and tp > 1
    split = layout.split
    in_block = (layout.block >= 0) & (layout.block < layout.num_blocks)
    div = np.where(split, tp * cp, cp * (tp if sp else 1)).astype(np.float64)
    div[~in_block & ~split] = cp * (tp if sp else 1)
    div[layout.moe] = tp * cp  # a mixture of experts routes each device's tokens (_llm_moe)
    param_div = np.where(split, tp, 1).astype(np.float64)
    param_div[layout.expert] = parallel.ep * parallel.expert_tp
    stages = stage_nodes(layout, parallel)
    stage_of = np.empty(graph.num_nodes, dtype=np.int64)
    for j, nodes in enumerate(stages):
        stage_of[nodes] = j
    hw = gpu_model(topology)
    d0 = topology.devices[0]
    # the matrix products' peak at the precision (fp8: the device's fp8 rate, refused on
    # GPUs without one; fp32 products run on fp32_flops inside the roofline); what kernels
    # reach of it (shardplan.cost._gpu), or an explicit efficiency setting
    flops = float(matmul_peak_flops(topology, "fp8")[0]) if precision == "fp8" \
        else float(d0.flops)
    flops *= _reached(settings, hw, precision)
    bw = float(d0.extra.get("memory_bandwidth") or np.inf)
    if hw is not None:
        bw *= hw.memory_efficiency
    node_of = node_ids(topology) if hw is not None else None

    def collective(kind: str, group: np.ndarray, nbytes: float) -> float:
        if hw is not None and node_of is not None:
            return group_collective_seconds(topology, hw, kind, group, nbytes, node_of)
        return collective_seconds(topology, kind, group, nbytes)

    return Pricing(graph=graph, topology=topology, parallel=parallel, settings=settings,
                   layout=layout, stages=stages, stage_of=stage_of, div=div,
                   param_div=param_div,
                   n_params=graph.param_bytes.astype(np.float64) / dtype_bytes,
                   dtype_bytes=dtype_bytes, in_block=in_block,
                   rb=(settings.microbatch_size or graph.batch_size) // parallel.data_parallel,
                   w_bytes=w_bytes, g_bytes=g_bytes, master_bytes=master_bytes, hw=hw,
                   flops=flops, fp32=float(d0.extra.get("fp32_flops") or d0.flops), bw=bw,
                   collective=collective)


@dataclass(frozen=True, eq=False)
class NodeTimes:
    """Every node's forward and backward seconds of one micro-batch on one device (divided
    as the node is split; recompute in the backward), and what the memory step reads: the
    graph at the replica's batch and precision (``scaled``), the bytes each node keeps for
    the backward (``out_bytes``, with materialized scores and the loss's fp32
    log-probabilities), the checkpointed nodes and the per-op policy's saved ones, and the
    bytes the loss's backward allocates on one device of the last stage
    (``loss_gradient``, :data:`LOSS_GRADIENT_BYTES`)."""

    scaled: Graph
    fwd: np.ndarray
    bwd: np.ndarray
    out_bytes: np.ndarray
    ckpt_node: np.ndarray
    op_saved: np.ndarray
    loss_gradient: float = 0.0


def node_seconds(pr: Pricing) -> NodeTimes:
    """The "Compute" part of the module docstring, node by node. O(n)."""
    graph, st, layout, hw = pr.graph, pr.settings, pr.layout, pr.hw
    precision = st.precision
    act_scale = _ACT_BYTES[precision] / pr.dtype_bytes
    scaled, fwd, bwd = _node_times(graph, pr.rb, act_scale, float(pr.w_bytes), pr.flops,
                                   pr.fp32, pr.bw, precision != "fp32", _expert_scale(pr))
    fwd, bwd = fwd.copy(), bwd.copy()
    rate: float | np.ndarray = pr.flops
    if precision == "fp8":
        fwd, bwd, rate = _fp8_where_it_runs(pr, act_scale, fwd, bwd)
    if hw is not None and st.efficiency is None:
        # matrix products at the waves their per-device shapes fill (shardplan.cost._gpu)
        wf, wb = _wave_factors(graph, pr.rb, pr.parallel.tp, pr.parallel.cp, hw.sms,
                               st.tp_comm_overlap and pr.parallel.tp > 1)
        wf, wb = expert_factors(pr, wf, wb)
        fwd = np.maximum(fwd, scaled.fwd_flops / rate / wf)
        bwd = np.maximum(bwd, scaled.bwd_flops / rate / wb)
    # attention that writes its s x s scores (Megatron-LM's fused softmax kernels, before
    # flash attention): the scores' traffic on top of its products (separate kernels)
    scores = _score_elements(graph, layout, scaled.output_bytes / _ACT_BYTES[precision]) \
        if st.attention == "materialized" else np.zeros(graph.num_nodes)
    per_elem = _ACT_BYTES[precision] / 2.0
    fwd = fwd + SCORE_BYTES_FORWARD * per_elem * scores / pr.bw
    bwd = bwd + SCORE_BYTES_BACKWARD * per_elem * scores / pr.bw
    # the loss over the logits, when the graph ends at them (memory-bound passes)
    logits = _logits_node(graph, layout)
    n_logits = scaled.output_bytes[logits] / _ACT_BYTES[precision] if logits >= 0 else 0.0
    if logits >= 0:
        cast = LOSS_CAST_BYTES if precision != "fp32" else 0.0
        fwd[logits] += (LOSS_BYTES_FORWARD + cast) * n_logits / pr.bw
        bwd[logits] += (LOSS_BYTES_BACKWARD + cast) * n_logits / pr.bw
    window = _window_factors(graph)  # sliding-window layers attend to fewer keys
    fwd = fwd * window / pr.div
    bwd = bwd * window / pr.div
    if layout.has_experts:  # the slowest expert-parallel device sets the layer's pace
        slow = np.where(layout.expert, straggler_factor(pr), 1.0)
        fwd, bwd = fwd * slow, bwd * slow
    ckpt_node = _checkpointed(pr)
    op_saved = _op_saved(graph)
    if st.recompute == "full":
        bwd = bwd + np.where(ckpt_node, fwd, 0.0)
    elif st.recompute == "selective":
        bwd = bwd + np.where(recompute_mask(graph, st.recompute_modules), fwd, 0.0)
    elif st.recompute == "op":
        bwd = bwd + np.where(pr.in_block & ~op_saved, fwd, 0.0)
    out_bytes = _graph_facts(graph).kept_bytes(scaled, _ACT_BYTES[precision]) + \
        SCORE_BYTES_KEPT * per_elem * scores
    if st.stack == "megatron-core":
        drop, own = te_kept(graph)
        out_bytes = np.where(drop, 0.0, out_bytes)
        out_bytes[own] = scaled.output_bytes[own]
        if precision == "fp8":  # kept as the fp8 copy its products read (1 byte of 2)
            out_bytes = np.where(fp8_read_only(graph), out_bytes * 0.5, out_bytes)
    # the loss keeps its fp32 log-probabilities of the vocabulary-split logits (the captured
    # graph ends at the logits; a loss node, when captured, is priced as any node)
    if logits >= 0:
        out_bytes[logits] += n_logits * 4.0
    loss_grad = _loss_gradient_bytes(st) * n_logits / pr.div[logits] if logits >= 0 else 0.0
    return NodeTimes(scaled=scaled, fwd=fwd, bwd=bwd, out_bytes=out_bytes,
                     ckpt_node=ckpt_node, op_saved=op_saved, loss_gradient=loss_grad)


#: Bytes per logit element the loss's backward allocates while the forward's are still held,
#: by how the stack computes the loss (``docs/gpu-model.md``). torch's ``cross_entropy`` on
#: ``logits.float()`` (torchtitan) writes a new fp32 gradient (4) and its cast back to the
#: logits' half precision (2); Megatron's vocabulary-parallel cross entropy turns its saved
#: fp32 softmax into the gradient in place, leaving only the cast (2).
LOSS_GRADIENT_BYTES = {"torch": (4.0, 2.0), "in-place": (0.0, 2.0)}


def _loss_gradient_bytes(st: ExecutionSettings) -> float:
    fp32, cast = LOSS_GRADIENT_BYTES["torch" if st.stack == "torchtitan" else "in-place"]
    return fp32 + (cast if st.precision != "fp32" else 0.0)


def _checkpointed(pr: Pricing) -> np.ndarray:
    """The nodes full recompute re-runs: every block's, or every k-th block's (torchtitan's
    layer-selective checkpointing, selective_ac_option k: the k-th, 2k-th, ... blocks of the
    model); per-op checkpointing wraps every block. O(n)."""
    layout, every = pr.layout, pr.settings.recompute_every
    if pr.settings.recompute == "op":
        return pr.in_block
    ckpt_block = np.zeros(max(layout.num_blocks, 1), dtype=bool)
    ckpt_block[every - 1::every] = True
    return pr.in_block & ckpt_block[np.clip(layout.block, 0, max(layout.num_blocks - 1, 0))]


def _reached(settings: ExecutionSettings, hw: GPUModel | None, precision: str) -> float:
    """What matrix products at ``precision`` reach of their peak: an explicit efficiency
    setting, else the GPU model's fraction (:meth:`GPUModel.matmul_fraction`), else all of
    it (a device that is not a known GPU)."""
    if settings.efficiency is not None:
        return float(settings.efficiency)
    return hw.matmul_fraction(precision) if hw is not None else 1.0


def _fp8_where_it_runs(pr: Pricing, act_scale: float, fwd: np.ndarray, bwd: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fp8 runs only the blocks' linear layers (Transformer Engine's modules, torchtitan's
    Float8Linear, :func:`fp8_linear_nodes`): attention and the output head stay at the bf16
    rate, and every fp8 product pays its casts (:func:`fp8_cast_seconds`). Returns the
    nodes' forward and backward seconds and their matrix-product rates."""
    graph, topology = pr.graph, pr.topology
    half = float(topology.devices[0].flops) * _reached(pr.settings, pr.hw, "bf16")
    fp8_nodes = fp8_linear_nodes(graph)
    _, fwd16, bwd16 = _node_times(graph, pr.rb, act_scale, float(pr.w_bytes), half, pr.fp32,
                                  pr.bw, True, _expert_scale(pr))
    cast_f, cast_b = fp8_cast_seconds(graph, pr.rb, fp8_nodes, pr.bw,
                                      pr.settings.microbatches)
    return (np.where(fp8_nodes, fwd, fwd16) + cast_f, np.where(fp8_nodes, bwd, bwd16) + cast_b,
            np.where(fp8_nodes, pr.flops, half))


@dataclass(frozen=True)
class _Facts:
    """What of a graph the LLM costs read on every call (computed once per graph)."""

    views: np.ndarray
    kept: np.ndarray
    masks: np.ndarray
    has_loss: bool

    def kept_bytes(self, graph: Graph, element_bytes: float) -> np.ndarray:
        out = np.where(self.kept, graph.output_bytes.astype(np.float64), 0.0)
        return out + np.where(self.masks, graph.output_bytes / element_bytes, 0.0)


@lru_cache(maxsize=16)
def _graph_facts(graph: Graph) -> _Facts:
    ops = [o.lower() for o in graph.ops]
    views = np.array([o in VIEW_OPS for o in ops], dtype=bool)
    kept = saved_bytes(graph.replace(output_bytes=np.ones(graph.num_nodes, np.int64)), views,
                       np.inf) > 0
    return _Facts(views=views, kept=kept,
                  masks=np.array([o in SAVES_MASK for o in ops], dtype=bool),
                  has_loss=any(_LOSS_OPS.search(o) for o in ops))


_FUSED_ATTENTION = re.compile(r"scaled_dot_product|flash|efficient_attention")


def _logits_node(graph: Graph, layout: BlockLayout) -> int:
    """The node whose output is the logits the loss reads (the last vocabulary node after
    the blocks), or -1 when the graph holds its own loss node or has no such head. O(n)."""
    if _graph_facts(graph).has_loss:
        return -1
    head = np.flatnonzero(layout.vocab & (layout.block >= layout.num_blocks))
    if not head.size:
        return -1
    return int(head[np.argmax(graph.topological_rank[head])])


@lru_cache(maxsize=16)
def _op_saved(graph: Graph) -> np.ndarray:
    """The nodes whose outputs torchtitan's per-op activation checkpointing keeps
    (``selective_ac_option = "op"``, ``recompute`` ``op``): in each block, the fused
    attention's output and every other matrix product with parameters, counted in the order
    the block runs them from the first (torchtitan's ``_custom_policy``: "saves output of all
    compute ops, except every second mm", its count restarting in each checkpointed block).
    Everything else in a block is recomputed in the backward. O(n)."""
    layout = block_layout(graph)
    saved = np.zeros(graph.num_nodes, dtype=bool)
    count: dict[int, int] = {}
    for v in range(graph.num_nodes):  # capture order is the order the forward ran them
        b = int(layout.block[v])
        if b < 0 or b >= layout.num_blocks:
            continue
        op = graph.ops[v].lower()
        if _FUSED_ATTENTION.search(op):
            saved[v] = True
        elif graph.param_bytes[v] > 0 and is_matmul(op):
            count[b] = count.get(b, 0) + 1
            saved[v] = count[b] % 2 == 1
    saved.setflags(write=False)
    return saved


@lru_cache(maxsize=16)
@lru_cache(maxsize=16)
def fp8_read_only(graph: Graph) -> np.ndarray:
    """Nodes whose every consumer is an fp8 product (:func:`fp8_linear_nodes`): under fp8,
    Transformer Engine's modules keep for the backward the fp8 copy of their input they
    multiplied (``Linear`` / ``LayerNormLinear`` save the quantized input the weight
    gradient's product reads), not the bf16 tensor, so such an output is kept at one byte per
    element; a view's readers count as its base's. O(n + m)."""
    fp8 = fp8_linear_nodes(graph)
    views = _graph_facts(graph).views
    n = graph.num_nodes
    out = np.zeros(n, dtype=bool)
    # a view's readers read its base: follow view chains to the operators that read them
    only_fp8 = np.zeros(n, dtype=bool)
    for v in graph.topological_order.tolist()[::-1]:
        succ = graph.successors(v)
        ok = succ.size > 0 and all(bool(only_fp8[w]) if views[w] else bool(fp8[w])
                                   for w in succ.tolist())
        only_fp8[v] = ok
        out[v] = ok and not views[v]
    out.setflags(write=False)
    return out


def te_kept(graph: Graph) -> tuple[np.ndarray, np.ndarray]:
    """What Megatron-Core's Transformer Engine blocks keep for the backward, against what
    eager autograd keeps of the captured graph: ``(drop, own)`` masks -- nodes whose kept
    output they do not keep, and the query, key and value products whose outputs they keep
    as produced. Counted from Transformer Engine's modules (``LayerNormLinear`` /
    ``LayerNormMLP`` save the norm's input and output, ``DotProductAttention`` its q, k, v
    at their own head counts and its output, the fused rotary embedding nothing beside them,
    the fused SwiGLU / GeLU (``bias_swiglu_fusion``) the first product's output, recomputing
    the activation):

    - a norm module keeps its last node's output (the normalized input the next product
      reads), not its intermediate ``x * rsqrt(...)``;
    - an attention region keeps its attention core's output and the outputs of its query,
      key and value products; not the rotary embedding's intermediates, keys and values
      repeated over the query heads, or the copy of the core's output laid out for the
      projection;
    - an MLP region keeps its products' outputs and the input of its last product; not the
      activation's intermediate (SiLU of the gate). O(n)."""
    layout = block_layout(graph)
    n = graph.num_nodes
    in_block = (layout.block >= 0) & (layout.block < layout.num_blocks)
    drop = np.zeros(n, dtype=bool)
    own = np.zeros(n, dtype=bool)
    last_of: dict[str, int] = {}
    for v in np.flatnonzero(in_block):
        mod = graph.modules[v] or ""
        if mod.rsplit(".", 1)[-1].endswith("norm"):
            if mod in last_of:
                drop[last_of[mod]] = True
            last_of[mod] = int(v)
    region = layout.region
    leaving = np.zeros(n, dtype=bool)
    leaving[graph.src[region[graph.src] != region[graph.dst]]] = True
    linear = np.array([is_matmul(op) and not _SDPA.search(op.lower()) for op in graph.ops]) \
        & (graph.param_bytes > 0)
    core = np.array([bool(_FUSED_ATTENTION.search(op.lower())) for op in graph.ops])
    for reg in np.unique(region[region >= 0]):
        nodes = np.flatnonzero(region == reg)
        if core[nodes].any():  # attention
            own[nodes[linear[nodes] & ~leaving[nodes]]] = True
            drop[nodes[~core[nodes] & ~own[nodes]]] = True
        else:  # MLP: the last product's input stays
            last = nodes[linear[nodes] & leaving[nodes]]
            feeds = np.isin(graph.dst, last)
            fc2_in = np.isin(np.arange(n), graph.src[feeds])
            drop[nodes[~linear[nodes] & ~fc2_in[nodes]]] = True
    drop &= ~own
    drop.setflags(write=False)
    own.setflags(write=False)
    return drop, own


@lru_cache(maxsize=64)
def fp8_linear_nodes(graph: Graph) -> np.ndarray:
    """The nodes an fp8 run multiplies in fp8: the transformer blocks' linear layers.

    Transformer Engine's ``fp8_autocast`` covers its ``Linear`` / ``LayerNormLinear`` /
    ``LayerNormMLP`` modules, which Megatron-Core's blocks use; its ``DotProductAttention``
    stays in bf16 unless ``fp8_dot_product_attention`` is set, and Megatron-Core's output
    layer is its own ``ColumnParallelLinear``, not a Transformer Engine module. torchtitan's
    float8 converts the blocks' ``nn.Linear`` and leaves the ``output`` head out by default.
    O(n)."""
    layout = block_layout(graph)
    in_block = (layout.block >= 0) & (layout.block < layout.num_blocks)
    linear = np.array([is_matmul(op) and not _SDPA.search(op.lower()) for op in graph.ops])
    out = in_block & ~layout.attention_core & linear & (graph.param_bytes > 0)
    out.setflags(write=False)
    return out


#: Bytes per element Transformer Engine's fp8 recipes move to feed an fp8 product: the
#: fused cast-transpose (``cast_transpose`` in ``transformer_engine/common``) reads the bf16
#: tensor (2) and writes its fp8 copy (1) and the transposed fp8 copy the other product of
#: the backward needs on Hopper, whose fp8 tensor cores take only the TN layout (1). Paid
#: for each fp8 product's input in the forward, its output gradient in the backward, and
#: its weight once per iteration (Megatron passes ``is_first_microbatch``, so the fp8
#: weights are cached across micro-batches).
FP8_CAST_BYTES = 4.0


def fp8_cast_seconds(graph: Graph, batch: int, fp8_nodes: np.ndarray, bw: float,
                     microbatches: int) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds of the fp8 casts of one micro-batch, per node before
    any parallel split (:data:`FP8_CAST_BYTES`): a product ``(M x K) (K x N)`` casts its
    ``M K`` inputs forward, its ``M N`` output gradients backward, and its ``K N`` weights
    once per iteration (a share of it per micro-batch). O(n)."""
    g = _at_batch(graph, batch)
    dtype_bytes = float(graph.meta.get("dtype_bytes", 4)) if isinstance(graph.meta, dict) \
        else 4.0
    params = graph.param_bytes.astype(np.float64) / dtype_bytes
    out = g.output_bytes.astype(np.float64) / dtype_bytes
    fwd, bwd = np.zeros(graph.num_nodes), np.zeros(graph.num_nodes)
    sel = fp8_nodes & (out > 0) & (params > 0)
    k = np.where(sel, g.fwd_flops / np.maximum(2.0 * out, 1.0), 0.0)
    inputs = np.where(sel, out * k * k / np.maximum(params, 1.0), 0.0)
    fwd[sel] = FP8_CAST_BYTES * (inputs[sel] + params[sel] / max(microbatches, 1)) / bw
    bwd[sel] = FP8_CAST_BYTES * out[sel] / bw
    return fwd, bwd


@lru_cache(maxsize=16)
def _window_factors(graph: Graph) -> np.ndarray:
    """Per node, the share of a causal attention's work a sliding window leaves: for the
    attention of the layers in ``meta["transformer"]["window_layers"]`` with window ``w``
    over ``s`` tokens, ``(w s - w (w - 1) / 2) / (s (s + 1) / 2)`` (each query attends to at
    most ``w`` keys; the fused kernels skip the tiles outside the band, as they skip those
    above the diagonal); 1 elsewhere. O(n)."""
    out = np.ones(graph.num_nodes)
    dims = graph.meta.get("transformer") if isinstance(graph.meta, Mapping) else None
    if not isinstance(dims, Mapping) or not dims.get("sliding_window"):
        return out
    w, seq = int(dims["sliding_window"]), int(dims.get("seq") or 0)
    if seq <= w:
        return out
    share = (w * seq - w * (w - 1) / 2.0) / (seq * (seq + 1) / 2.0)
    layers = {int(x) for x in dims.get("window_layers", ())}
    for v, (op, mod) in enumerate(zip(graph.ops, graph.modules, strict=True)):
        m = _BLOCK.search(mod or "")  # the model's own index of the block, layers.N
        if m is not None and int(m.group(1)) in layers and _SDPA.search(op.lower()):
            out[v] = share
    out.setflags(write=False)
    return out


@lru_cache(maxsize=16)
def _at_batch(graph: Graph, batch: int) -> Graph:
    """``graph.at_batch_size(batch)``, kept: a search prices many layouts of one batch."""
    return graph.at_batch_size(batch)


#: Transformer Engine's userbuffers defaults (``initialize_ub``'s ``get_default_config``, what
#: Megatron-Core's ``--tp-comm-overlap`` runs without ``--tp-comm-overlap-cfg``): the
#: ``pipeline`` overlap of a row-parallel forward with its reduce-scatter runs the product in
#: this many chunks of the tokens, on the SMs the communication leaves it (``set_sm_margin``).
UB_PIPELINE_SPLITS = 4
UB_PIPELINE_SMS = 16


@lru_cache(maxsize=64)
def _wave_factors(graph: Graph, batch: int, tp: int, cp: int, sms: int,
                  overlap: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Every node's forward and backward wave efficiency on one device
    (:func:`~shardplan.cost._gpu.wave_efficiency`; 1 for nodes that are not matrix products
    with parameters).

    A linear node's GEMM ``(M x K) (K x N)`` is read off the graph at ``batch``: ``K =
    FLOPs / (2 x output elements)``, ``N = parameters / (K + 1)`` when that divides (a bias)
    else ``parameters / K``, ``M = output elements / N``.
    On a device, context parallelism divides ``M``; tensor parallelism divides ``N`` of a
    column-parallel product (its input comes from outside its region, or it is the
    vocabulary-split head) and ``K`` of a row-parallel one (its output leaves its region).
    The forward writes ``M x N``; the backward's two products, of equal FLOPs, write ``M x K``
    (input gradient) and ``K x N`` (weight gradient). Cached per graph and layout. O(n + m).

    ``overlap`` (tensor-parallel communication overlapped by Transformer Engine's userbuffers,
    its defaults): the products beside an all-gather run in ``tp`` chunks of ``M / tp``
    tokens as each chunk arrives (``ring_exchange``: a column-parallel forward, a
    row-parallel input gradient); a row-parallel forward runs in :data:`UB_PIPELINE_SPLITS`
    chunks on ``sms -`` :data:`UB_PIPELINE_SMS` SMs (``pipeline``); the others are whole
    (``bulk``). Each chunk fills its own waves.
    """
    g = _at_batch(graph, batch)
    dtype_bytes = float(graph.meta.get("dtype_bytes", 4)) if isinstance(graph.meta, dict) \
        else 4.0
    n = graph.num_nodes
    wf, wb = np.ones(n), np.ones(n)
    params = graph.param_bytes.astype(np.float64) / dtype_bytes
    out = g.output_bytes.astype(np.float64) / dtype_bytes
    layout = block_layout(graph)
    region = np.where(layout.vocab, -2, layout.region)
    leaves = np.zeros(n, dtype=bool)
    leaves[graph.src[region[graph.src] != region[graph.dst]]] = True
    for v in np.flatnonzero((params > 0) & (out > 0) & (g.fwd_flops > 0)):
        if not is_matmul(graph.ops[v]) or "attention" in graph.ops[v].lower():
            continue
        k = float(round(float(g.fwd_flops[v]) / (2.0 * out[v])))
        if k < 1:
            continue
        p = float(round(params[v]))
        # weights K x N, plus N biases when the count divides so
        cols = p / (k + 1) if p % (k + 1) == 0 else p / k
        if cols < 1:
            continue
        rows = out[v] / cols / cp
        fwd_rows, fwd_sms, dgrad_rows = rows, sms, rows
        if layout.split[v] and tp > 1:
            row_parallel = bool(leaves[v] and not layout.vocab[v])
            if row_parallel:
                k /= tp  # row-parallel: the reduction dimension is split
            else:
                cols /= tp  # column-parallel: the outputs are split
            if overlap and not layout.vocab[v]:
                if row_parallel:
                    fwd_rows, fwd_sms = rows / UB_PIPELINE_SPLITS, sms - UB_PIPELINE_SMS
                    dgrad_rows = rows / tp
                else:
                    fwd_rows = rows / tp
        wf[v] = float(wave_efficiency(fwd_rows, cols, fwd_sms, k)) * fwd_sms / sms
        dgrad = float(wave_efficiency(dgrad_rows, k, sms, cols))
        wgrad = float(wave_efficiency(k, cols, sms, rows))
        wb[v] = 2.0 / (1.0 / dgrad + 1.0 / wgrad)
    wf.setflags(write=False)
    wb.setflags(write=False)
    return wf, wb


def _expert_scale(pr: Pricing) -> float:
    """What the routed experts' weight bytes are scaled by in their roofline so that, once a
    node's time is divided by its split (``tp x cp`` for them), a device reads its own
    ``1 / (ep x etp)`` of the experts' weights: ``tp cp / (ep etp)`` (1 for a dense model)."""
    par = pr.parallel
    if not pr.layout.has_experts:
        return 1.0
    return par.tp * par.cp / (par.ep * par.expert_tp)


@lru_cache(maxsize=64)
def _node_times(graph: Graph, batch: int, act_scale: float, w_bytes: float, flops: float,
                fp32: float, bw: float, mixed: bool, expert_scale: float = 1.0
                ) -> tuple[Graph, np.ndarray, np.ndarray]:
    """The graph at ``batch`` with its bytes at the plan's precision, and every node's
    forward and backward roofline seconds (views: none), the routed experts' weights read
    at ``expert_scale`` of their bytes (:func:`_expert_scale`). Cached: a search prices
    many layouts of one graph at a few batches."""
    g = _at_batch(graph, batch)
    dtype_bytes = float(graph.meta.get("dtype_bytes", 4)) if isinstance(graph.meta, dict) \
        else 4.0
    weights = graph.param_bytes / dtype_bytes * w_bytes
    if expert_scale != 1.0:
        weights = np.where(block_layout(graph).expert, weights * expert_scale, weights)
    scaled = g.replace(output_bytes=np.rint(g.output_bytes * act_scale).astype(np.int64),
                       edge_bytes=np.rint(g.edge_bytes * act_scale).astype(np.int64),
                       param_bytes=np.rint(weights).astype(np.int64))
    fwd, bwd = roofline_seconds(scaled, flops, fp32, bw, mixed_precision=mixed)
    views = _graph_facts(graph).views
    fwd[views] = 0.0
    bwd[views] = 0.0
    fwd.setflags(write=False)
    bwd.setflags(write=False)
    return scaled, fwd, bwd


def saved_bytes(graph: Graph, views: np.ndarray, element_bytes: float) -> np.ndarray:
    """Bytes of every node's output that autograd keeps for the backward, once per tensor.

    A tensor is kept when a consumer's backward reads its inputs (:data:`SAVES_INPUTS`) or
    its producer's backward reads its output (:data:`SAVES_OUTPUT`); a view keeps its base
    alive, so the bytes go to the node the view chain starts from; a dropout keeps a
    one-byte mask per element (:data:`SAVES_MASK`). Integer inputs (token ids) are not
    nodes. O(n + m)."""
    n = graph.num_nodes
    ops = [o.lower() for o in graph.ops]
    base = np.arange(n)
    for v in graph.topological_order.tolist():  # a view's storage is its input's
        if views[v]:
            preds = graph.predecessors(v)
            if preds.size:
                base[v] = base[int(preds[0])]
    kept = np.zeros(n, dtype=bool)
    for v in range(n):
        if ops[v] in SAVES_OUTPUT:
            kept[base[v]] = True
        if ops[v] in SAVES_INPUTS:
            kept[base[graph.predecessors(v)]] = True
    out = np.where(kept & ~views, graph.output_bytes.astype(np.float64), 0.0)
    mask = np.array([o in SAVES_MASK for o in ops], dtype=bool)
    return out + np.where(mask, graph.output_bytes / element_bytes, 0.0)


def _score_elements(graph: Graph, layout: BlockLayout, out_elements: np.ndarray) -> np.ndarray:
    """Score elements (b x heads x s x s) of every attention node: its output's elements
    (b x s x heads x d) times ``s / d``, with ``s`` and ``d = hidden / heads`` from the graph's
    ``transformer`` dimensions; zero elsewhere (and everywhere when the graph has none)."""
    dims = graph.meta.get("transformer") if isinstance(graph.meta, dict) else None
    out = np.zeros(graph.num_nodes)
    if not isinstance(dims, dict):
        return out
    try:
        s, d = float(dims["seq"]), float(dims["hidden"]) / float(dims["heads"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return out
    sdpa = layout.attention_core & np.array([_SDPA.search(o.lower()) is not None
                                             for o in graph.ops], dtype=bool)
    out[sdpa] = out_elements[sdpa] * s / d
    return out
