"""How a plan is executed: the settings every command after the planner reads from the plan.

One :class:`ExecutionSettings` travels in every plan file (its ``execution`` field): the
command that makes a plan writes the settings it planned with, and ``map``, ``cost``,
``simulate``, ``report``, ``train``, ``export`` read them from the plan. A flag given to a
later command overrides the plan's value and says so in one line (:meth:`override`). A plan
written before the field existed loads with the defaults below (and the few settings older
plans kept in ``options``).

Batch vocabulary (one meaning everywhere):

- ``microbatch_size``: samples in one micro-batch as the pipeline sees it. The R replicas of
  a stage share it, each running ``microbatch_size / R`` samples (Parmesan section 4.1,
  equation 3's division by the replica count). ``None`` means the graph's ``batch_size``:
  a graph's node costs are per micro-batch at the batch it was captured at (the contract),
  and the cost model scales them linearly when ``microbatch_size`` differs
  (:meth:`shardplan.ir.Graph.at_batch_size`).
- ``microbatches``: micro-batches per iteration (one optimizer step).
- ``global_batch = microbatch_size * microbatches``: samples per iteration.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np

from shardplan.errors import InvalidFileError, ShardplanError

__all__ = ["ATTENTION_KERNELS", "DDP_BUCKET_BYTES", "GRADIENT_SYNCS", "GRAD_REDUCES",
           "LEGACY_SETTING_KEYS",
           "OPTIMIZERS", "PRECISIONS", "RECOMPUTES", "SCHEDULES", "SHARD_UNITS", "STACKS",
           "ExecutionSettings"]

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
ATTENTION_KERNELS = ("flash", "materialized")
OPTIMIZERS = ("sgd", "sgd-momentum", "momentum", "adam", "adamw")
GRADIENT_SYNCS = ("end", "bucketed", "sharded", "zero1")
PRECISIONS = ("fp32", "bf16", "fp16", "fp8")
RECOMPUTES = ("none", "selective", "op", "full")
SHARD_UNITS = ("block", "module")
GRAD_REDUCES = ("param", "fp32")
#: The software that runs an LLM plan, where it prices differently (ExecutionSettings.stack).
STACKS = ("megatron", "megatron-core", "megatron-deepspeed", "torchtitan")
#: What Megatron-Core's selective recompute can re-run (``--recompute-modules``; its
#: default ``core_attn``): the attention core, MLA's up-projections, the dense MLP, the whole
#: mixture of experts, the experts' activation, the norms, the shared experts.
RECOMPUTE_MODULES = ("core_attn", "mla_up_proj", "mlp", "moe", "moe_act", "layernorm",
                     "shared_experts")
#: How a mixture of experts moves tokens to their experts (ExecutionSettings.moe_dispatcher).
MOE_DISPATCHERS = ("alltoall", "allgather")
DDP_BUCKET_BYTES = 25 * 2**20  # torch DistributedDataParallel's default bucket_cap_mb

# Keys older plans kept among their algorithm options (before the ``execution`` field).
_LEGACY_OPTION_KEYS = ("efficiency", "optimizer", "microbatches", "schedule", "recompute",
                       "profile_flops")
# Keys of plans written before ``precision`` (2026-11): ``mixed_precision`` and the bytes of a
# stored parameter under it; read by :func:`_legacy_precision`.
_LEGACY_PRECISION_KEYS = ("mixed_precision", "param_dtype_bytes")
#: Settings :meth:`ExecutionSettings.override` still takes by their former names (they set
#: ``precision``): what algorithms accept as options beside the fields.
LEGACY_SETTING_KEYS = _LEGACY_PRECISION_KEYS
#: Bytes of one stored (compute) parameter under each precision. fp8 keeps bf16 weights: fp8
#: is the matrix products' input format, cast from bf16 weights each step, as torchtitan's
#: float8 training (torchao ``Float8Linear``) and Transformer Engine do.
_PARAM_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 2}


def _legacy_precision(data: Mapping[str, Any]) -> str | None:
    """The ``precision`` an older plan's ``mixed_precision`` / ``param_dtype_bytes`` mean:
    mixed precision with 2-byte parameters is ``fp16`` (Micikevicius et al. 2018, the
    mixed precision the old field described; bf16 prices the same), with 1-byte ``fp8``,
    with 4-byte ``fp32``; no mixed precision is ``fp32``. None when neither key is there."""
    if not any(data.get(k) is not None for k in _LEGACY_PRECISION_KEYS):
        return None
    mixed = data.get("mixed_precision", False)
    if not isinstance(mixed, bool):
        raise ShardplanError(f"mixed_precision must be true or false, got {mixed!r}")
    if not mixed:
        return "fp32"
    width = _int("param_dtype_bytes", data.get("param_dtype_bytes", 2))
    by_width = {1: "fp8", 2: "fp16", 4: "fp32"}
    if width not in by_width:
        raise ShardplanError(f"param_dtype_bytes {width} names no precision (1: fp8, "
                             f"2: fp16, 4: fp32)")
    return by_width[width]


def _int(name: str, v: Any, low: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
        raise ShardplanError(f"{name.replace('_', ' ')} must be an integer >= {low}, got {v!r}")
    return int(v)


@dataclass(frozen=True, kw_only=True, slots=True)
class ExecutionSettings:
    """How one training iteration of a plan runs.

    Attributes
    ----------
    microbatch_size : int or None
        Samples per micro-batch, shared by a stage's replicas; None: the graph's
        ``batch_size`` (see the module docstring).
    microbatches : int
        Micro-batches per iteration (default 8).
    schedule : {"gpipe", "1f1b", "interleaved-1f1b"}
        Pipeline schedule (default ``1f1b``).
    virtual_stages : int
        ``interleaved-1f1b``: plan stages per pipeline rank (default 2); 1 otherwise.
    recompute : {"none", "selective", "op", "full"}
        Activation recomputation (default ``none``). ``full``: the backward re-runs the
        forward, only stage inputs are stashed between the passes (GPipe; Megatron's
        ``--recompute-granularity full``). ``selective``: only attention's softmax and
        dropout are recomputed (Megatron's ``--recompute-granularity selective``, arXiv
        2205.05198 section 5); the operator-graph cost model prices it as ``none`` (no
        extra compute, the same activations: its graphs have no separate attention-score
        tensors to drop), the LLM plan kind uses its own activation formula. ``op``:
        torchtitan's per-operator checkpointing (``selective_ac_option = "op"``): each block
        keeps the outputs of fused attention and of every other matrix product and recomputes
        the rest in the backward (the LLM plan kind; priced as ``none`` elsewhere). ``true`` /
        ``false`` (plans written before the three values) load as ``full`` / ``none``.
    optimizer : {"sgd", "sgd-momentum", "momentum", "adam", "adamw"}
    precision : {"fp32", "bf16", "fp16", "fp8"}
        Training precision (default ``fp32``). ``fp32``: parameters, gradients and optimizer
        state in fp32, matrix products at the device's fp32 rate. ``bf16`` / ``fp16``:
        mixed precision (Micikevicius et al. 2018): 2-byte parameters and gradients, fp32
        master weights and optimizer state, matrix products at the device's tensor-core
        rate (``Device.flops``). ``fp8``: as bf16 (bf16 weights, cast to fp8 for the matrix
        products, as torchtitan's float8 and Transformer Engine do) with the matrix
        products at the device's fp8 rate (``fp8_flops``; H100 only). The graph's
        ``param_bytes`` are taken as the parameters in this precision (as they were under
        ``mixed_precision``). Plans written before this field give ``mixed_precision`` and
        ``param_dtype_bytes`` instead: see :func:`_legacy_precision`; both stay readable as
        derived properties.
    efficiency : float or None
        Fraction of a device's peak FLOP/s that FLOP-derived times reach; None: the device
        model's own (peak today).
    overlap : bool
        Devices send and receive while they compute (a separate communication stream, as
        torch.distributed's asynchronous sends do); False: a device computes or sends, never
        both.
    profile_flops : float or None
        Peak FLOP/s of the machine a graph's measured seconds come from (they are rescaled to
        each device); None: measured seconds are used as they are.
    gradient_sync : {"end", "bucketed", "sharded", "zero1"}
        How a stage's replicas synchronise gradients: ``end`` -- one ring all-reduce of the
        stage's gradients after its last backward (default; what the pipeline runtime
        does); ``bucketed`` -- DDP: gradients in buckets of ``bucket_bytes``, each
        all-reduced as soon as the last micro-batch's backward has produced it, overlapping
        the rest of that backward; ``sharded`` -- FSDP (ZeRO-3): parameters, gradients and
        optimizer state sharded over the replicas, each unit of ``bucket_bytes`` of
        parameters all-gathered before its forward and again before its backward (the next
        unit prefetched), its gradients reduce-scattered after the last micro-batch's
        backward; ``zero1`` -- the distributed optimizer (ZeRO stage 1, Megatron's
        ``--use-distributed-optimizer``): full parameters and gradients on every replica,
        the gradients reduce-scattered after the last backward, each replica stepping its
        shard of the master weights and optimizer state, the updated parameters
        all-gathered after the step.
    bucket_bytes : int
        DDP bucket and FSDP unit size (default 25 MiB, torch DDP's ``bucket_cap_mb``).
    sequence_parallel : bool
        Megatron's ``--sequence-parallel``: tensor parallelism's all-reduces become
        reduce-scatter plus all-gather, LayerNorm and dropout activations split by the
        tensor-parallel degree. Recorded for the LLM plan kind (``simulate/_llm.py``); the
        operator-graph cost model does not read it.
    tp_comm_overlap : bool
        Megatron's ``--tp-comm-overlap``: tensor-parallel communication overlapped with the
        matrix products around it. Recorded for the LLM plan kind, like
        ``sequence_parallel``.
    attention : {"flash", "materialized"}
        How the attention kernel runs, for the LLM plan kind: ``flash`` keeps no s x s
        matrix (FlashAttention; torch's scaled_dot_product_attention, torchtitan, current
        Megatron-LM); ``materialized`` writes the scores to memory and keeps them for the
        backward (Megatron-LM's fused scale-mask-softmax kernels of 2020-2022).
    grad_reduce : {"param", "fp32"}
        The precision gradients are accumulated and reduced over the data-parallel ranks in,
        for the LLM plan kind: ``param`` (default) -- the parameters' (half under mixed
        precision); ``fp32`` -- fp32 gradients beside half-precision parameters: Megatron-LM's
        ``--accumulate-allreduce-grads-in-fp32`` (which ``--bf16`` turns on), torch FSDP2's
        ``reduce_dtype=torch.float32`` (torchtitan's ``mixed_precision_reduce = "float32"``,
        its default). Their all-reduce or reduce-scatter moves 4 bytes per parameter, they
        are held in 4 bytes, and the optimizer step has no half-to-fp32 gradient copy. No
        effect under fp32 training.
    recompute_every : int
        With ``recompute`` ``full``: checkpoint every k-th transformer block only (the k-th,
        2k-th, ... of the model; torchtitan's ``selective_ac_option = "k"``), the others
        keeping their activations (default 1: every block). The LLM plan kind prices it.
    shard_unit : {"block", "module"}
        What fully sharded data parallelism gathers at a time, for the LLM plan kind:
        ``block`` -- one transformer block, the next one prefetched (torch FSDP2 wrapping each
        block, as torchtitan does; Megatron-LM's FSDP, whose unit is the transformer layer);
        ``module`` -- each parameterized sub-module on its own (DeepSpeed ZeRO-3, which
        fetches a module's parameters in its forward and backward hooks and prefetches a
        bucket of the next ones).
    stack : {"megatron", "megatron-core", "megatron-deepspeed", "torchtitan"}
        The software that runs an LLM plan, where its mechanisms differ (``docs/gpu-model.md``,
        "Each stack as it runs"): ``megatron`` (default) -- Megatron-LM's own modules (its
        2020-2022 GPT, ``--transformer-impl local``): pipeline messages split over the
        tensor-parallel ranks and sent asynchronously, every tensor autograd keeps kept;
        ``megatron-core`` -- Megatron-Core with Transformer Engine (Megatron-LM's default,
        NeMo): the same, with Transformer Engine's fused modules keeping only what they save
        (``shardplan/cost/_llm.py``, :func:`~shardplan.cost._llm.te_kept`);
        ``megatron-deepspeed`` -- Megatron-DeepSpeed under DeepSpeed's pipeline engine and
        ZeRO optimizer: blocking sends of partitioned tensors, rebuilt by an all-gather over
        the tensor-parallel ranks, outputs kept in pipe buffers, and DeepSpeed's optimizer's
        own gradient buffers (fp32 accumulation of the BF16 optimizer, reduce buckets);
        ``torchtitan`` -- torch FSDP2 / pipelining (its FSDP is priced by ``shard_unit``
        ``block``). The importers set it from the configuration.
    expandable_segments : bool
        ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``: the caching allocator grows its
        segments page by page, so what it reserves beyond the live tensors is rounding only
        (``shardplan/cost/_reserved.py``; default False: fixed segments, which keep a hole
        the size of the step's largest freed tensor). torchtitan's launch script sets it.
    lazy_loading : bool
        CUDA loads kernels as they are first used (``CUDA_MODULE_LOADING=LAZY``, which torch
        sets since 1.13): the CUDA context holds 287 MB instead of 667 MB
        (``shardplan/cost/_reserved.py``; default True; False for runs of older torch).
    recompute_modules : tuple of str
        What ``selective`` recompute re-runs (:data:`RECOMPUTE_MODULES`, Megatron-Core's
        ``--recompute-modules``; default ``("core_attn",)``, the attention core as Megatron
        recomputes it by default).
    moe_dispatcher : {"alltoall", "allgather"}
        How a mixture of experts' tokens reach the experts of other expert-parallel ranks
        (Megatron-Core's ``--moe-token-dispatcher-type``): ``alltoall`` -- each token sent
        to the ranks of its chosen experts and back; ``allgather`` -- every rank gathers all
        tokens and keeps its experts' share, then the outputs are reduce-scattered.
    moe_capacity_factor : float or None
        Expert capacity as a multiple of the balanced share (``--moe-expert-capacity-factor``;
        tokens beyond it are dropped); None: dropless (Megatron-Core's default), each expert
        takes every token routed to it.
    moe_grouped_gemm : bool
        The local experts run as one grouped GEMM (``--moe-grouped-gemm``; default True) rather
        than one GEMM per expert.
    moe_force_balance : bool
        The router's choices forced balanced (``--moe-router-force-load-balancing``, what
        Megatron-Bridge's MoE performance benchmarks run since 25.09, "dropless with balanced
        gating"): no device waits for a busier one (:mod:`shardplan.cost._llm_moe`).
    moe_a2a_overlap : bool
        Megatron-Core's ``--overlap-moe-expert-parallel-comm``: the dispatch and combine
        all-to-alls of one micro-batch run under the computation of another (its 1F1B
        pairs a forward with a backward), so only what exceeds that computation is exposed.
    overlap_grad_reduce : bool
        Under the distributed optimizer (``gradient_sync`` ``zero1``), Megatron-Core's
        ``--overlap-grad-reduce``: each bucket's reduce-scatter starts as soon as its
        gradients are ready during a stage's last backward (default False: the stage's whole
        reduction after its last backward). Buckets hold Megatron-Core's default
        ``max(40e6, 1e6 x data-parallel size)`` parameters (:mod:`shardplan.simulate._llm`).
    overlap_param_gather : bool
        Under the distributed optimizer, ``--overlap-param-gather``: the updated parameters'
        all-gather runs bucket by bucket under the next iteration's first forward (default
        False: after the step, exposed).
    """

    microbatch_size: int | None = None
    microbatches: int = 8
    schedule: str = "1f1b"
    virtual_stages: int = 2
    recompute: str = "none"
    optimizer: str = "adam"
    precision: str = "fp32"
    efficiency: float | None = None
    overlap: bool = True
    profile_flops: float | None = None
    gradient_sync: str = "end"
    bucket_bytes: int = DDP_BUCKET_BYTES
    sequence_parallel: bool = False
    tp_comm_overlap: bool = False
    attention: str = "flash"
    shard_unit: str = "block"
    recompute_every: int = 1
    grad_reduce: str = "param"
    stack: str = "megatron"
    expandable_segments: bool = False
    lazy_loading: bool = True
    recompute_modules: tuple[str, ...] = ("core_attn",)
    moe_dispatcher: str = "alltoall"
    moe_capacity_factor: float | None = None
    moe_grouped_gemm: bool = True
    moe_force_balance: bool = False
    moe_a2a_overlap: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False

    def __post_init__(self) -> None:
        from shardplan._limits import check_size

        if self.microbatch_size is not None:
            check_size("micro-batch size", _int("microbatch_size", self.microbatch_size),
                       "batch")
        check_size("micro-batches", _int("microbatches", self.microbatches), "microbatches")
        _int("virtual_stages", self.virtual_stages)
        _int("bucket_bytes", self.bucket_bytes)
        _int("recompute_every", self.recompute_every)
        if isinstance(self.recompute, bool):  # plans and callers of the boolean setting
            object.__setattr__(self, "recompute", "full" if self.recompute else "none")
        if self.recompute not in RECOMPUTES:
            raise ShardplanError(f"recompute must be one of {', '.join(RECOMPUTES)}, got "
                                 f"{self.recompute!r}")
        if self.precision not in PRECISIONS:
            raise ShardplanError(f"unknown precision {self.precision!r} (choose from "
                                 f"{', '.join(PRECISIONS)})")
        if self.gradient_sync not in GRADIENT_SYNCS:
            raise ShardplanError(f"unknown gradient sync {self.gradient_sync!r} (choose from "
                                 f"{', '.join(GRADIENT_SYNCS)})")
        if self.attention not in ATTENTION_KERNELS:
            raise ShardplanError(f"unknown attention kernel {self.attention!r} (choose from "
                                 f"{', '.join(ATTENTION_KERNELS)})")
        if self.shard_unit not in SHARD_UNITS:
            raise ShardplanError(f"unknown shard unit {self.shard_unit!r} (choose from "
                                 f"{', '.join(SHARD_UNITS)})")
        if self.grad_reduce not in GRAD_REDUCES:
            raise ShardplanError(f"unknown gradient reduction precision {self.grad_reduce!r} "
                                 f"(choose from {', '.join(GRAD_REDUCES)})")
        if self.stack not in STACKS:
            raise ShardplanError(f"unknown stack {self.stack!r} (choose from "
                                 f"{', '.join(STACKS)})")
        if self.schedule not in SCHEDULES:
            raise ShardplanError(f"unknown schedule {self.schedule!r} (choose from "
                                 f"{', '.join(SCHEDULES)})")
        if self.optimizer not in OPTIMIZERS:
            raise ShardplanError(f"unknown optimizer {self.optimizer!r} (choose from "
                                 f"{', '.join(OPTIMIZERS)})")
        mods = self.recompute_modules
        if isinstance(mods, str) or not isinstance(mods, (list, tuple)) or not mods or any(
                m not in RECOMPUTE_MODULES for m in mods):
            raise ShardplanError(f"recompute_modules must be a non-empty list of "
                                 f"{', '.join(RECOMPUTE_MODULES)}, got {mods!r}")
        object.__setattr__(self, "recompute_modules", tuple(dict.fromkeys(mods)))
        if self.moe_dispatcher not in MOE_DISPATCHERS:
            raise ShardplanError(f"unknown MoE token dispatcher {self.moe_dispatcher!r} "
                                 f"(choose from {', '.join(MOE_DISPATCHERS)})")
        cf = self.moe_capacity_factor
        if cf is not None and (isinstance(cf, bool) or not isinstance(cf, (int, float))
                               or not (math.isfinite(cf) and cf > 0)):
            raise ShardplanError(f"moe_capacity_factor must be a positive number or null, "
                                 f"got {cf!r}")
        for name in ("overlap", "sequence_parallel", "tp_comm_overlap",
                     "expandable_segments", "lazy_loading", "moe_grouped_gemm",
                     "overlap_grad_reduce", "overlap_param_gather", "moe_force_balance",
                     "moe_a2a_overlap"):
            if not isinstance(getattr(self, name), bool):
                raise ShardplanError(f"{name} must be true or false, got "
                                     f"{getattr(self, name)!r}")
        if self.efficiency is not None and (
                isinstance(self.efficiency, bool) or not isinstance(self.efficiency, (int, float))
                or not 0 < self.efficiency <= 1):
            raise ShardplanError(f"efficiency must be in (0, 1], got {self.efficiency!r}")
        if self.profile_flops is not None and (
                isinstance(self.profile_flops, bool)
                or not isinstance(self.profile_flops, (int, float))
                or not (math.isfinite(self.profile_flops) and self.profile_flops > 0)):
            raise ShardplanError(f"profile_flops must be a positive number, got "
                                 f"{self.profile_flops!r}")
        if self.schedule == "interleaved-1f1b" and self.virtual_stages < 2:
            raise ShardplanError("interleaved-1f1b needs virtual_stages >= 2")

    # ------------------------------------------------------------------ derived
    @property
    def recompute_full(self) -> bool:
        """Whether the backward re-runs the whole forward (``recompute == "full"``): what
        the operator-graph cost model prices (``selective`` prices as ``none``)."""
        return self.recompute == "full"

    @property
    def mixed_precision(self) -> bool:
        """Half or fp8 compute with fp32 master weights and optimizer state (every
        precision but ``fp32``)."""
        return self.precision != "fp32"

    @property
    def param_dtype_bytes(self) -> int:
        """Bytes of one stored parameter (and gradient): 4 for fp32, 2 for bf16, fp16 and
        fp8 (bf16 weights cast to fp8 for the matrix products)."""
        return _PARAM_BYTES[self.precision]

    @property
    def stages_per_rank(self) -> int:
        """Plan stages one pipeline rank runs: ``virtual_stages`` when interleaved, else 1."""
        return self.virtual_stages if self.schedule == "interleaved-1f1b" else 1

    @property
    def global_batch(self) -> int | None:
        """Samples per iteration, ``microbatch_size * microbatches`` (None until resolved)."""
        if self.microbatch_size is None:
            return None
        return self.microbatch_size * self.microbatches

    @property
    def efficiency_or_peak(self) -> float:
        """``efficiency``, or 1.0 (peak) when unset."""
        return 1.0 if self.efficiency is None else float(self.efficiency)

    def resolve(self, graph: Any) -> ExecutionSettings:
        """The same settings with ``microbatch_size`` filled in from ``graph.batch_size``."""
        if self.microbatch_size is not None:
            return self
        return replace(self, microbatch_size=int(graph.batch_size))

    def batch_scale(self, graph: Any) -> float:
        """``microbatch_size / graph.batch_size``: how much a micro-batch's work and
        activations exceed the graph's (1.0 when unset)."""
        if self.microbatch_size is None:
            return 1.0
        return self.microbatch_size / float(graph.batch_size)

    def graph_for(self, graph: Any) -> Any:
        """``graph`` at this micro-batch size (the graph itself when they agree)."""
        if self.microbatch_size is None or self.microbatch_size == graph.batch_size:
            return graph
        return graph.at_batch_size(self.microbatch_size)

    # ------------------------------------------------------------------ changes
    def override(self, **changes: Any) -> tuple[ExecutionSettings, list[str]]:
        """New settings with ``changes`` (None values ignored), and one note per value that
        differs from the current one: what a command prints when a flag overrides a plan.

        ``global_batch`` is accepted too: it sets ``microbatch_size = global_batch /
        microbatches`` (after any ``microbatches`` change), which must divide evenly.
        """
        changes = {k: v for k, v in changes.items() if v is not None}
        legacy = {k: changes.pop(k) for k in _LEGACY_PRECISION_KEYS if k in changes}
        if legacy and "precision" not in changes:
            if "mixed_precision" not in legacy:
                legacy["mixed_precision"] = self.mixed_precision
            changes["precision"] = _legacy_precision(legacy)
        if isinstance(changes.get("recompute"), bool):
            changes["recompute"] = "full" if changes["recompute"] else "none"
        names = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - names - {"global_batch"})
        if unknown:
            raise ShardplanError(f"unknown execution setting {unknown[0]!r} (settings: "
                                 f"{', '.join(sorted(names | {'global_batch'}))})")
        glob = changes.pop("global_batch", None)
        if glob is not None:
            glob = _int("global_batch", glob)
            m = int(changes.get("microbatches", self.microbatches))
            if glob % m:
                raise ShardplanError(f"global batch {glob} is not a multiple of {m} "
                                     "micro-batches")
            changes["microbatch_size"] = glob // m
        notes = []
        for k, v in changes.items():
            old = getattr(self, k)
            if old is not None and old != v:
                notes.append(f"{k.replace('_', '-')} {_show(v)} overrides the plan's "
                             f"{_show(old)}")
        return replace(self, **changes), notes

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """The ``execution`` object of a plan file; ``mixed_precision`` and
        ``param_dtype_bytes`` are written too (derived from ``precision``) for readers of
        the fields they replaced."""
        d = asdict(self)
        d["recompute_modules"] = list(self.recompute_modules)  # JSON's kind of sequence
        d["mixed_precision"] = self.mixed_precision
        d["param_dtype_bytes"] = self.param_dtype_bytes
        if self.global_batch is not None:
            d["global_batch"] = self.global_batch
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExecutionSettings:
        """Read the ``execution`` object of a plan file; unknown keys are ignored (the
        contract: readers ignore what they do not know). ``global_batch``, when present,
        must agree with the micro-batch size and count."""
        if not isinstance(data, Mapping):
            raise InvalidFileError("plan 'execution' must be a JSON object")
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in data.items() if k in names and v is not None}
        try:
            if "precision" not in kw:
                old = _legacy_precision(data)
                if old is not None:
                    kw["precision"] = old
            s = cls(**kw)
        except ShardplanError as exc:
            raise InvalidFileError(f"plan 'execution': {exc}") from None
        glob = data.get("global_batch")
        if glob is not None and s.global_batch is not None and glob != s.global_batch:
            raise InvalidFileError(f"plan 'execution': global_batch {glob!r} is not "
                                   f"microbatch_size x microbatches = {s.global_batch}")
        if glob is not None and s.microbatch_size is None:
            try:
                s, _ = s.override(global_batch=glob)
            except ShardplanError as exc:
                raise InvalidFileError(f"plan 'execution': {exc}") from None
        return s

    @classmethod
    def from_legacy_options(cls, options: Mapping[str, Any]) -> ExecutionSettings:
        """The settings of a plan written before the ``execution`` field: the cost-model
        keys it kept among its options, the defaults for the rest."""
        kw = {k: options[k] for k in _LEGACY_OPTION_KEYS if options.get(k) is not None}
        try:
            old = _legacy_precision(options)
            if old is not None:
                kw["precision"] = old
            return cls(**kw)
        except ShardplanError as exc:
            raise InvalidFileError(f"plan options: {exc}") from None


def _show(v: Any) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    return f"{v:g}" if isinstance(v, float) else str(v)
