"""What a mixture of experts adds to an LLM plan's price: expert parallelism (issue 47).

The roles come from :func:`~shardplan.cost._llm_layout.block_layout`: a block's
``moe.experts`` nodes are the routed experts' grouped GEMMs, its other ``moe`` nodes (router,
dispatch, combine) are token-wise, and ``moe.shared_experts`` is a tensor-parallel region like
a dense MLP. The expert layers have their own grid over a pipeline rank's devices
(:mod:`shardplan.ir.parallel`, Megatron-Core's parallel folding, arXiv 2504.14960):

- **Compute.** Every device routes its own tokens (Megatron-Core requires sequence
  parallelism with tensor parallelism under a mixture of experts, so a device holds
  ``1 / (tp x cp)`` of a replica's tokens) and, under balanced routing, computes as many
  token-expert products as it sends: the experts' FLOPs divide by ``tp x cp`` whatever
  ``ep`` and ``etp`` are. The captured graph counts them at capacity factor 1 (the zoo's
  default: exactly the routed tokens' products). What ``ep`` and ``etp`` change is the shape
  of each GEMM: a device runs its ``experts / ep`` local experts on ``M = ep x etp x tokens
  x top_k / experts`` tokens each, ``1 / etp`` of each expert's width, as one grouped GEMM
  (:func:`grouped_gemm_efficiency`: the tiles of every local expert in waves over the SMs,
  each expert's last row of tiles partly empty), or one GEMM per expert without
  ``moe_grouped_gemm``.
- **Load imbalance.** Routing is not balanced: under expert parallelism the device with the
  most tokens sets the pace of the layer (the combine waits for it). :data:`MOE_STRAGGLER`
  is the published measure of that wait; a capacity factor ``c`` bounds it (tokens beyond
  ``c`` times the balanced share are dropped); none under ``moe_force_balance``.
- **Dispatch and combine.** The ``alltoall`` dispatcher sends each device's ``tokens x
  top_k`` hidden vectors to the ranks of their experts and back (two all-to-alls per layer
  in the forward, two in the backward, two more under full recompute), priced on the
  topology by :func:`~shardplan.cost._gpu.nccl_terms` (``alltoall``); with ``etp > 1`` the
  tokens are also all-gathered over the expert-tensor-parallel group and the outputs
  reduce-scattered. The ``allgather`` dispatcher all-gathers every token of the ``ep x etp``
  group and reduce-scatters the outputs. None of it overlaps compute (Megatron-Core's
  default), unless ``moe_a2a_overlap`` (``--overlap-moe-expert-parallel-comm``) hides it
  under another micro-batch's computation, sub-module by sub-module as Megatron-Core's
  schedule plan orders them (:func:`exposed_expert_comm`, :func:`overlapped_layer_pair`).
- **Memory and gradients.** The experts' weights, gradients, master weights and optimizer
  state divide by ``ep x etp``; their gradients are reduced (and a distributed optimizer or
  FSDP shards them) over the ``expert_dp`` replicas, the dense parameters over the usual
  data-parallel group (:func:`~shardplan.cost._llm_comm.data_parallel`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from shardplan.cost._gpu import GEMM_TILE
from shardplan.cost._llm_layout import _ACT_BYTES, Pricing, _expert_groups
from shardplan.errors import ShardplanError
from shardplan.ir import Graph, ParallelConfig

__all__ = ["MOE_STRAGGLER", "check_experts", "expert_comm_seconds", "expert_dims",
           "expert_factors", "exposed_expert_comm", "grouped_gemm_efficiency",
           "overlapped_layer_pair", "straggler_factor"]

#: How much longer an expert-parallel MoE layer's expert computation takes than under
#: balanced routing: the device with the most tokens sets the pace. FEPLB (Liu, Zhao and Qi,
#: arXiv 2604.19654, Fig. 1b) measured on GLM-5's MoE layers (128 experts, EP 8, H100, no
#: auxiliary loss) that 18.6% of the GPU time of a MoE layer is spent waiting for the
#: slowest device: the layer runs ``1 / (1 - 0.186)`` times its balanced time. Applied to
#: the routed experts' compute under ``ep > 1`` (with ``ep == 1`` every device computes its
#: own tokens' products, whatever experts they chose).
MOE_STRAGGLER = 1.0 / (1.0 - 0.186)


def expert_dims(graph: Graph) -> dict[str, int]:
    """The mixture's dimensions from the graph's ``meta["transformer"]``: ``experts``,
    ``top_k``, ``hidden``, ``moe_ffn`` and ``seq``. Raises :class:`ShardplanError` when a
    graph with expert nodes does not say them. O(1)."""
    dims = graph.meta.get("transformer") if isinstance(graph.meta, Mapping) else None
    keys = ("experts", "top_k", "hidden", "moe_ffn", "seq")
    if not isinstance(dims, Mapping) or not all(isinstance(dims.get(k), int) for k in keys):
        raise ShardplanError(f"graph {graph.name!r} has routed experts but its meta does not "
                             f"give {', '.join(keys)} (capture a zoo MoE model)")
    return {k: int(dims[k]) for k in keys}


def check_experts(graph: Graph, parallel: ParallelConfig) -> None:
    """Refuse an expert grid the mixture cannot take: ``ep`` must divide the experts and
    ``etp`` the experts' width; expert parallelism on a dense model. O(n)."""
    from shardplan.cost._llm_layout import block_layout

    if not block_layout(graph).has_experts:
        if parallel.is_expert_parallel:
            raise ShardplanError(f"{parallel.label()}: expert parallelism needs a mixture of "
                                 f"experts; {graph.name!r} has no routed experts")
        return
    d = expert_dims(graph)
    if d["experts"] % parallel.ep:
        raise ShardplanError(f"expert parallelism {parallel.ep} does not divide the model's "
                             f"{d['experts']} experts")
    if d["moe_ffn"] % parallel.expert_tp:
        raise ShardplanError(f"expert tensor parallelism {parallel.expert_tp} does not divide "
                             f"the experts' width {d['moe_ffn']}")


def straggler_factor(pr: Pricing) -> float:
    """What the routed experts' compute is multiplied by (module docstring, "Load
    imbalance"): :data:`MOE_STRAGGLER` under ``ep > 1``, at most the capacity factor."""
    if pr.parallel.ep == 1 or pr.settings.moe_force_balance:
        return 1.0
    cf = pr.settings.moe_capacity_factor
    return MOE_STRAGGLER if cf is None else min(MOE_STRAGGLER, float(cf))


def _tokens_per_device(pr: Pricing) -> float:
    """Tokens one device routes per micro-batch: a replica's over ``tp x cp``."""
    return pr.rb * expert_dims(pr.graph)["seq"] / (pr.parallel.tp * pr.parallel.cp)


def grouped_gemm_efficiency(m: float, n: float, local: int, sms: int,
                            grouped: bool = True) -> float:
    """Achieved / peak rate of ``local`` experts' GEMMs of ``m x n`` outputs each on ``sms``
    SMs: their tiles (:data:`~shardplan.cost._gpu.GEMM_TILE`) run in waves, one grouped
    kernel for all (``grouped``) or one kernel per expert; each expert's last row and column
    of tiles are partly empty. O(1).

    Examples
    --------
    >>> grouped_gemm_efficiency(256, 128 * 132, 1, 132)  # one full wave of full tiles
    1.0
    >>> grouped_gemm_efficiency(128, 128 * 132, 1, 132)  # half of every tile empty
    0.5
    """
    tm, tn = GEMM_TILE
    tiles = np.ceil(max(m, 1.0) / tm) * np.ceil(max(n, 1.0) / tn)
    waves = np.ceil(local * tiles / sms) if grouped else local * np.ceil(tiles / sms)
    return float(local * m * n / (waves * sms * tm * tn))


def expert_factors(pr: Pricing, wf: np.ndarray, wb: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The forward and backward efficiency of every node (``wf``, ``wb`` from the dense
    wave model) with the routed experts' products replaced by their grouped GEMMs' on one
    device (module docstring, "Compute"). O(n)."""
    layout, graph, par = pr.layout, pr.graph, pr.parallel
    if not layout.has_experts or pr.hw is None:
        return wf, wb
    d = expert_dims(graph)
    local = d["experts"] // par.ep
    m = par.ep * par.expert_tp * _tokens_per_device(pr) * d["top_k"] / d["experts"]
    grouped = pr.settings.moe_grouped_gemm
    wf, wb = wf.copy(), wb.copy()
    for v in np.flatnonzero(layout.expert & (graph.param_bytes > 0) & (graph.fwd_flops > 0)):
        # the product's weights are (experts, K, N): N = the hidden size for the down
        # projection (its K, the experts' width, splits over etp), else the experts' width
        # the down projection's output is hidden-wide: its FLOPs per output element are
        # 2 x moe_ffn (the graph's bytes at its captured dtype)
        down = round(float(graph.fwd_flops[v]) * pr.dtype_bytes
                     / (2.0 * max(float(graph.output_bytes[v]), 1.0))) == d["moe_ffn"]
        k = float(d["moe_ffn"] / par.expert_tp if down else d["hidden"])
        n = float(d["hidden"] if down else d["moe_ffn"] / par.expert_tp)
        sms = pr.hw.sms
        wf[v] = grouped_gemm_efficiency(m, n, local, sms, grouped)
        dgrad = grouped_gemm_efficiency(m, k, local, sms, grouped)
        wgrad = grouped_gemm_efficiency(k, n, local, sms, grouped)
        wb[v] = 2.0 / (1.0 / dgrad + 1.0 / wgrad)
    return wf, wb


def moe_layers(pr: Pricing) -> np.ndarray:
    """Mixture-of-experts layers of every virtual stage. O(n)."""
    layout = pr.layout
    return np.array([np.unique(layout.block[nodes[layout.expert[nodes]]]).size
                     for nodes in pr.stages], dtype=np.float64)


def expert_comm_seconds(pr: Pricing) -> tuple[np.ndarray, np.ndarray]:
    """Each virtual stage's dispatch and combine seconds per micro-batch on one device, in
    the forward and in the backward (module docstring, "Dispatch and combine"); zeros for a
    dense model or one expert-parallel rank without expert tensor parallelism.
    O(n + pp vp + R)."""
    par, st = pr.parallel, pr.settings
    zero = np.zeros(par.num_stages)
    if not pr.layout.has_experts or par.ep * par.expert_tp == 1:
        return zero, zero
    d = expert_dims(pr.graph)
    vector = d["hidden"] * _ACT_BYTES[st.precision]
    tokens = _tokens_per_device(pr)
    etp_group, ep_group, _ = _expert_groups(par, 0)
    if st.moe_dispatcher == "allgather":
        group = np.concatenate([ep_group + i for i in range(par.expert_tp)])
        whole = tokens * vector * group.size
        layer = pr.collective("allgather", group, whole) + \
            pr.collective("reducescatter", group, whole)
    else:
        copies = tokens * d["top_k"] * vector
        layer = 2.0 * pr.collective("alltoall", ep_group, copies)
        if par.expert_tp > 1:
            whole = copies * par.expert_tp
            layer += pr.collective("allgather", etp_group, whole) + \
                pr.collective("reducescatter", etp_group, whole)
    layers = moe_layers(pr)
    forward = layers * layer
    backward = layers * layer * (2.0 if st.recompute == "full" else 1.0)
    return forward, backward


def exposed_expert_comm(pr: Pricing, comm_f: np.ndarray, comm_b: np.ndarray,
                        compute_f: np.ndarray, compute_b: np.ndarray,
                        experts_f: np.ndarray, experts_b: np.ndarray,
                        ) -> tuple[np.ndarray, np.ndarray]:
    """What of the dispatch and combine stays exposed per micro-batch: all of it, or under
    ``moe_a2a_overlap`` what the pair of a forward and a backward (the pair Megatron-Core's
    1F1B overlap interleaves) takes beyond their computation, layer by layer
    (:func:`overlapped_layer_pair`), shared between the two passes as their communication
    is. ``experts_f`` / ``experts_b``: the routed experts' share of the computation. A
    stage's layers are alike, and the pair's time scales with its inputs, so a stage of
    ``L`` layers takes ``L`` times one layer's pair: the pair of its totals. O(pp vp)."""
    if not pr.settings.moe_a2a_overlap:
        return comm_f, comm_b
    pair = overlapped_layer_pair(compute_f - experts_f, compute_b - experts_b, experts_f,
                                 experts_b, comm_f / 2.0, comm_b / 2.0)
    total = comm_f + comm_b
    exposed = np.maximum(0.0, pair - (compute_f + compute_b))
    share = np.divide(exposed, total, out=np.zeros_like(total), where=total > 0)
    return comm_f * share, comm_b * share


def overlapped_layer_pair(attn_f: np.ndarray, attn_b: np.ndarray, mlp_f: np.ndarray,
                          mlp_b: np.ndarray, a2a_f: np.ndarray, a2a_b: np.ndarray
                          ) -> np.ndarray:
    """Seconds of one layer's forward of a micro-batch beside another's backward under
    Megatron-Core's expert-parallel overlap (``TransformerLayerSchedulePlan.run``, Megatron-
    Core 0.14+): two streams, each in program order, each operation after the one whose
    output it reads::

        comm: combine_bwd | dispatch_fwd -> dispatch_bwd     | combine_fwd
        comp: attn_fwd    | mlp_bwd (with dw) -> mlp_fwd      | attn_bwd

    ``attn_*``: what precedes the dispatch (attention, norms, router), ``mlp_*``: the
    experts, ``a2a_*``: one dispatch or combine (they move the same bytes). Without
    communication the sum of the computation; a communication as long as the computation
    beside it is hidden only where the dependencies allow. Positively homogeneous: ``k``
    layers alike take ``k`` times one. Elementwise, O(len)."""
    cb_end = a2a_b                                  # combine_bwd on the comm stream
    af_end = attn_f                                 # attn_fwd on the compute stream
    mb_end = np.maximum(af_end, cb_end) + mlp_b     # needs the combined gradient
    df_end = np.maximum(cb_end, af_end) + a2a_f     # needs attn_fwd's tokens
    db_end = np.maximum(mb_end, df_end) + a2a_b     # needs mlp_bwd's gradient
    mf_end = np.maximum(mb_end, df_end) + mlp_f     # needs the dispatched tokens
    cf_end = np.maximum(mf_end, db_end) + a2a_f     # needs mlp_fwd's output
    ab_end = np.maximum(mf_end, db_end) + attn_b    # needs the dispatched gradient
    return np.asarray(np.maximum(cf_end, ab_end))


def expert_params(pr: Pricing) -> np.ndarray:
    """The routed experts' parameters per device of every virtual stage (divided by
    ``ep x etp``). O(n)."""
    layout = pr.layout
    per = pr.n_params / pr.param_div
    return np.array([per[nodes[layout.expert[nodes]]].sum() for nodes in pr.stages])


def expert_shard(parallel: ParallelConfig, shard: int) -> int:
    """What the experts' state is sharded over when the dense state is sharded over
    ``shard`` of the ``dp x dp_shard x cp`` gradient ranks: the same fraction of the
    ``expert_dp`` replicas (torchtitan shards experts over ``dp_shard / ep``; Megatron-Core's
    distributed optimizer over the expert data-parallel group). O(1)."""
    if shard <= 1:
        return 1
    return max(1, shard * parallel.expert_dp // (parallel.data_parallel * parallel.cp))
