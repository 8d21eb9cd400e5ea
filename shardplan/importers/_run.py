"""What an imported training run is: a model, a cluster, a parallel layout and its settings.

The Megatron-LM and torchtitan importers (:mod:`shardplan.importers.megatron`,
:mod:`shardplan.importers.torchtitan`) both read a run into one :class:`RunConfig`, which
checks itself as the two tools check their own configurations (tensor parallelism divides the
heads, the global batch divides into micro-batches, the layers fill the pipeline stages, ...).
The command line then captures the model (:attr:`RunConfig.model`, a zoo spec), builds the
cluster (:attr:`RunConfig.cluster`) and lays the plan out from :attr:`RunConfig.parallel` and
:meth:`RunConfig.settings`.

Model specs (the zoo's names, issue 36):

- ``gpt:hidden=H,layers=L,heads=A,vocab=V,seq=S[,ffn=F]``: Megatron's GPT (LayerNorm, GELU,
  learned positions, tied output head); ``ffn`` only when it is not ``4 H``.
- ``llama:hidden=H,layers=L,heads=A,kv_heads=K,ffn=F,vocab=V,seq=S``: a Llama-style decoder
  by its dimensions (RMSNorm, SwiGLU, rotary positions, grouped-query attention, untied head):
  what Megatron arguments with ``--swiglu`` or grouped-query attention describe.
- ``llama3:8B,seq=S`` (``70B``, ``405B``) and ``llama2:7B,seq=S`` (``13B``, ``70B``):
  torchtitan's flavors (:data:`FLAVORS`).
- ``deepseek_v3:671B,seq=S`` and the other mixtures of experts of the zoo (``mixtral``,
  ``qwen3_moe``, ``gpt_oss``; :data:`MOE_FAMILIES`), with the zoo's ``MoEConfig`` overrides
  where a run's model differs from the flavor (``qwen3_moe:235B-A22B,n_layers=4,seq=4096``):
  :class:`MoEDims`, built by :mod:`shardplan.importers._moe`.

Batch vocabulary (:mod:`shardplan.ir.settings`): :attr:`RunConfig.micro_batch_size` is the
tools' micro-batch, samples per data-parallel rank; the plan's ``microbatch_size`` is the
micro-batch as the pipeline sees it, shared by the ``dp x dp_shard`` data-parallel ranks
(``micro_batch_size x dp x dp_shard``); ``microbatches`` is the global batch over that.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from shardplan.errors import ShardplanError
from shardplan.ir.parallel import ParallelConfig, balanced_stage_layers
from shardplan.ir.settings import ExecutionSettings

__all__ = ["FLAVORS", "MOE_FAMILIES", "PRECISIONS", "RECORD_ONLY", "RECOMPUTES", "ModelDims",
           "MoEDims", "RunConfig", "balanced_stage_layers", "execution_of", "flavor_dims",
           "uneven_stage_layers"]

PRECISIONS = ("fp32", "bf16", "fp16", "fp8")
RECOMPUTES = ("none", "selective", "op", "full")

#: torchtitan's Llama flavors: (hidden, layers, heads, kv heads, ffn, vocab)
#: (docs of the shared notes, llm-facts.md; Llama 2's 7B and 13B have no grouped queries).
FLAVORS: dict[str, dict[str, tuple[int, int, int, int, int, int]]] = {
    "llama3": {"8B": (4096, 32, 32, 8, 14336, 128256),
               "70B": (8192, 80, 64, 8, 28672, 128256),
               "405B": (16384, 126, 128, 8, 53248, 128256)},
    "llama2": {"7B": (4096, 32, 32, 32, 11008, 32000),
               "13B": (5120, 40, 40, 40, 13824, 32000),
               "70B": (8192, 80, 64, 8, 28672, 32000)},
}


#: The mixture-of-experts families of the zoo (``shardplan/workload/moe.py``).
MOE_FAMILIES = ("mixtral", "deepseek_v3", "qwen3_moe", "gpt_oss")
#: Execution keys an importer records for the exports (``imported_from.execution``) that are
#: no :class:`~shardplan.ir.ExecutionSettings` field and are not priced: the MoE router's
#: load balancing (Megatron-LM's ``--moe-router-load-balancing-type``).
RECORD_ONLY = frozenset({"moe_load_balancing"})


def _spec_value(v: Any) -> str:
    """A zoo spec's text of an override value (``true``, ``none``, ``2.5``, ``128``)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    return "none" if v is None else str(v)


@dataclass(frozen=True, kw_only=True, slots=True)
class MoEDims:
    """The mixture of experts of a :class:`ModelDims`: the zoo flavor it is built from, the
    ``MoEConfig`` fields that differ from the flavor's, and the expert layers' sizes.

    Attributes
    ----------
    flavor : str
        The zoo flavor (``deepseek_v3:671B``; a key of ``shardplan.workload.moe.FLAVORS``).
    overrides : tuple of (str, value)
        ``MoEConfig`` fields set on the flavor, in the config's field order.
    num_experts, top_k, moe_ffn : int
        Routed experts per MoE layer, experts per token, each expert's FFN width.
    shared_experts : int
        Always-on experts of width ``moe_ffn``.
    first_k_dense : int
        Leading layers with a dense FFN instead of experts.
    attention : {"gqa", "mla"}
    """

    flavor: str
    overrides: tuple[tuple[str, Any], ...] = ()
    num_experts: int
    top_k: int
    moe_ffn: int
    shared_experts: int = 0
    first_k_dense: int = 0
    attention: str = "gqa"

    def __post_init__(self) -> None:
        family = self.flavor.partition(":")[0]
        if family not in MOE_FAMILIES:
            raise ShardplanError(f"unknown mixture-of-experts family {family!r} (shardplan "
                                 f"knows {', '.join(MOE_FAMILIES)})")
        if not 1 <= self.top_k <= self.num_experts:
            raise ShardplanError(f"{self.top_k} experts per token out of {self.num_experts} "
                                 f"experts")
        object.__setattr__(self, "overrides", tuple((str(k), v) for k, v in self.overrides))

    @property
    def spec_options(self) -> str:
        """``,n_layers=4,top_k=2`` (the overrides as the zoo spec writes them)."""
        return "".join(f",{k}={_spec_value(v)}" for k, v in self.overrides)


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelDims:
    """A decoder-only transformer's dimensions, and the zoo family that builds it.

    Attributes
    ----------
    family : {"gpt", "llama", "llama3", "llama2", "mixtral", "deepseek_v3", "qwen3_moe", \
"gpt_oss"}
        ``gpt`` and ``llama`` are specs by dimensions; ``llama3`` and ``llama2`` name a
        torchtitan flavor (``flavor``); the mixture-of-experts families (:data:`MOE_FAMILIES`)
        a zoo flavor with overrides (``moe``).
    hidden, num_layers, num_heads, num_kv_heads, ffn, vocab, seq_len : int
        For a mixture of experts: ``ffn`` is the dense layers' width (the experts' when every
        layer has experts) and ``num_kv_heads`` the heads under multi-head latent attention.
    flavor : str or None
        ``8B``, ``70B``, ``671B``, ... for the flavor families.
    moe : MoEDims or None
        The mixture of experts (None: a dense model).
    """

    family: str
    hidden: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    ffn: int
    vocab: int
    seq_len: int
    flavor: str | None = None
    moe: MoEDims | None = None

    def __post_init__(self) -> None:
        if self.moe is not None:
            if self.moe.flavor != f"{self.family}:{self.flavor}":
                raise ShardplanError(f"model {self.family}:{self.flavor} is not its mixture of "
                                     f"experts' flavor {self.moe.flavor}")
        elif self.family not in ("gpt", "llama", *FLAVORS):
            raise ShardplanError(f"unknown model family {self.family!r}")
        for name in ("hidden", "num_layers", "num_heads", "num_kv_heads", "ffn", "vocab",
                     "seq_len"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ShardplanError(f"model {name.replace('_', ' ')} must be an integer >= 1, "
                                     f"got {v!r}")
        if self.moe is None and self.hidden % self.num_heads:  # MoE: heads of their width
            raise ShardplanError(f"hidden size {self.hidden} is not a multiple of the "
                                 f"{self.num_heads} attention heads")
        if self.num_heads % self.num_kv_heads:
            raise ShardplanError(f"{self.num_heads} attention heads do not divide into "
                                 f"{self.num_kv_heads} query groups")

    @property
    def spec(self) -> str:
        """The zoo's model spec (module docstring)."""
        if self.moe is not None:
            return f"{self.moe.flavor}{self.moe.spec_options},seq={self.seq_len}"
        if self.family in FLAVORS:
            return f"{self.family}:{self.flavor},seq={self.seq_len}"
        if self.family == "llama":  # a Llama by its dimensions: torchtitan's model, all set
            return (f"llama3:8B,dim={self.hidden},n_layers={self.num_layers},"
                    f"n_heads={self.num_heads},n_kv_heads={self.num_kv_heads},"
                    f"ffn_dim={self.ffn},vocab_size={self.vocab},seq={self.seq_len}")
        parts = [f"hidden={self.hidden}", f"layers={self.num_layers}", f"heads={self.num_heads}"]
        if self.family == "llama":
            parts += [f"kv_heads={self.num_kv_heads}", f"ffn={self.ffn}"]
        elif self.ffn != 4 * self.hidden:
            parts.append(f"ffn={self.ffn}")
        parts += [f"vocab={self.vocab}", f"seq={self.seq_len}"]
        return f"{self.family}:" + ",".join(parts)


def flavor_dims(family: str, flavor: str, seq_len: int) -> ModelDims:
    """The dimensions of a torchtitan flavor (``llama3``, ``8B``); one-line error naming the
    known ones otherwise."""
    table = FLAVORS.get(family)
    if table is None:
        raise ShardplanError(f"unknown model {family!r} (shardplan knows "
                             f"{', '.join(FLAVORS)})")
    key = {k.lower(): k for k in table}.get(str(flavor).lower())
    if key is None:
        raise ShardplanError(f"unknown {family} flavor {flavor!r} (choose from "
                             f"{', '.join(table)})")
    h, layers, heads, kv, ffn, vocab = table[key]
    return ModelDims(family=family, flavor=key, hidden=h, num_layers=layers, num_heads=heads,
                     num_kv_heads=kv, ffn=ffn, vocab=vocab, seq_len=seq_len)


def uneven_stage_layers(num_layers: int, pp: int, vp: int, first: int | None,
                        last: int | None) -> tuple[int, ...] | None:
    """Blocks per virtual stage when the first and/or last pipeline rank hold ``first`` /
    ``last`` blocks (Megatron's ``--decoder-first/last-pipeline-num-layers``), the other
    ranks the rest evenly, and each rank's blocks split evenly over its ``vp`` virtual
    stages; None when neither is given or the stages come out even. Virtual stage ``j`` is
    on rank ``j % pp``.

    Raises
    ------
    ShardplanError
        The rest does not divide over the other ranks, or a rank's blocks over ``vp``.
    """
    if first is None and last is None:
        return None
    if pp < 2:
        raise ShardplanError("uneven first/last pipeline stages need a pipeline of 2 or more "
                             "ranks")
    per_rank: list[int | None] = [None] * pp
    if first is not None:
        per_rank[0] = first
    if last is not None:
        per_rank[-1] = last
    rest = num_layers - sum(x for x in per_rank if x is not None)
    free = sum(1 for x in per_rank if x is None)
    if rest < 0 or (free == 0 and rest != 0) or (free and rest % free):
        raise ShardplanError(f"{num_layers} layers with {first} on the first and {last} on the "
                             f"last pipeline rank leave {rest} for the other {free} ranks, "
                             f"not an even split")
    counts = [rest // free if x is None else x for x in per_rank]
    for i, c in enumerate(counts):
        if c % vp:
            raise ShardplanError(f"pipeline rank {i}'s {c} layers do not split over {vp} "
                                 f"virtual stages")
    out = tuple(counts[j % pp] // vp for j in range(pp * vp))
    return None if len(set(out)) == 1 else out  # even after all: the default layout


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One training run as Megatron-LM or torchtitan describe it, checked for consistency.

    Attributes
    ----------
    model : ModelDims
        The model; ``model.spec`` is the zoo spec the command line captures.
    cluster : str or None
        The cluster spec (``dgx-a100,nodes=4``) or topology file; None: not given.
    num_gpus : int or None
        GPUs of the cluster when known; the layout must use all of them.
    parallel : ParallelConfig
    micro_batch_size : int
        Samples per micro-batch of one data-parallel rank (Megatron's ``--micro-batch-size``).
    global_batch : int
        Samples per iteration (optimizer step).
    execution : mapping
        :class:`~shardplan.ir.ExecutionSettings` fields (``microbatch_size``, ``microbatches``,
        ``schedule``, ``virtual_stages``, ``precision``, ``recompute``, ``gradient_sync``,
        ``sequence_parallel``, ``tp_comm_overlap``, ``optimizer``, ...); see
        :meth:`settings`.
    notes : tuple of str
        One line per argument that changes the run but is not modelled.
    source : str
        ``megatron`` or ``torchtitan``.

    Raises
    ------
    ShardplanError
        On construction, when the run is inconsistent: tensor parallelism not dividing the
        heads or the query groups, a world size other than the cluster's GPUs, a global
        batch not a multiple of ``micro_batch_size x data-parallel size``, layers not filling
        ``pp x vp`` stages evenly (without uneven first/last stages), a sequence not
        splitting over context parallelism (``2 cp``, load-balanced) or, under sequence
        parallelism, over ``tp``, interleaving without a pipeline, expert parallelism without
        a mixture of experts or not dividing its experts (Megatron-LM's and torchtitan's
        checks; the expert grid's folding is :class:`~shardplan.ir.ParallelConfig`'s).
    """

    model: ModelDims
    cluster: str | None = None
    num_gpus: int | None = None
    parallel: ParallelConfig
    micro_batch_size: int
    global_batch: int
    execution: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    source: str = ""

    def __post_init__(self) -> None:
        par, m = self.parallel, self.model
        if m.num_heads % par.tp:
            raise ShardplanError(f"tensor parallelism {par.tp} does not divide the "
                                 f"{m.num_heads} attention heads")
        if m.num_kv_heads % par.tp:
            raise ShardplanError(f"tensor parallelism {par.tp} does not divide the "
                                 f"{m.num_kv_heads} query groups (KV heads)")
        _check_experts(m, par)
        if self.num_gpus is not None and par.world_size != self.num_gpus:
            raise ShardplanError(f"the run uses {par.world_size} GPUs ({par.label()}) and the "
                                 f"cluster has {self.num_gpus}")
        if isinstance(self.micro_batch_size, bool) or self.micro_batch_size < 1:
            raise ShardplanError(f"micro-batch size must be >= 1, got {self.micro_batch_size}")
        step = self.micro_batch_size * par.data_parallel
        if self.global_batch < 1 or self.global_batch % step:
            raise ShardplanError(f"global batch {self.global_batch} is not a multiple of "
                                 f"micro-batch {self.micro_batch_size} x data-parallel size "
                                 f"{par.data_parallel} = {step}")
        from shardplan._limits import check_size

        check_size(f"the world size ({par.label()})", par.world_size, "devices")
        glob_flag = {"megatron": "--global-batch-size",
                     "torchtitan": "[training] global_batch_size"}.get(self.source,
                                                                        "global batch")
        from shardplan._limits import LIMITS

        count = self.global_batch // step
        most, why = LIMITS["microbatches"]
        if count > most:
            raise ShardplanError(f"{glob_flag} {self.global_batch} is {count:,} micro-batches of "
                                 f"{self.micro_batch_size} sample(s) on each of "
                                 f"{par.data_parallel} data-parallel rank(s), above the "
                                 f"{int(most):,} micro-batches per iteration shardplan plans "
                                 f"for: {why}")
        if par.vp > 1 and par.pp < 2:
            raise ShardplanError("virtual pipeline stages need a pipeline of 2 or more ranks")
        if par.stage_layers is None and m.num_layers % par.num_stages:
            raise ShardplanError(f"{m.num_layers} layers do not divide evenly over pp x vp = "
                                 f"{par.num_stages} pipeline stages")
        par.layers_per_stage(m.num_layers)  # uneven: they must add up
        if par.cp > 1 and m.seq_len % (2 * par.cp):
            raise ShardplanError(f"sequence length {m.seq_len} is not a multiple of 2 x "
                                 f"context parallelism {par.cp} (load-balanced chunks)")
        if self.execution.get("sequence_parallel") and m.seq_len % (par.tp * par.cp):
            raise ShardplanError(f"sequence parallelism splits the sequence of {m.seq_len} "
                                 f"over tp x cp = {par.tp * par.cp}, which does not divide it")
        prec = self.execution.get("precision", "fp32")
        if prec not in PRECISIONS:
            raise ShardplanError(f"unknown precision {prec!r} (choose from "
                                 f"{', '.join(PRECISIONS)})")
        rec = self.execution.get("recompute", "none")
        if rec not in RECOMPUTES:
            raise ShardplanError(f"unknown recompute {rec!r} (choose from "
                                 f"{', '.join(RECOMPUTES)})")
        object.__setattr__(self, "execution", dict(self.execution))
        object.__setattr__(self, "notes", tuple(self.notes))

    @property
    def microbatches(self) -> int:
        """Micro-batches per iteration: ``global_batch / (micro_batch_size x dp x dp_shard)``."""
        return self.global_batch // (self.micro_batch_size * self.parallel.data_parallel)

    def settings(self) -> tuple[ExecutionSettings, list[str]]:
        """The plan's :class:`~shardplan.ir.ExecutionSettings`, and a note for each field of
        :attr:`execution` this version of them does not have (dropped).

        Until the training settings of issue 36 (``precision``, ``recompute`` as none /
        selective / full, ``gradient_sync`` zero1, ``sequence_parallel``, ``tp_comm_overlap``)
        are fields, ``recompute`` is passed as the boolean the settings take (any recompute:
        True) and a gradient sync they do not know as ``end``.
        """
        known = {f.name: f for f in fields(ExecutionSettings)}
        kw: dict[str, Any] = {}
        dropped = []
        from shardplan.ir.settings import LEGACY_SETTING_KEYS

        for k, v in self.execution.items():
            if k in LEGACY_SETTING_KEYS and "precision" in known:
                continue  # derived from precision (ExecutionSettings.mixed_precision, ...)
            if k in RECORD_ONLY:
                continue  # kept in the plan's imported_from for the exports, not priced
            if k not in known:
                dropped.append(k)
                continue
            kw[k] = v
        notes = []
        if dropped:
            notes.append(f"{', '.join(dropped)} are not among this shardplan's execution "
                         f"settings: kept in the plan's imported_from only, not priced")
        if isinstance(ExecutionSettings().recompute, bool) and isinstance(kw.get("recompute"),
                                                                          str):
            if kw["recompute"] == "selective":
                notes.append("selective recompute is recorded as this shardplan's recompute "
                             "on (the whole forward again)")
            kw["recompute"] = kw["recompute"] != "none"
        from shardplan.ir.settings import GRADIENT_SYNCS

        if kw.get("gradient_sync") not in (None, *GRADIENT_SYNCS):
            notes.append(f"gradient sync {kw['gradient_sync']!r} is not known to this "
                         f"shardplan's settings: recorded as 'end'")
            kw["gradient_sync"] = "end"
        return ExecutionSettings(**kw), notes

    def summary(self) -> str:
        """``llama3:8B,seq=8192: TP 8 x DP 4, micro-batch 1 x 32, global batch 128``."""
        return (f"{self.model.spec}: {self.parallel.label()}, micro-batch "
                f"{self.micro_batch_size} x {self.microbatches} micro-batches, global batch "
                f"{self.global_batch}")



def _check_experts(model: ModelDims, par: ParallelConfig) -> None:
    """Expert parallelism as Megatron-LM's ``validate_args`` checks it ("num_experts must be
    non None to use expert model parallelism", "Number of experts should be a multiple of
    expert model parallel_size"); torchtitan shards the experts' first dimension the same
    way."""
    if model.moe is None:
        if par.ep > 1:
            raise ShardplanError(f"expert parallelism {par.ep} needs a mixture of experts, and "
                                 f"{model.spec} has none")
        return
    if model.moe.num_experts % par.ep:
        raise ShardplanError(f"expert parallelism {par.ep} does not divide the "
                             f"{model.moe.num_experts} experts")


def execution_of(parallel: ParallelConfig, *, micro_batch_size: int, global_batch: int,
                 schedule: str | None = None, precision: str = "fp32",
                 recompute: str = "none", gradient_sync: str = "end",
                 sequence_parallel: bool = False, tp_comm_overlap: bool = False,
                 optimizer: str = "adam", shard_unit: str = "block",
                 recompute_every: int = 1, grad_reduce: str = "param",
                 stack: str = "megatron", expandable_segments: bool = False,
                 moe: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The :attr:`RunConfig.execution` of a run: the plan's micro-batch (``micro_batch_size
    x dp x dp_shard``, shared by the data-parallel ranks) and its count, the schedule
    (``interleaved-1f1b`` when ``vp > 1``, else ``schedule`` or ``1f1b``) and the training
    settings. A global batch that does not divide is left for :class:`RunConfig` to refuse
    (the count is rounded down here). ``moe``: a mixture of experts' settings
    (``moe_dispatcher``, ``moe_capacity_factor``, ``moe_grouped_gemm``, the recorded
    ``moe_load_balancing``), added as they are; None for a dense model."""
    shared = micro_batch_size * parallel.data_parallel
    if schedule is None:
        schedule = "interleaved-1f1b" if parallel.vp > 1 else "1f1b"
    return {"microbatch_size": shared, "microbatches": max(global_batch // shared, 1),
            "schedule": schedule, "virtual_stages": parallel.vp, "precision": precision,
            "mixed_precision": precision != "fp32", "param_dtype_bytes": 2,
            "recompute": recompute, "gradient_sync": gradient_sync,
            "sequence_parallel": bool(sequence_parallel),
            "tp_comm_overlap": bool(tp_comm_overlap), "optimizer": optimizer,
            "shard_unit": shard_unit, "recompute_every": recompute_every,
            "grad_reduce": grad_reduce, "stack": stack,
            "expandable_segments": bool(expandable_segments), **(moe or {})}
