"""Communication of an LLM plan: tensor-parallel collectives per region, the pipeline's
messages, data parallelism's gradient reduction and parameter gathers, and FSDP's copies.

The "Tensor-parallel communication" part of :mod:`shardplan.cost._llm`'s module docstring;
collectives are priced by :func:`Pricing.collective` (NCCL's rule on GPUs,
``docs/gpu-model.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardplan.cost._gpu import p2p_seconds
from shardplan.cost._llm_layout import (
    BlockLayout,
    Pricing,
    _expert_groups,
    _groups,
    _rank_devices,
    _tied_embedding_params,
)
from shardplan.cost._llm_moe import expert_params

__all__ = ["FSDP_COPY_OUT", "DataParallel", "data_parallel", "pipeline_messages",
           "tensor_parallel_seconds"]

#: torch FSDP2 (``fully_shard``, the FSDP of torchtitan and of shardplan's runtime) copies
#: every all-gathered block out of its flat buffer into the parameters
#: (``split_with_sizes_copy`` in ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``:
#: each byte read and written, this many times the parameter bytes per gather) and the
#: gradients into the reduce-scatter buffer (``chunk_cat``: read at the parameters' precision,
#: written at the gradients'), on the compute stream.
FSDP_COPY_OUT = 2.0


def tensor_parallel_seconds(pr: Pricing, fwd: np.ndarray, bwd: np.ndarray,
                            ckpt_node: np.ndarray, edge_bytes: np.ndarray
                            ) -> tuple[np.ndarray, ...]:
    """Per virtual stage: the tensor-parallel collectives of one micro-batch's forward and
    backward, and what of them is exposed (all of it, or with ``tp_comm_overlap`` what
    exceeds its region's compute). One all-reduce per distinct tensor crossing a region's
    border; full recompute repeats a checkpointed region's forward ones in the backward.
    ``edge_bytes`` are the graph's edges at the plan's precision, divided by ``cp``.
    O(m + regions x stages)."""
    par, layout, graph = pr.parallel, pr.layout, pr.graph
    s_count = par.num_stages
    tp_f, tp_b = np.zeros(s_count), np.zeros(s_count)
    exposed_f, exposed_b = np.zeros(s_count), np.zeros(s_count)
    if par.tp == 1:
        return tp_f, tp_b, exposed_f, exposed_b
    tp_group, _ = _groups(par, 0)
    src, dst, stage_of = graph.src, graph.dst, pr.stage_of
    region = np.where(layout.vocab, -2, layout.region)  # the vocabulary nodes: one region
    r_src, r_dst = region[src], region[dst]
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
            key = (int(reg_of[e]), int(src[e]))
            if key in seen:
                continue
            seen.add(key)
            nbytes = float(edge_bytes[e])
            if nbytes not in ar_cache:  # every block's all-reduces have one size
                ar_cache[nbytes] = pr.collective("allreduce", tp_group, nbytes)
            j = int(stage_of[stage_end[e]])
            per_region.setdefault((int(reg_of[e]), j), [0.0, 0.0])[slot] += ar_cache[nbytes]

    charge(np.flatnonzero(crossing_out), r_src, src, 0)
    charge(np.flatnonzero(crossing_in), r_dst, dst, 1)
    for (reg, j), (cf, cb) in per_region.items():
        if pr.settings.recompute == "full" and reg != -2 and region_ckpt[reg]:
            cb += cf
        tp_f[j] += cf
        tp_b[j] += cb
        comp_f, comp_b = region_compute.get((reg, j), (0.0, 0.0))
        if pr.settings.tp_comm_overlap:
            exposed_f[j] += _overlapped(cf, comp_f, par.tp)
            exposed_b[j] += _overlapped(cb, comp_b, par.tp)
        else:
            exposed_f[j] += cf
            exposed_b[j] += cb
    return tp_f, tp_b, exposed_f, exposed_b


def _overlapped(comm: float, compute: float, tp: int) -> float:
    """What stays exposed of a region's tensor-parallel collectives overlapped with its
    products (``--tp-comm-overlap``): Transformer Engine's userbuffers overlap splits the
    collective and its product into ``tp`` chunks and pipelines them (each chunk's exchange
    under the previous chunk's product, ``transformer_engine/pytorch/module/base.py``'s
    ring-exchange and pipelined overlaps), so the first chunk's exchange waits, and the rest
    hides behind the compute that is left. O(1)."""
    first = comm / tp
    return first + max(0.0, comm - first - compute)


def pipeline_messages(pr: Pricing, edge_bytes: np.ndarray, forward: np.ndarray,
                      backward: np.ndarray) -> tuple[np.ndarray, ...]:
    """Activations crossing from virtual stage j to j + 1 per device (deduplicated by
    source), split over the tensor-parallel ranks (Megatron's scatter-gather of pipeline
    tensors; DeepSpeed's pipeline engine partitions them the same way, ``pipe_partitioned``
    and ``grad_partitioned`` on by default); the seconds each takes; and, under DeepSpeed's
    pipeline engine, the stages' forward and backward with its blocking sends and the
    all-gather over the tensor-parallel ranks that rebuilds each received tensor
    (``PartitionedTensor.full``) in them. O(m + pp vp)."""
    par, graph, stage_of = pr.parallel, pr.graph, pr.stage_of
    s_count, pp = par.num_stages, par.pp
    deepspeed_pipe = pr.settings.stack == "megatron-deepspeed"
    send = np.zeros(s_count)
    src, dst = graph.src, graph.dst
    seen_src: set[int] = set()
    for e in np.flatnonzero(stage_of[src] != stage_of[dst]):
        if int(src[e]) in seen_src:
            continue
        seen_src.add(int(src[e]))
        send[stage_of[src[e]]] += edge_bytes[e] / par.tp
    send_s = np.zeros(s_count)
    for j in range(s_count - 1):
        a = _rank_devices(par, j % pp)[0]
        b = _rank_devices(par, (j + 1) % pp)[0]
        send_s[j] = p2p_seconds(pr.topology, pr.hw, int(a), int(b), float(send[j]))
    if deepspeed_pipe:
        # its SendActivation / SendGrad instructions block the sender until the receiver
        # has the tensor (deepspeed/runtime/pipe/engine.py over p2p.send / p2p.recv): a
        # stage's forward ends when its output is sent, its backward when its input's
        # gradient is; the receiver then all-gathers the partitions over its TP ranks
        crosses = np.array([(j + 1) % pp != j % pp for j in range(s_count - 1)] + [False])
        tp_group, _ = _groups(par, 0)
        rebuild = np.array([pr.collective("allgather", tp_group, float(b * par.tp))
                            if par.tp > 1 and b > 0 else 0.0 for b in send])
        forward = forward + np.where(crosses, send_s, 0.0) + np.concatenate(
            [[0.0], np.where(crosses[:-1], rebuild[:-1], 0.0)])
        backward = backward + np.concatenate([[0.0], np.where(crosses[:-1], send_s[:-1],
                                                               0.0)]) + \
            np.where(crosses, rebuild, 0.0)
    return send, send_s, forward, backward


@dataclass(frozen=True)
class DataParallel:
    """Data parallelism of one layout, per virtual stage (see :class:`LLMCosts`)."""

    params: np.ndarray
    grad_bytes: np.ndarray
    sync: np.ndarray
    gather: np.ndarray
    units: np.ndarray
    copy_forward: np.ndarray
    copy_backward: np.ndarray
    expert_params: np.ndarray


def data_parallel(pr: Pricing) -> DataParallel:
    """Each virtual stage's parameters per device (with a tied head's copy on the last
    stage under a pipeline), gradient bytes, gradient reduction over the data- and
    context-parallel ranks (all-reduce; reduce-scatter under ZeRO-1 and FSDP; plus the tied
    embedding's all-reduce between the first and last stage), ZeRO-1's and FSDP's parameter
    all-gathers, and FSDP2's copies on the compute stream. O(n + pp vp)."""
    par, st, layout = pr.parallel, pr.settings, pr.layout
    n_params, param_div = pr.n_params, pr.param_div
    p_dev = np.array([(n_params[nodes] / param_div[nodes]).sum() for nodes in pr.stages])
    # a tied output head under a pipeline: the last stage holds its own copy of the word
    # embedding, whose gradient the first and last stage all-reduce before the step
    # (Megatron's embedding group, _allreduce_word_embedding_grads; DeepSpeed's
    # ReduceTiedGrads)
    tied = _tied_embedding_params(pr.graph, layout) / par.tp if par.pp > 1 else 0.0
    p_dev[-1] += tied
    grad_bytes = p_dev * pr.g_bytes
    _, dp_group = _groups(par, 0)
    d = pr.gradient_group
    fsdp = par.dp_shard > 1 or st.gradient_sync == "sharded"
    zero1 = st.gradient_sync == "zero1"
    kind = "reducescatter" if (fsdp or zero1) else "allreduce"
    # a mixture's routed experts reduce over their own replicas (shardplan.cost._llm_moe)
    e_dev = expert_params(pr) if layout.has_experts else np.zeros(par.num_stages)
    _, _, edp_group = _expert_groups(par, 0)
    sync = np.array([(pr.collective(kind, dp_group, float((p - e) * pr.g_bytes))
                      if d > 1 else 0.0) +
                     pr.collective(kind, edp_group, float(e * pr.g_bytes))
                     for p, e in zip(p_dev, e_dev, strict=True)])
    if tied:
        ends = np.array([_rank_devices(par, 0)[0], _rank_devices(par, par.pp - 1)[0]])
        tie = pr.collective("allreduce", ends, float(tied * pr.g_bytes))
        sync[0] += tie
        sync[-1] += tie
    gather = np.zeros(par.num_stages)
    module_unit = fsdp and st.shard_unit == "module"
    units = np.array([_gather_units(layout, nodes, n_params, module_unit)
                      for nodes in pr.stages], dtype=np.float64)
    if (fsdp or zero1) and d > 1:
        if module_unit:
            # DeepSpeed ZeRO-3: one all-gather per parameterized module, each its latency
            gather = np.array([sum(pr.collective("allgather", dp_group,
                                                 float(n_params[v] / param_div[v] * pr.w_bytes))
                                   for v in nodes[n_params[nodes] > 0]) for nodes in pr.stages])
        else:
            gather = np.array([pr.collective("allgather", dp_group, float((p - e) * pr.w_bytes))
                               + pr.collective("allgather", edp_group, float(e * pr.w_bytes))
                               for p, e in zip(p_dev, e_dev, strict=True)])
    copy_f = np.zeros(par.num_stages)
    copy_b = np.zeros(par.num_stages)
    if fsdp and d > 1 and not module_unit:
        # torch FSDP2's copies on the compute stream: each gather's copy-out of the block
        # from the flat all-gather buffer (its bytes read and written), forward and
        # backward, and the gradients' copy-in to the reduce-scatter buffer, once
        copy_f = FSDP_COPY_OUT * pr.w_bytes * p_dev / pr.bw
        copy_b = copy_f + (pr.w_bytes + pr.g_bytes) * p_dev / pr.bw / st.microbatches
    return DataParallel(params=p_dev, grad_bytes=grad_bytes, sync=sync, gather=gather,
                        units=units, copy_forward=copy_f, copy_backward=copy_b,
                        expert_params=e_dev)


def _gather_units(layout: BlockLayout, nodes: np.ndarray, n_params: np.ndarray,
                  module_unit: bool) -> int:
    """How many gathers FSDP makes over a stage per pass: its parameterized modules (nodes
    with parameters) under ``module_unit``, else its blocks (at least 1)."""
    if module_unit:
        return max(1, int(np.count_nonzero(n_params[nodes] > 0)))
    blocks = layout.block[nodes]
    inside = blocks[(blocks >= 0) & (blocks < layout.num_blocks)]
    return max(1, int(np.unique(inside).size))
