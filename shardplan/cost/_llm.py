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
from shardplan.cost._formulas import OPTIMIZER_STATE, optimizer_seconds
from shardplan.cost._reserved import device_bytes, reserved_bytes
from shardplan.cost._gpu import (
    gpu_model,
    group_collective_seconds,
    node_ids,
    p2p_seconds,
    wave_efficiency,
)
from shardplan.errors import ShardplanError
from shardplan.ir import ExecutionSettings, Graph, ParallelConfig, Topology
from shardplan.ir.settings import ATTENTION_KERNELS

__all__ = ["ATTENTION_KERNELS", "TP_REGIONS", "VOCAB_MODULES", "BlockLayout", "LLMCosts",
           "block_layout", "check_layout", "llm_costs", "precision_bytes", "saved_bytes",
           "stage_nodes"]

#: DeepSpeed ZeRO-3's defaults (``deepspeed/runtime/zero/config.py``), in elements: the
#: prefetch bucket (``stage3_prefetch_bucket_size``), the most parameters gathered at once
#: (``stage3_max_live_parameters``; a larger module is still gathered whole) and the
#: gradient bucket reduced at a time (``reduce_bucket_size``).
ZERO3_PREFETCH_PARAMS = 5e7
ZERO3_MAX_LIVE_PARAMS = 1e9
ZERO3_REDUCE_BUCKET = 5e8

#: Sub-modules of a block whose nodes are split over the tensor-parallel group.
TP_REGIONS = ("attention", "self_attention", "attn", "feed_forward", "mlp")
#: Top-level modules split by the vocabulary (the embedding and the output head).
VOCAB_MODULES = ("tok_embeddings", "output", "lm_head", "wte", "word_embeddings")
_LOSS_OPS = re.compile(r"cross_entropy|nll_loss|log_softmax")
_ATTENTION_CORE = re.compile(r"scaled_dot_product|attention|flash|softmax|dropout")
_BLOCK = re.compile(r"(?:^|\.)(?:layers|h|layer|blocks)\.(\d+)(?:\.|$)")

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
#: torch FSDP2 (``fully_shard``, the FSDP of torchtitan and of shardplan's runtime) copies
#: every all-gathered block out of its flat buffer into the parameters
#: (``split_with_sizes_copy`` in ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``:
#: each byte read and written, this many times the parameter bytes per gather) and the
#: gradients into the reduce-scatter buffer (``chunk_cat``: read at the parameters' precision,
#: written at the gradients'), on the compute stream.
FSDP_COPY_OUT = 2.0
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

#: Bytes of a parameter, its gradient, master copy and each optimizer moment per precision.
_PARAM_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 2}
_ACT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 2}


def precision_bytes(precision: str) -> tuple[int, int, int]:
    """``(parameter, gradient, master)`` bytes per parameter at a training precision.

    Half precision (and fp8, whose matrix products read bf16 weights cast on the fly, as
    Transformer Engine and torchao keep them) stores 2-byte weights and gradients beside
    4-byte fp32 master weights (Micikevicius et al. 2018); fp32 has no master copy."""
    if precision not in _PARAM_BYTES:
        raise ShardplanError(f"unknown precision {precision!r} (choose from "
                             f"{', '.join(_PARAM_BYTES)})")
    w = _PARAM_BYTES[precision]
    return w, w, (0 if precision == "fp32" else 4)


@dataclass(frozen=True)
class BlockLayout:
    """Where every node of a transformer graph sits.

    Attributes
    ----------
    block : ndarray of int, shape (n,)
        Transformer block of each node; ``-1`` before the first (embedding), ``num_blocks``
        after the last (final norm, head, loss).
    num_blocks : int
    region : ndarray of int, shape (n,)
        Split region id of a node inside a block's attention or feed-forward, else ``-1``.
    vocab : ndarray of bool, shape (n,)
        Nodes of the vocabulary-parallel embedding, head and loss.
    attention_core : ndarray of bool, shape (n,)
        Parameter-free nodes of an attention region (what selective recompute re-runs).
    """

    block: np.ndarray
    num_blocks: int
    region: np.ndarray
    vocab: np.ndarray
    attention_core: np.ndarray

    @property
    def split(self) -> np.ndarray:
        """Nodes split over the tensor-parallel group."""
        return (self.region >= 0) | self.vocab


def block_layout(graph: Graph) -> BlockLayout:
    """Assign every node to its transformer block and tensor-parallel role (module docstring).

    Nodes without a block index go before the blocks when no block node precedes them, after
    otherwise. Raises :class:`ShardplanError` when the graph has no ``layers.N`` modules.
    O(n + m)."""
    return _layout_cached(graph)


@lru_cache(maxsize=16)
def _layout_cached(graph: Graph) -> BlockLayout:
    n = graph.num_nodes
    block = np.full(n, -2, dtype=np.int64)
    region_key: dict[str, int] = {}
    region = np.full(n, -1, dtype=np.int64)
    vocab = np.zeros(n, dtype=bool)
    core = np.zeros(n, dtype=bool)
    for v, (mod, op) in enumerate(zip(graph.modules, graph.ops, strict=True)):
        m = _BLOCK.search(mod or "")
        if m is not None:
            block[v] = int(m.group(1))
            rest = (mod[m.end():] if m.end() < len(mod) else "").split(".")
            if rest and rest[0] in TP_REGIONS:
                key = mod[:m.end()] + "." + rest[0]
                region[v] = region_key.setdefault(key, len(region_key))
                if (rest[0] in ("attention", "self_attention", "attn")
                        and graph.param_bytes[v] == 0 and _ATTENTION_CORE.search(op.lower())):
                    core[v] = True
        else:
            top = (mod or "").split(".")[0]
            if top in VOCAB_MODULES or _LOSS_OPS.search(op.lower()):
                vocab[v] = True
    if not (block >= 0).any():
        raise ShardplanError(f"graph {graph.name!r} has no transformer blocks (no module "
                             f"named layers.N): the LLM plan kind needs them")
    ids = np.unique(block[block >= 0])
    remap = {int(b): i for i, b in enumerate(ids)}
    block = np.array([remap.get(int(b), int(b)) for b in block], dtype=np.int64)
    nb = len(ids)
    # nodes outside the blocks: after the blocks when a block node reaches them
    after = np.zeros(n, dtype=bool)
    for v in graph.topological_order.tolist():
        if block[v] >= 0 or after[v]:
            after[graph.successors(v)] = True
    outside = block == -2
    block[outside & after] = nb
    block[outside & ~after] = -1
    return BlockLayout(block=block, num_blocks=nb, region=region, vocab=vocab,
                       attention_core=core)


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


def stage_nodes(layout: BlockLayout, parallel: ParallelConfig) -> list[np.ndarray]:
    """The nodes of every virtual stage in pipeline order: its blocks, the embedding with the
    first and the head with the last. O(n)."""
    per = parallel.layers_per_stage(layout.num_blocks)
    bounds = np.concatenate(([0], np.cumsum(per)))
    key = layout.block.copy()
    key[key < 0] = 0
    key[key >= layout.num_blocks] = layout.num_blocks - 1
    stage_of_block = np.searchsorted(bounds, np.arange(layout.num_blocks), side="right") - 1
    # an empty stage (0 blocks) keeps nothing; searchsorted picks the last stage that starts
    # at a block, which is the non-empty one
    sid = stage_of_block[key]
    sid[layout.block < 0] = 0
    sid[layout.block >= layout.num_blocks] = parallel.num_stages - 1
    return [np.flatnonzero(sid == j) for j in range(parallel.num_stages)]


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


def _rank_devices(parallel: ParallelConfig, pp_rank: int) -> np.ndarray:
    r = parallel.devices_per_rank
    return np.arange(pp_rank * r, (pp_rank + 1) * r)


def _groups(parallel: ParallelConfig, pp_rank: int) -> tuple[np.ndarray, np.ndarray]:
    """A tensor-parallel group and a gradient group of a pipeline rank (device ids).

    The gradient group is the data-parallel ranks with the context-parallel ones: context
    parallelism splits the sequence over ranks that hold the same weights, so their
    gradients are reduced (and a distributed optimizer or FSDP sharded) over ``dp x cp``
    ranks, as Megatron-Core's ``get_data_parallel_group(with_context_parallel=True)`` and
    torchtitan's ``dp_shard_cp`` mesh do."""
    base = pp_rank * parallel.devices_per_rank
    tp = base + np.arange(parallel.tp)
    dp = base + parallel.tp * np.arange(parallel.data_parallel * parallel.cp)
    return tp, dp


def llm_costs(graph: Graph, topology: Topology, parallel: ParallelConfig,
              settings: ExecutionSettings) -> LLMCosts:
    """Price one micro-batch of every virtual stage and every rank's memory (module
    docstring). O(n + m + pp * vp) plus one collective per region and stage.

    Raises
    ------
    ShardplanError
        When the layout does not fit the graph or the topology (too few devices, a
        micro-batch that does not divide over the replicas, too few blocks).
    """
    check_layout(graph, topology, parallel, settings)
    precision = settings.precision
    recompute = settings.recompute
    sp = settings.sequence_parallel and parallel.tp > 1
    overlap_tp = settings.tp_comm_overlap
    attention = settings.attention
    w_bytes, g_bytes, master_bytes = precision_bytes(precision)
    fp32_grads = settings.grad_reduce == "fp32"
    if fp32_grads:  # accumulated, reduced and held in fp32 (ExecutionSettings.grad_reduce)
        g_bytes = 4
    dtype_bytes = float(graph.meta.get("dtype_bytes", 4)) if isinstance(graph.meta, dict) \
        else 4.0
    act_scale = _ACT_BYTES[precision] / dtype_bytes
    layout = block_layout(graph)
    rb = (settings.microbatch_size or graph.batch_size) // parallel.data_parallel
    n_params = graph.param_bytes.astype(np.float64) / dtype_bytes
    tp, cp = parallel.tp, parallel.cp
    split = layout.split
    in_block = (layout.block >= 0) & (layout.block < layout.num_blocks)
    div = np.where(split, tp * cp, cp * (tp if sp else 1)).astype(np.float64)
    div[~in_block & ~split] = cp * (tp if sp else 1)
    param_div = np.where(split, tp, 1).astype(np.float64)

    dev = 0
    hw = gpu_model(topology)
    d0 = topology.devices[dev]
    # the matrix products' peak at the precision (fp8: the device's fp8 rate, refused on
    # GPUs without one; fp32 products run on fp32_flops inside the roofline)
    flops = float(matmul_peak_flops(topology, "fp8")[dev]) if precision == "fp8" \
        else float(d0.flops)
    fp32 = float(d0.extra.get("fp32_flops") or d0.flops)
    bw = float(d0.extra.get("memory_bandwidth") or np.inf)
    # what kernels reach of the datasheet (shardplan.cost._gpu); an explicit efficiency
    # setting replaces the matrix products' fraction
    if settings.efficiency is not None:
        flops *= settings.efficiency
    elif hw is not None:
        flops *= hw.matmul_efficiency
    if hw is not None:
        bw *= hw.memory_efficiency
    node_of = node_ids(topology) if hw is not None else None

    def collective(kind: str, group: np.ndarray, nbytes: float) -> float:
        if hw is not None and node_of is not None:
            return group_collective_seconds(topology, hw, kind, group, nbytes, node_of)
        return collective_seconds(topology, kind, group, nbytes)
    scaled, fwd, bwd = _node_times(graph, rb, act_scale, float(w_bytes), flops, fp32, bw,
                                   precision != "fp32")
    fwd, bwd = fwd.copy(), bwd.copy()
    rate: float | np.ndarray = flops
    if precision == "fp8":
        # fp8 runs only the blocks' linear layers (Transformer Engine's modules, torchtitan's
        # Float8Linear): attention and the output head stay in bf16, and every fp8 product
        # pays its casts (fp8_cast_seconds)
        half = flops / float(matmul_peak_flops(topology, "fp8")[dev]) * float(d0.flops)
        fp8_nodes = fp8_linear_nodes(graph)
        _, fwd16, bwd16 = _node_times(graph, rb, act_scale, float(w_bytes), half, fp32, bw,
                                      True)
        fwd = np.where(fp8_nodes, fwd, fwd16)
        bwd = np.where(fp8_nodes, bwd, bwd16)
        rate = np.where(fp8_nodes, flops, half)
        cast_f, cast_b = fp8_cast_seconds(graph, rb, fp8_nodes, bw, settings.microbatches)
        fwd, bwd = fwd + cast_f, bwd + cast_b
    if hw is not None and settings.efficiency is None:
        # matrix products at the waves their per-device shapes fill (shardplan.cost._gpu)
        wf, wb = _wave_factors(graph, rb, tp, cp, hw.sms)
        fwd = np.maximum(fwd, scaled.fwd_flops / rate / wf)
        bwd = np.maximum(bwd, scaled.bwd_flops / rate / wb)
    # attention that writes its s x s scores (Megatron-LM's fused softmax kernels, before
    # flash attention): the scores' traffic on top of its products (separate kernels)
    scores = _score_elements(graph, layout, scaled.output_bytes / _ACT_BYTES[precision]) \
        if attention == "materialized" else np.zeros(graph.num_nodes)
    per_elem = _ACT_BYTES[precision] / 2.0
    fwd = fwd + SCORE_BYTES_FORWARD * per_elem * scores / bw
    bwd = bwd + SCORE_BYTES_BACKWARD * per_elem * scores / bw
    # the loss over the logits, when the graph ends at them (memory-bound passes)
    logits = _logits_node(graph, layout)
    if logits >= 0:
        n_logits = scaled.output_bytes[logits] / _ACT_BYTES[precision]
        cast = LOSS_CAST_BYTES if precision != "fp32" else 0.0
        fwd[logits] += (LOSS_BYTES_FORWARD + cast) * n_logits / bw
        bwd[logits] += (LOSS_BYTES_BACKWARD + cast) * n_logits / bw
    fwd = fwd / div
    bwd = bwd / div
    # full recompute checkpoints every block, or every k-th (torchtitan's layer-selective
    # checkpointing, selective_ac_option k: the k-th, 2k-th, ... blocks of the model)
    every = settings.recompute_every
    ckpt_block = np.zeros(max(layout.num_blocks, 1), dtype=bool)
    ckpt_block[every - 1::every] = True
    ckpt_node = in_block & ckpt_block[np.clip(layout.block, 0, max(layout.num_blocks - 1, 0))]
    if recompute == "op":  # per-op checkpointing wraps every block
        ckpt_node = in_block
    if recompute == "full":
        bwd = bwd + np.where(ckpt_node, fwd, 0.0)
    elif recompute == "selective":
        bwd = bwd + np.where(layout.attention_core, fwd, 0.0)
    elif recompute == "op":
        bwd = bwd + np.where(in_block & ~_op_saved(graph), fwd, 0.0)

    out_bytes = _graph_facts(graph).kept_bytes(scaled, _ACT_BYTES[precision]) + \
        SCORE_BYTES_KEPT * per_elem * scores
    stages = stage_nodes(layout, parallel)
    s_count = parallel.num_stages
    pp = parallel.pp
    stage_of = np.empty(graph.num_nodes, dtype=np.int64)
    for j, nodes in enumerate(stages):
        stage_of[nodes] = j

    # tensor-parallel collectives: one per distinct tensor crossing a region's border
    src, dst = graph.src, graph.dst
    ebytes = scaled.edge_bytes.astype(np.float64) / cp
    region = np.where(layout.vocab, -2, layout.region)  # the vocabulary nodes: one region
    r_src, r_dst = region[src], region[dst]
    tp_f = np.zeros(s_count)
    tp_b = np.zeros(s_count)
    exposed_f = np.zeros(s_count)
    exposed_b = np.zeros(s_count)
    tp_group, dp_group = _groups(parallel, 0)
    if tp > 1:
        crossing_out = (r_src != -1) & (r_dst != r_src)  # a region's output leaves it
        crossing_in = (r_dst != -1) & (r_src != r_dst)  # a region's input enters it
        region_compute: dict[tuple[int, int], tuple[float, float]] = {}
        region_ckpt: dict[int, bool] = {}
        for reg in np.unique(region[region != -1]):
            nodes = np.flatnonzero(region == reg)
            region_ckpt[int(reg)] = bool(ckpt_node[nodes].any())
            for j in np.unique(stage_of[nodes]):
                mine = nodes[stage_of[nodes] == j]
                region_compute[(int(reg), int(j))] = (float(fwd[mine].sum()),
                                                      float(bwd[mine].sum()))
        per_region: dict[tuple[int, int], list[float]] = {}
        ar_cache: dict[float, float] = {}

        def charge(edges: np.ndarray, reg_of: np.ndarray, stage_end: np.ndarray,
                   slot: int) -> None:
            seen: set[tuple[int, int]] = set()
            for e in edges:
                s_node = int(src[e])
                key = (int(reg_of[e]), s_node)
                if key in seen:
                    continue
                seen.add(key)
                nbytes = float(ebytes[e])
                if nbytes not in ar_cache:  # every block's all-reduces have one size
                    ar_cache[nbytes] = collective("allreduce", tp_group, nbytes)
                t = ar_cache[nbytes]
                j = int(stage_of[stage_end[e]])
                per_region.setdefault((int(reg_of[e]), j), [0.0, 0.0])[slot] += t

        charge(np.flatnonzero(crossing_out), r_src, src, 0)
        charge(np.flatnonzero(crossing_in), r_dst, dst, 1)
        for (reg, j), (cf, cb) in per_region.items():
            if recompute == "full" and reg != -2 and region_ckpt[reg]:
                cb += cf
            tp_f[j] += cf
            tp_b[j] += cb
            comp_f, comp_b = region_compute.get((reg, j), (0.0, 0.0))
            if overlap_tp:
                exposed_f[j] += max(0.0, cf - comp_f)
                exposed_b[j] += max(0.0, cb - comp_b)
            else:
                exposed_f[j] += cf
                exposed_b[j] += cb

    forward = np.array([fwd[nodes].sum() for nodes in stages]) + exposed_f
    backward = np.array([bwd[nodes].sum() for nodes in stages]) + exposed_b

    # pipeline messages: activations crossing from stage j to j + 1 (deduplicated by source),
    # split over the tensor-parallel ranks (Megatron's scatter-gather of pipeline tensors);
    # DeepSpeed's pipeline engine sends the whole tensor from every tensor-parallel rank
    deepspeed_pipe = settings.stack == "megatron-deepspeed"
    split_send = 1 if deepspeed_pipe else tp
    send = np.zeros(s_count)
    cut = stage_of[src] != stage_of[dst]
    seen_src: set[int] = set()
    for e in np.flatnonzero(cut):
        if int(src[e]) in seen_src:
            continue
        seen_src.add(int(src[e]))
        send[stage_of[src[e]]] += ebytes[e] / split_send
    send_s = np.zeros(s_count)
    for j in range(s_count - 1):
        a = _rank_devices(parallel, j % pp)[0]
        b = _rank_devices(parallel, (j + 1) % pp)[0]
        send_s[j] = p2p_seconds(topology, hw, int(a), int(b), float(send[j]))
    if deepspeed_pipe:
        # its SendActivation / SendGrad instructions block the sender until the receiver
        # has the tensor (deepspeed/runtime/pipe/engine.py over p2p.send / p2p.recv): a
        # stage's forward ends when its output is sent, its backward when its input's
        # gradient is
        crosses = np.array([(j + 1) % pp != j % pp for j in range(s_count - 1)] + [False])
        forward = forward + np.where(crosses, send_s, 0.0)
        backward = backward + np.concatenate([[0.0], np.where(crosses[:-1], send_s[:-1],
                                                               0.0)])

    # data parallelism: gradients of each virtual stage, per device
    p_dev = np.array([(n_params[nodes] / param_div[nodes]).sum() for nodes in stages])
    # a tied output head under a pipeline: the last stage holds its own copy of the word
    # embedding, whose gradient the first and last stage all-reduce before the step
    # (Megatron's embedding group, _allreduce_word_embedding_grads; DeepSpeed's
    # ReduceTiedGrads)
    tied = _tied_embedding_params(graph, layout) / tp if pp > 1 else 0.0
    p_dev[-1] += tied
    grad_bytes = p_dev * g_bytes
    d = parallel.data_parallel * parallel.cp  # the gradient group (_groups)
    gs = settings.gradient_sync
    fsdp = parallel.dp_shard > 1 or gs == "sharded"
    zero1 = gs == "zero1"
    kind = "reducescatter" if (fsdp or zero1) else "allreduce"
    sync = np.array([collective(kind, dp_group, float(b)) if d > 1 else 0.0
                     for b in grad_bytes])
    if tied:
        ends = np.array([_rank_devices(parallel, 0)[0], _rank_devices(parallel, pp - 1)[0]])
        tie = collective("allreduce", ends, float(tied * g_bytes))
        sync[0] += tie
        sync[-1] += tie
    gather = np.zeros(s_count)
    module_unit = fsdp and settings.shard_unit == "module"
    units = np.array([_gather_units(layout, nodes, n_params, module_unit) for nodes in stages],
                     dtype=np.float64)
    if (fsdp or zero1) and d > 1:
        if module_unit:
            # DeepSpeed ZeRO-3: one all-gather per parameterized module, each its latency
            gather = np.array([sum(collective("allgather", dp_group,
                                              float(n_params[v] / param_div[v] * w_bytes))
                                   for v in nodes[n_params[nodes] > 0]) for nodes in stages])
        else:
            gather = np.array([collective("allgather", dp_group, float(p * w_bytes))
                               for p in p_dev])
    if fsdp and d > 1 and not module_unit:
        # torch FSDP2's copies on the compute stream: each gather's copy-out of the block
        # from the flat all-gather buffer (its bytes read and written), forward and
        # backward, and the gradients' copy-in to the reduce-scatter buffer, once
        copy_out = FSDP_COPY_OUT * w_bytes * p_dev / bw
        copy_in = (w_bytes + g_bytes) * p_dev / bw
        forward = forward + copy_out
        backward = backward + copy_out + copy_in / settings.microbatches

    # optimizer step per pipeline rank, over its (sharded) parameters
    rank_params = np.zeros(pp)
    for j in range(s_count):
        rank_params[j % pp] += p_dev[j]
    opt_share = d if (fsdp or zero1) else 1
    opt = np.asarray(optimizer_seconds(rank_params / opt_share * 4.0, settings.optimizer,
                                       fp32, bw, precision, fp32_grads), dtype=np.float64)

    # memory per pipeline rank
    in_flight = _in_flight(parallel, settings)
    # the loss keeps its fp32 log-probabilities of the vocabulary-split logits (the captured
    # graph ends at the logits; a loss node, when captured, is priced as any node)
    if logits >= 0:
        out_bytes[logits] += scaled.output_bytes[logits] / _ACT_BYTES[precision] * 4.0
    act = np.array([(out_bytes[nodes] / div[nodes]).sum() for nodes in stages])
    if recompute in ("full", "op"):
        saved = _op_saved(graph) if recompute == "op" else np.zeros(graph.num_nodes, bool)
        kept = np.zeros(s_count)
        largest_block = np.zeros(s_count)
        for j, nodes in enumerate(stages):
            blocks = layout.block[nodes]
            inside = nodes[(blocks >= 0) & (blocks < layout.num_blocks)]
            outside = nodes[~np.isin(nodes, inside)]
            kept[j] = (out_bytes[outside] / div[outside]).sum()
            if inside.size:
                per_block = np.bincount(layout.block[inside],
                                        weights=out_bytes[inside] / div[inside])
                mine_ckpt = np.zeros(per_block.size, dtype=bool)
                mine_ckpt[np.unique(layout.block[inside[ckpt_node[inside]]])] = True
                nb = int(np.count_nonzero(per_block[mine_ckpt]))
                largest_block[j] = per_block[mine_ckpt].max(initial=0.0)
                # a checkpointed block keeps its input (the hidden state, split under
                # sequence parallelism); the others keep all they would without recompute
                kept[j] += nb * _block_input_bytes(scaled, layout, inside) / \
                    (cp * (tp if sp else 1)) + float(per_block[~mine_ckpt].sum())
                # per-op checkpointing also keeps the outputs its policy saves
                mine = inside[saved[inside]]
                kept[j] += float((scaled.output_bytes[mine] / div[mine]).sum())
        act_held = _held_at_rank_peak(parallel, settings, kept, in_flight) + largest_block
    elif recompute == "selective":
        # the attention cores are re-run one block at a time in the backward: every
        # micro-batch in flight keeps the rest, one block's core exists at a time
        core = np.zeros(s_count)
        one_core = np.zeros(s_count)
        for j, nodes in enumerate(stages):
            mine = nodes[layout.attention_core[nodes]]
            if mine.size:
                per = np.bincount(np.maximum(layout.block[mine], 0),
                                  weights=out_bytes[mine] / div[mine])
                core[j], one_core[j] = per.sum(), per.max()
        act_held = _held_at_rank_peak(parallel, settings, act - core, in_flight) + one_core
    else:
        act_held = _held_at_rank_peak(parallel, settings, act, in_flight)
    state = OPTIMIZER_STATE[settings.optimizer] * 4.0  # fp32 moments
    mem: dict[str, np.ndarray] = {k: np.zeros(pp) for k in
                                  ("params", "gradients", "master", "optimizer", "activations",
                                   "gathered")}
    shard = parallel.dp_shard * parallel.cp if parallel.dp_shard > 1 else (
        d if gs == "sharded" else 1)
    # torch FSDP2 under mixed precision (MixedPrecisionPolicy): the sharded parameters are the
    # fp32 ones the optimizer steps, cast to half precision as they are all-gathered, and
    # their gradients are fp32 whatever the reduce_dtype; no half-precision shard is kept
    fsdp2_mixed = shard > 1 and settings.shard_unit == "block" and master_bytes > 0
    for j in range(s_count):
        r = j % pp
        if not fsdp2_mixed:
            mem["params"][r] += p_dev[j] * w_bytes / shard
        mem["gradients"][r] += p_dev[j] * (4 if fsdp2_mixed else g_bytes) / shard
        opt_div = shard if shard > 1 else (d if zero1 else 1)
        mem["master"][r] += p_dev[j] * master_bytes / opt_div
        mem["optimizer"][r] += p_dev[j] * state / opt_div
        mem["activations"][r] += act_held[j]
    if shard > 1 and settings.shard_unit == "module":
        # DeepSpeed ZeRO-3: the running module whole, plus what its prefetch bucket fetches
        # ahead while the live parameters stay under stage3_max_live_parameters, plus one
        # gradient bucket being reduced (DeepSpeed's defaults, module docstring)
        for r in range(pp):
            largest = max(float((n_params[stages[j]] / param_div[stages[j]]).max(initial=0.0))
                          for j in range(r, s_count, pp))
            live = max(largest, min(largest + ZERO3_PREFETCH_PARAMS, ZERO3_MAX_LIVE_PARAMS))
            mem["gathered"][r] = live * w_bytes + ZERO3_REDUCE_BUCKET * g_bytes
    elif shard > 1:
        # FSDP holds the running and the prefetched block whole
        for r in range(pp):
            unit = max(_largest_block_params(layout, stages[j], n_params, param_div)
                       for j in range(r, s_count, pp))
            mem["gathered"][r] = 2.0 * unit * w_bytes
    # the model's buffers (rotary tables, ...), as captured, on every rank: each stage's
    # blocks read them
    buffers = float(graph.meta.get("buffer_bytes", 0) or 0) if isinstance(graph.meta, dict) \
        else 0.0
    mem["buffers"] = np.full(pp, buffers)
    if settings.stack == "megatron-deepspeed":
        _deepspeed_buffers(mem, rank_params, settings, d, g_bytes)
    mem["total"] = np.sum([mem[k] for k in ("params", "gradients", "master", "optimizer",
                                            "activations", "gathered", "buffers")], axis=0)
    largest = np.zeros(pp)
    for j, nodes in enumerate(stages):
        largest[j % pp] = max(largest[j % pp],
                              float((out_bytes[nodes] / div[nodes]).max(initial=0.0)))
    if hw is not None:  # a GPU: the caching allocator, the CUDA context, NCCL
        mem["reserved"] = reserved_bytes(mem["total"], largest,
                                         expandable_segments=settings.expandable_segments)
        mem["device"] = device_bytes(mem["reserved"], parallel)
    else:
        mem["reserved"] = mem["total"].copy()
        mem["device"] = mem["total"].copy()
    return LLMCosts(forward=forward, backward=backward, tp_comm_forward=tp_f,
                    tp_comm_backward=tp_b, send_bytes=send, send_seconds=send_s,
                    grad_bytes=grad_bytes, grad_sync_seconds=sync,
                    param_gather_seconds=gather, optimizer_seconds=opt, memory=mem,
                    in_flight=in_flight, microbatches=settings.microbatches,
                    replica_batch=rb, gather_units=units)


def _tied_embedding_params(graph: Graph, layout: BlockLayout) -> float:
    """Parameters of the word embedding when the output head is tied to it (the head's
    nodes hold no parameters of their own in the captured graph), else 0. O(n)."""
    params = graph.param_bytes.astype(np.float64)
    head = layout.vocab & (layout.block >= layout.num_blocks)
    embedding = layout.vocab & (layout.block < 0)
    if not head.any() or params[head].sum() > 0:
        return 0.0
    dtype_bytes = float(graph.meta.get("dtype_bytes", 4)) if isinstance(graph.meta, dict) \
        else 4.0
    return float(params[embedding].sum() / dtype_bytes)


#: DeepSpeed's ZeRO buckets, elements (``reduce_bucket_size`` and ``allgather_bucket_size``
#: default 5e8, deepspeed/runtime/zero/config.py): a flat gradient bucket is reduced at a time.
DEEPSPEED_BUCKET = 5e8


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
    g = graph.at_batch_size(batch)
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


@lru_cache(maxsize=64)
def _wave_factors(graph: Graph, batch: int, tp: int, cp: int, sms: int
                  ) -> tuple[np.ndarray, np.ndarray]:
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
    """
    g = graph.at_batch_size(batch)
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
        if layout.split[v] and tp > 1:
            if leaves[v] and not layout.vocab[v]:
                k /= tp  # row-parallel: the reduction dimension is split
            else:
                cols /= tp  # column-parallel: the outputs are split
        wf[v] = float(wave_efficiency(rows, cols, sms))
        dgrad, wgrad = float(wave_efficiency(rows, k, sms)), float(wave_efficiency(k, cols, sms))
        wb[v] = 2.0 / (1.0 / dgrad + 1.0 / wgrad)
    wf.setflags(write=False)
    wb.setflags(write=False)
    return wf, wb


@lru_cache(maxsize=64)
def _node_times(graph: Graph, batch: int, act_scale: float, w_bytes: float, flops: float,
                fp32: float, bw: float, mixed: bool) -> tuple[Graph, np.ndarray, np.ndarray]:
    """The graph at ``batch`` with its bytes at the plan's precision, and every node's
    forward and backward roofline seconds (views: none). Cached: a search prices many
    layouts of one graph at a few batches."""
    g = graph.at_batch_size(batch)
    dtype_bytes = float(graph.meta.get("dtype_bytes", 4)) if isinstance(graph.meta, dict) \
        else 4.0
    scaled = g.replace(output_bytes=np.rint(g.output_bytes * act_scale).astype(np.int64),
                       edge_bytes=np.rint(g.edge_bytes * act_scale).astype(np.int64),
                       param_bytes=np.rint(graph.param_bytes / dtype_bytes * w_bytes)
                       .astype(np.int64))
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


def _gather_units(layout: BlockLayout, nodes: np.ndarray, n_params: np.ndarray,
                  module_unit: bool) -> int:
    """How many gathers FSDP makes over a stage per pass: its parameterized modules (nodes
    with parameters) under ``module_unit``, else its blocks (at least 1)."""
    if module_unit:
        return max(1, int(np.count_nonzero(n_params[nodes] > 0)))
    blocks = layout.block[nodes]
    inside = blocks[(blocks >= 0) & (blocks < layout.num_blocks)]
    return max(1, int(np.unique(inside).size))


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

