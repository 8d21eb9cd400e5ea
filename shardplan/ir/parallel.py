"""The LLM plan kind's parallel layout: tensor x pipeline x data / fully sharded x context.

A plan with a :class:`ParallelConfig` (its ``parallel`` field) is laid out as Megatron-LM and
torchtitan lay out a transformer's training: every pipeline rank holds whole transformer
blocks, each block's matrices are split over ``tp`` devices inside a node (attention by heads,
the MLP by its hidden width, the embedding and output head by the vocabulary), the sequence may
be split over ``cp`` devices, and the whole is replicated ``dp`` times and sharded ``dp_shard``
times (FSDP / ZeRO-3 when ``dp_shard > 1``; both: HSDP).

Ranks are numbered as Megatron-LM numbers them (its default order ``tp-cp-dp-pp``): the
tensor-parallel index varies fastest, then context, then the shard index, then the replica,
and the pipeline rank slowest::

    rank = tp_i + tp * (cp_i + cp * (shard_i + dp_shard * (dp_i + dp * pp_i)))

so a tensor-parallel group is ``tp`` consecutive devices (inside one node when ``tp`` divides
the node's GPU count) and a pipeline rank's devices are one contiguous block of
``tp * cp * dp_shard * dp``.

Expert layers (a mixture of experts) have a grid of their own over the same devices, as
Megatron-Core folds it ("parallel folding"): inside each pipeline rank's block of devices the
expert-tensor-parallel index varies fastest, then the expert-parallel index, then the expert
data-parallel replica::

    local = rank % devices_per_rank
    etp_i = local % etp;  ep_i = (local // etp) % ep;  edp_i = local // (etp * ep)

so ``etp * ep`` must divide ``tp * cp * dp_shard * dp``, and each expert-parallel group holds
``experts / ep`` experts per device. ``etp`` None means the dense layers' ``tp`` (Megatron's
default for ``--expert-tensor-parallel-size``).

The plan's stages are its ``pp * vp`` virtual stages in pipeline order; virtual stage ``j`` runs
on pipeline rank ``j % pp`` (interleaved 1F1B with ``vp`` stages per rank, on the same devices),
and its ``devices`` are all the devices of that rank in rank order. ``stage_layers`` gives the
transformer blocks per virtual stage when they are not even (an uneven first or last stage, as
Megatron's ``--decoder-first-pipeline-num-layers`` asks); the embedding goes with the first
virtual stage and the final norm, output head and loss with the last.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from typing import Any

from shardplan.errors import InvalidFileError, ShardplanError

__all__ = ["ParallelConfig", "balanced_stage_layers", "pipeline_split",
           "torchtitan_stage_layers"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelConfig:
    """Degrees of parallelism of an LLM plan (see the module docstring for the rank order).

    Attributes
    ----------
    tp : int
        Tensor-parallel degree (Megatron's ``--tensor-model-parallel-size``).
    pp : int
        Pipeline ranks (``--pipeline-model-parallel-size``).
    dp : int
        Data-parallel replicas, gradients all-reduced (or, under ZeRO-1, reduce-scattered)
        between them (torchtitan's ``data_parallel_replicate_degree``).
    dp_shard : int
        Fully sharded data-parallel degree: parameters, gradients and optimizer state sharded
        over these devices (FSDP2 / ZeRO-3; torchtitan's ``data_parallel_shard_degree``).
    cp : int
        Context-parallel degree: the sequence split over these devices.
    vp : int
        Virtual pipeline stages per pipeline rank (interleaved 1F1B when > 1).
    stage_layers : tuple of int or None
        Transformer blocks per virtual stage in pipeline order (``pp * vp`` entries); None:
        as even as the block count allows.
    ep : int
        Expert-parallel degree: a mixture of experts' routed experts split over ``ep``
        devices of each pipeline rank (``--expert-model-parallel-size``); 1 for a dense model.
    etp : int or None
        Expert tensor-parallel degree (``--expert-tensor-parallel-size``); None: ``tp``.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    dp_shard: int = 1
    cp: int = 1
    vp: int = 1
    stage_layers: tuple[int, ...] | None = None
    ep: int = 1
    etp: int | None = None

    def __post_init__(self) -> None:
        for f in ("tp", "pp", "dp", "dp_shard", "cp", "vp", "ep", "etp"):
            v = getattr(self, f)
            if f == "etp" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ShardplanError(f"parallel {f} must be an integer >= 1, got {v!r}")
        if self.devices_per_rank % (self.expert_tp * self.ep):
            raise ShardplanError(
                f"expert layers need etp x ep = {self.expert_tp} x {self.ep} to divide a "
                f"pipeline rank's {self.devices_per_rank} devices (tp x cp x dp_shard x dp)")
        if self.stage_layers is not None:
            layers = tuple(self.stage_layers)
            if len(layers) != self.pp * self.vp:
                raise ShardplanError(f"stage_layers needs pp x vp = {self.pp * self.vp} "
                                     f"entries, got {len(layers)}")
            if any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in layers):
                raise ShardplanError("stage_layers must be integers >= 0")
            object.__setattr__(self, "stage_layers", layers)

    # ------------------------------------------------------------------ shape
    @property
    def world_size(self) -> int:
        """Devices the layout uses: ``tp * pp * dp * dp_shard * cp``."""
        return self.tp * self.pp * self.dp * self.dp_shard * self.cp

    @property
    def data_parallel(self) -> int:
        """Replicas of the model's batch split: ``dp * dp_shard``."""
        return self.dp * self.dp_shard

    @property
    def devices_per_rank(self) -> int:
        """Devices of one pipeline rank: ``tp * cp * dp_shard * dp``."""
        return self.tp * self.cp * self.dp_shard * self.dp

    @property
    def expert_tp(self) -> int:
        """The expert layers' tensor-parallel degree: ``etp``, or ``tp`` when unset."""
        return self.tp if self.etp is None else self.etp

    @property
    def expert_dp(self) -> int:
        """Expert data-parallel replicas (their gradients are reduced over these):
        ``devices_per_rank / (expert_tp * ep)``."""
        return self.devices_per_rank // (self.expert_tp * self.ep)

    @property
    def is_expert_parallel(self) -> bool:
        """Whether the expert layers have a grid of their own (``ep > 1`` or an ``etp``)."""
        return self.ep > 1 or self.etp is not None

    def expert_coordinates(self, rank: int) -> dict[str, int]:
        """The expert grid's coordinates of a rank: ``etp``, ``ep``, ``edp`` and ``pp``
        (module docstring's order)."""
        pp = self.coordinates(rank)["pp"]
        local = rank % self.devices_per_rank
        return {"etp": local % self.expert_tp, "ep": (local // self.expert_tp) % self.ep,
                "edp": local // (self.expert_tp * self.ep), "pp": pp}

    @property
    def num_stages(self) -> int:
        """Virtual stages in the pipeline: ``pp * vp``."""
        return self.pp * self.vp

    def rank(self, *, tp: int = 0, cp: int = 0, shard: int = 0, dp: int = 0, pp: int = 0) -> int:
        """The global rank of a coordinate (module docstring's order)."""
        return tp + self.tp * (cp + self.cp * (shard + self.dp_shard * (dp + self.dp * pp)))

    def coordinates(self, rank: int) -> dict[str, int]:
        """The inverse of :meth:`rank`."""
        if not 0 <= rank < self.world_size:
            raise ShardplanError(f"rank {rank} outside 0..{self.world_size - 1}")
        out = {}
        for name, size in (("tp", self.tp), ("cp", self.cp), ("shard", self.dp_shard),
                           ("dp", self.dp), ("pp", self.pp)):
            out[name] = rank % size
            rank //= size
        return out

    def layers_per_stage(self, num_layers: int) -> tuple[int, ...]:
        """Transformer blocks of each virtual stage: ``stage_layers``, or as even as possible
        (earlier stages take the remainder). Raises when the counts do not add up."""
        s = self.num_stages
        if self.stage_layers is not None:
            if sum(self.stage_layers) != num_layers:
                raise ShardplanError(f"stage_layers add up to {sum(self.stage_layers)}, the "
                                     f"model has {num_layers} layers")
            return self.stage_layers
        if num_layers < s:
            raise ShardplanError(f"{num_layers} layers cannot fill pp x vp = {s} stages")
        q, r = divmod(num_layers, s)
        return tuple(q + (1 if i < r else 0) for i in range(s))

    def label(self) -> str:
        """``TP 8 x PP 12 x DP 8`` (degrees of 1 left out, ``x VP 2`` when interleaved)."""
        parts = [f"{n} {getattr(self, f)}" for n, f in
                 (("TP", "tp"), ("CP", "cp"), ("PP", "pp"), ("DP", "dp"), ("FSDP", "dp_shard"))
                 if getattr(self, f) > 1]
        if self.vp > 1:
            parts.append(f"VP {self.vp}")
        if self.ep > 1:
            parts.append(f"EP {self.ep}")
        if self.etp is not None and self.etp != self.tp:
            parts.append(f"ETP {self.etp}")
        return " x ".join(parts) or "one device"

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key, default in (("ep", 1), ("etp", None)):  # a dense plan's file as before
            if d[key] == default:
                del d[key]
        if self.stage_layers is None:
            del d["stage_layers"]
        else:
            d["stage_layers"] = list(self.stage_layers)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ParallelConfig:
        if not isinstance(data, Mapping):
            raise InvalidFileError("plan 'parallel' must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidFileError(f"plan 'parallel' has unknown keys: {', '.join(unknown)}")
        kw = dict(data)
        if kw.get("stage_layers") is not None:
            if not isinstance(kw["stage_layers"], list):
                raise InvalidFileError("plan parallel stage_layers must be a list")
            kw["stage_layers"] = tuple(kw["stage_layers"])
        try:
            return cls(**kw)
        except ShardplanError as e:
            raise InvalidFileError(str(e)) from None


def balanced_stage_layers(num_layers: int, stages: int, *, embedding: bool = False,
                          loss: bool = False) -> tuple[int, ...] | None:
    """Blocks per virtual stage when the embedding and / or the loss count as one layer each
    and the ``num_layers (+1) (+1)`` layers are split as evenly as they go, earlier stages
    taking the remainder; the first stage's count less the embedding, the last's less the
    loss. None when that is the even split of the blocks alone.

    The split of Megatron-Core's ``--account-for-embedding-in-pipeline-split`` /
    ``--account-for-loss-in-pipeline-split`` (which require the sum to divide evenly: the
    caller checks) and of Megatron-DeepSpeed's ``--pp-partition-method
    type:transformer|embedding`` (DeepSpeed's ``PipelineModule`` balancing the two
    embedding layers with the blocks, a remainder going to the first stages as DeepSpeed's
    ``partition_uniform`` gives it). O(stages).

    Raises
    ------
    ShardplanError
        A stage would hold fewer than zero blocks.

    Examples
    --------
    >>> balanced_stage_layers(126, 64, embedding=True, loss=True)[:3]
    (1, 2, 2)
    >>> balanced_stage_layers(70, 12, embedding=True, loss=True)
    (5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 5)
    >>> balanced_stage_layers(72, 12) is None
    True
    """
    counts = _dealt(num_layers, stages, int(embedding), int(loss))
    if min(counts) < 0:
        raise ShardplanError(f"{num_layers} layers cannot fill {stages} pipeline stages with "
                             f"the embedding and the loss counted as layers")
    out = tuple(counts)
    return None if len(set(out)) == 1 else out


def _dealt(num_layers: int, stages: int, first: int, last: int) -> list[int]:
    """Blocks per stage when ``num_layers + first + last`` weighted layers are dealt out
    evenly, earlier stages taking the remainder, and the first and last stages hold
    ``first`` and ``last`` fewer blocks (the embedding's and the head's weights). O(stages)."""
    q, r = divmod(num_layers + first + last, stages)
    counts = [q + (1 if i < r else 0) for i in range(stages)]
    counts[0] -= first
    counts[-1] -= last
    return counts


@lru_cache(maxsize=4096)
def pipeline_split(num_layers: int, pp: int, vp: int = 1) -> tuple[bool, tuple[int, ...] | None]:
    """A split of ``num_layers`` blocks over ``pp x vp`` virtual stages that Megatron-LM and
    torchtitan can both express: ``(True, None)`` when they divide evenly; else the split with
    the embedding and the loss counted as one layer each when that divides
    (:func:`balanced_stage_layers`; Megatron-Core's ``--account-for-embedding/loss-in-
    pipeline-split``); else the first and last pipeline rank holding fewer blocks, the middle
    ones ``k`` each, the smallest ``k`` that allows it (Megatron's
    ``--decoder-first/last-pipeline-num-layers``), every rank's blocks dividing over its
    ``vp`` virtual stages; else :func:`_layout_split` (a pipeline layout, the last stage
    possibly the loss alone); ``(False, None)`` when none exists or another stage would be
    empty.
    O(pp vp + num_layers / vp), cached: a search asks for each shape many times.

    Examples
    --------
    >>> pipeline_split(126, 8, 1)[1][:2], pipeline_split(126, 8, 1)[1][-1]
    ((15, 16), 15)
    >>> pipeline_split(31, 5, 1)
    (True, (5, 7, 7, 7, 5))
    >>> pipeline_split(126, 64, 2), pipeline_split(32, 4, 2)
    ((False, None), (True, None))
    >>> pipeline_split(61, 8, 4)[1][:3], pipeline_split(61, 8, 4)[1][-2:]  # DeepSeek-V3's
    ((1, 2, 2), (2, 0))
    """
    stages = pp * vp
    if num_layers < stages:
        return False, None
    if num_layers % stages == 0:
        return True, None
    if (num_layers + 2) % stages == 0:
        split = balanced_stage_layers(num_layers, stages, embedding=True, loss=True)
        if split is not None and min(split) > 0:
            return True, split
    if pp < 3:
        return _layout_split(num_layers, stages)
    # the lightest middle ranks that leave the first and last rank no more than they hold
    # (k >= num_layers / pp), so the busiest rank holds as little as it can
    k0 = vp * -(-num_layers // (pp * vp))
    for k in range(k0, num_layers + 1, vp):
        ends = num_layers - (pp - 2) * k
        if ends < 2 * vp:
            break
        if ends % 2 or (ends // 2) % vp or ends // 2 > k:
            continue
        per_rank = [ends // 2] + [k] * (pp - 2) + [ends // 2]
        return True, tuple(per_rank[j % pp] // vp for j in range(stages))
    return _layout_split(num_layers, stages)


def _layout_split(num_layers: int, stages: int) -> tuple[bool, tuple[int, ...] | None]:
    """The last resort of :func:`pipeline_split`: the blocks dealt out evenly with the
    embedding and the loss counted as one layer each (torchtitan's own split, and a
    Megatron-Core ``--pipeline-model-parallel-layout`` such as DeepSeek-V3's
    ``Et|(tt|)*30mL``), the last stage possibly holding the loss alone; ``(False, None)``
    when another stage would be empty."""
    counts = _dealt(num_layers, stages, 1, 1)
    if min(counts[:-1]) > 0 and counts[-1] >= 0:
        return True, tuple(counts)
    return False, None


def torchtitan_stage_layers(num_layers: int, num_stages: int, *, first_less: int = 1,
                            last_less: int = 1) -> tuple[int, ...]:
    """Blocks per virtual stage as torchtitan splits a decoder (its
    ``_generate_llm_fqn_per_model_part``, the same in 0.2.x and 0.3.0): the embedding counts
    as ``first_less`` layers and the final norm with the output head as ``last_less``
    (``pipeline_parallel_first/last_stage_less_layers``, 1 by default); the
    ``num_layers + first_less + last_less`` layers are dealt out evenly, earlier stages
    taking the remainder, and the first and last stages hold that many fewer blocks. One
    stage holds everything. O(stages).

    With weights of one each it is :func:`balanced_stage_layers` with the embedding and the
    loss counted (which returns None for an even split).

    Raises
    ------
    ShardplanError
        What torchtitan refuses: more stages than weighted layers, or a weight above the
        fewest layers a stage gets.

    Examples
    --------
    >>> torchtitan_stage_layers(126, 8)  # Llama 3.1 405B on PP 8, one stage per rank
    (15, 16, 16, 16, 16, 16, 16, 15)
    >>> torchtitan_stage_layers(126, 16)[:3]  # Interleaved1F1B's default 2 stages per rank
    (7, 8, 8)
    >>> torchtitan_stage_layers(32, 4, first_less=0, last_less=0)
    (8, 8, 8, 8)
    """
    if num_stages < 1:
        raise ShardplanError("torchtitan needs at least one pipeline stage")
    if num_stages == 1:
        return (num_layers,)
    total = num_layers + first_less + last_less
    if num_stages > total:
        raise ShardplanError(f"torchtitan cannot make {num_stages} pipeline stages of "
                             f"{num_layers} layers with the embedding and output counted as "
                             f"{first_less} and {last_less} ({total})")
    q = total // num_stages
    if first_less > q or last_less > q:
        raise ShardplanError(f"torchtitan's first/last stage weights ({first_less}, "
                             f"{last_less}) exceed the {q} layers a stage gets")
    counts = _dealt(num_layers, num_stages, first_less, last_less)
    # torchtitan deals blocks out while any are left: a last stage short of blocks gets fewer
    left = num_layers
    out = []
    for c in counts:
        out.append(min(c, left))
        left -= out[-1]
    return tuple(out)
