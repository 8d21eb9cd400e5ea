"""Where a transformer's nodes sit in an LLM plan, and what every pricing step reads.

The roles of :mod:`shardplan.cost._llm`'s module docstring ("Which nodes split"): every node's
transformer block, tensor-parallel region and vocabulary split (:func:`block_layout`), the
virtual stages' nodes (:func:`stage_nodes`), the devices of a pipeline rank and its groups,
the bytes per parameter at a precision, and :class:`Pricing`, the facts of one layout that
the compute, communication and memory steps of :func:`~shardplan.cost.llm_costs` share.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from shardplan.cost._gpu import GPUModel
from shardplan.errors import ShardplanError
from shardplan.ir import ExecutionSettings, Graph, ParallelConfig, Topology

__all__ = ["TP_REGIONS", "VOCAB_MODULES", "BlockLayout", "Pricing", "block_layout",
           "precision_bytes", "stage_nodes"]

#: Sub-modules of a block whose nodes are split over the tensor-parallel group.
TP_REGIONS = ("attention", "self_attention", "attn", "feed_forward", "mlp")


#: The sub-module of a block that holds a mixture of experts (the zoo's ``layers.N.moe``,
#: torchtitan's and Megatron-Core's name), and its always-on experts, which split over the
#: tensor-parallel group as a dense MLP does.
MOE_MODULE = "moe"


MOE_SHARED = "shared_experts"


#: The routed experts' module under :data:`MOE_MODULE` (their grouped GEMMs).
MOE_EXPERTS = "experts"


#: Top-level modules split by the vocabulary (the embedding and the output head).
VOCAB_MODULES = ("tok_embeddings", "output", "lm_head", "wte", "word_embeddings")


_LOSS_OPS = re.compile(r"cross_entropy|nll_loss|log_softmax")


_ATTENTION_CORE = re.compile(r"scaled_dot_product|attention|flash|softmax|dropout")


_BLOCK = re.compile(r"(?:^|\.)(?:layers|h|layer|blocks)\.(\d+)(?:\.|$)")


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
    moe : ndarray of bool, shape (n,)
        Nodes of a mixture of experts other than its shared experts (the router, the
        dispatch, the routed experts, the combine): token-wise, split over ``tp x cp``.
    expert : ndarray of bool, shape (n,)
        The routed experts' nodes (their weights split over ``ep x etp``).
    """

    block: np.ndarray
    num_blocks: int
    region: np.ndarray
    vocab: np.ndarray
    attention_core: np.ndarray
    moe: np.ndarray
    expert: np.ndarray

    @property
    def has_experts(self) -> bool:
        """Whether the graph has routed experts (a mixture of experts)."""
        return bool(self.expert.any())

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
    moe = np.zeros(n, dtype=bool)
    expert = np.zeros(n, dtype=bool)
    for v, (mod, op) in enumerate(zip(graph.modules, graph.ops, strict=True)):
        m = _BLOCK.search(mod or "")
        if m is not None:
            block[v] = int(m.group(1))
            rest = (mod[m.end():] if m.end() < len(mod) else "").split(".")
            if rest[0] == MOE_MODULE and len(rest) > 1 and rest[1] == MOE_SHARED:
                key = mod[:m.end()] + "." + ".".join(rest[:2])
                region[v] = region_key.setdefault(key, len(region_key))
            elif rest[0] == MOE_MODULE:
                moe[v] = True
                expert[v] = len(rest) > 1 and rest[1] == MOE_EXPERTS
            elif rest and rest[0] in TP_REGIONS:
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
                       attention_core=core, moe=moe, expert=expert)


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


#: Module names of a block's norms (the zoo's, Megatron-Core's, GPT-2's).
_NORMS = frozenset({"attention_norm", "ffn_norm", "input_layernorm", "pre_mlp_layernorm",
                    "ln_1", "ln_2"})


def recompute_mask(graph: Graph, modules: tuple[str, ...]) -> np.ndarray:
    """The nodes ``selective`` recompute re-runs for Megatron-Core's ``--recompute-modules``
    (:data:`~shardplan.ir.settings.RECOMPUTE_MODULES`): ``core_attn`` the attention core
    (:attr:`BlockLayout.attention_core`), ``mla_up_proj`` MLA's query and key-value
    up-projections (``attention.wq_b``, ``attention.wkv_b``), ``mlp`` a dense block's MLP,
    ``moe`` the whole mixture of experts, ``moe_act`` the routed experts' activation (their
    nodes but the products), ``layernorm`` the block's norms, ``shared_experts`` the
    always-on experts. O(n)."""
    return _recompute_cached(graph, tuple(sorted(modules)))


@lru_cache(maxsize=32)
def _recompute_cached(graph: Graph, modules: tuple[str, ...]) -> np.ndarray:
    from shardplan.cost._compute import is_matmul

    layout = block_layout(graph)
    out = np.zeros(graph.num_nodes, dtype=bool)
    if "core_attn" in modules:
        out |= layout.attention_core
    for v, mod in enumerate(graph.modules):
        m = _BLOCK.search(mod or "")
        if m is None:
            continue
        rest = mod[m.end():].split(".") if m.end() < len(mod) else [""]
        head, sub = rest[0], (rest[1] if len(rest) > 1 else "")
        out[v] |= (("mla_up_proj" in modules and head in ("attention", "self_attention")
                    and sub in ("wq_b", "wkv_b"))
                   or ("mlp" in modules and head in ("feed_forward", "mlp"))
                   or ("moe" in modules and head == MOE_MODULE)
                   or ("shared_experts" in modules and head == MOE_MODULE
                       and sub == MOE_SHARED)
                   or ("layernorm" in modules and head in _NORMS)
                   or ("moe_act" in modules and bool(layout.expert[v])
                       and not is_matmul(graph.ops[v])))
    out.setflags(write=False)
    return out


def _expert_groups(parallel: ParallelConfig, pp_rank: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An expert-tensor-parallel group, an expert-parallel group and an expert
    data-parallel group of a pipeline rank (device ids; :mod:`shardplan.ir.parallel`'s
    folding: etp fastest, then ep, then the expert replica)."""
    base = pp_rank * parallel.devices_per_rank
    etp, ep = parallel.expert_tp, parallel.ep
    return (base + np.arange(etp), base + etp * np.arange(ep),
            base + etp * ep * np.arange(parallel.expert_dp))


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


def keeps_gathered(settings: ExecutionSettings, parallel: ParallelConfig) -> bool:
    """Whether FSDP keeps each stage's parameters gathered across micro-batches: torchtitan
    under a pipeline (its ``apply_fsdp`` turns ``reshard_after_forward`` off when pipeline
    parallelism is on)."""
    return settings.stack == "torchtitan" and parallel.pp > 1 and (
        parallel.dp_shard > 1 or settings.gradient_sync == "sharded")

@dataclass(frozen=True, eq=False)
class Pricing:
    """What the steps of :func:`~shardplan.cost.llm_costs` share about one layout (built
    once per call; ``eq=False``: compared by identity, never hashed by value).

    Attributes
    ----------
    graph, topology, parallel, settings
        The call's arguments.
    layout : BlockLayout
    stages : list of ndarray
        The nodes of every virtual stage (:func:`stage_nodes`); ``stage_of`` the inverse.
    div, param_div : ndarray
        Per node, what its activations and its parameters are divided by on one device.
    n_params : ndarray
        Parameters of every node (elements).
    dtype_bytes : float
        Bytes per element the graph was captured at (its ``meta``'s ``dtype_bytes``, else 4).
    rb : int
        Sequences per micro-batch of one data-parallel replica.
    w_bytes, g_bytes, master_bytes : int
        Bytes per parameter, gradient (4 under ``grad_reduce`` ``fp32``) and master copy.
    hw : GPUModel or None
        The GPU model (None off GPUs).
    flops, fp32, bw : float
        Matrix-product rate at the precision, fp32 rate and HBM bandwidth, as reached.
    collective : callable
        ``(kind, device ids, bytes) -> seconds`` on this topology.
    """

    graph: Graph
    topology: Topology
    parallel: ParallelConfig
    settings: ExecutionSettings
    layout: BlockLayout
    stages: list[np.ndarray]
    stage_of: np.ndarray
    div: np.ndarray
    param_div: np.ndarray
    n_params: np.ndarray
    dtype_bytes: float
    in_block: np.ndarray
    rb: int
    w_bytes: int
    g_bytes: int
    master_bytes: int
    hw: GPUModel | None
    flops: float
    fp32: float
    bw: float
    collective: Callable[[str, np.ndarray, float], float]

    @property
    def sp(self) -> bool:
        """Sequence parallelism in force (it needs tensor parallelism)."""
        return self.settings.sequence_parallel and self.parallel.tp > 1

    @property
    def gradient_group(self) -> int:
        """Ranks a gradient is reduced over: data parallel times context parallel."""
        return self.parallel.data_parallel * self.parallel.cp
