"""Megatron-LM's mixture-of-experts, multi-latent attention and pipeline-layout arguments,
read for :func:`shardplan.importers.megatron.parse_megatron`.

The names and defaults are Megatron-LM's ``megatron/training/arguments.py`` (``_add_moe_args``,
``_add_mla_args``) of the megatron-core 0.16 era, the checks those of its ``validate_args`` and
of megatron-core's ``TransformerConfig`` / ``ModelParallelConfig`` (pinned in
requirements.txt, where the tests run them):

- the experts: ``--num-experts`` (0: none), ``--moe-router-topk`` (2), ``--moe-ffn-hidden-size``
  (default ``--ffn-hidden-size``), ``--moe-shared-expert-intermediate-size`` (shared experts of
  the routed experts' width), ``--moe-layer-freq`` (the dense layers first, as DeepSeek-V3's
  ``([0]*3+[1]*58)``), a gated MLP (``--swiglu``, or GPT-OSS's ``--quick-geglu`` with
  ``--activation-func-clamp-value``), biases on unless ``--disable-bias-linear``;
- the router: ``--moe-router-score-function`` softmax or sigmoid, ``--moe-router-pre-softmax``
  (softmax over all experts: the chosen scores are not renormalised),
  ``--moe-router-num-groups`` with ``--moe-router-group-topk``,
  ``--moe-router-topk-scaling-factor``;
- attention: ``--multi-latent-attention`` with ``--q-lora-rank`` (none), ``--kv-lora-rank``
  (32), ``--qk-head-dim`` (128), ``--qk-pos-emb-head-dim`` (64), ``--v-head-dim`` (128); else
  grouped queries with ``--kv-channels``, ``--qk-layernorm``, ``--softmax-type learnable``
  (attention sinks) and ``--window-size L,0`` on every other layer
  (``--window-attn-skip-freq 2``), read as a window of ``L`` tokens as Megatron-Bridge writes
  GPT-OSS's 128;
- the expert grid: ``--expert-model-parallel-size``, ``--expert-tensor-parallel-size`` (one
  equal to the tensor-parallel size is the default, recorded as unset);
- the settings: ``--moe-token-dispatcher-type`` (allgather, Megatron-LM's default, or alltoall;
  ``flex`` -- DeepEP's or HybridEP's kernels -- moves the tokens as the all-to-all does and is
  read as ``alltoall`` with a note), ``--moe-expert-capacity-factor`` (negative: dropless, as
  Megatron-Core reads it), ``--moe-grouped-gemm``, ``--moe-router-load-balancing-type``
  (recorded for the exports, not priced: shardplan prices balanced routing);
- ``--pipeline-model-parallel-layout`` (Megatron-Core's ``E``, ``t``, ``m``, ``L`` per stage,
  ``|`` between stages, ``(...)*n`` and ``x*n`` repetition): the blocks per virtual stage.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from shardplan.errors import ShardplanError
from shardplan.importers._moe import layer_pattern, moe_model
from shardplan.importers._run import ModelDims

__all__ = ["MOE_IGNORED_FLAGS", "MOE_IGNORED_VALUES", "MOE_LISTS", "MOE_SWITCHES", "MOE_VALUES",
           "expert_grid", "layout_stages", "moe_dims", "moe_settings"]

#: Switches read here.
MOE_SWITCHES = frozenset({
    "--moe-grouped-gemm", "--multi-latent-attention", "--qk-layernorm", "--disable-bias-linear",
    "--add-qkv-bias", "--quick-geglu", "--moe-router-pre-softmax", "--moe-enable-deepep",
    "--moe-router-enable-expert-bias", "--moe-router-force-load-balancing",
    "--overlap-moe-expert-parallel-comm"})
#: Arguments with one value read here.
MOE_VALUES = frozenset({
    "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size",
    "--moe-shared-expert-intermediate-size", "--moe-layer-freq", "--expert-model-parallel-size",
    "--expert-tensor-parallel-size", "--moe-token-dispatcher-type",
    "--moe-expert-capacity-factor", "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim",
    "--qk-pos-emb-head-dim", "--v-head-dim", "--moe-router-score-function",
    "--moe-router-num-groups", "--moe-router-group-topk", "--moe-router-topk-scaling-factor",
    "--softmax-type", "--window-size", "--window-attn-skip-freq",
    "--activation-func-clamp-value", "--pipeline-model-parallel-layout", "--mtp-num-layers"})
#: Arguments with one or more values (``nargs='+'``) read here.
MOE_LISTS = frozenset({"--moe-router-load-balancing-type"})
#: Switches that change nothing shardplan models (fused kernels, logging).
MOE_IGNORED_FLAGS = frozenset({
    "--moe-use-legacy-grouped-gemm", "--moe-router-fusion", "--moe-permute-fusion",
    "--moe-per-layer-logging",
    "--moe-router-padding-for-fp8", "--moe-router-padding-for-quantization"})
#: Arguments with values that change nothing shardplan models (loss coefficients, the
#: expert bias's update rate, rotary scaling, kernel tuning).
MOE_IGNORED_VALUES = frozenset({
    "--moe-aux-loss-coeff", "--moe-z-loss-coeff", "--moe-input-jitter-eps", "--moe-router-dtype",
    "--moe-router-bias-update-rate", "--moe-token-drop-policy", "--moe-deepep-num-sms",
    "--moe-hybridep-num-sms", "--moe-flex-dispatcher-backend", "--rotary-scaling-factor",
    "--mscale", "--mscale-all-dim", "--glu-linear-offset", "--rope-type"})

_LOAD_BALANCING = ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none")
#: Arguments of the experts that do nothing without ``--num-experts``.
_NEEDS_EXPERTS = ("--moe-router-topk", "--moe-ffn-hidden-size",
                  "--moe-shared-expert-intermediate-size", "--moe-layer-freq",
                  "--moe-token-dispatcher-type", "--moe-expert-capacity-factor",
                  "--moe-grouped-gemm", "--moe-router-load-balancing-type",
                  "--multi-latent-attention")


def _int(name: str, args: Mapping[str, list[str]], default: int | None = None,
         minimum: int = 1) -> int:
    from shardplan._limits import parse_count

    if name not in args:
        assert default is not None, name
        return default
    kind = "degree" if "parallel" in name else "layers" if "layers" in name else "width"
    return parse_count(name, args[name][0], kind, minimum)


def _float(name: str, args: Mapping[str, list[str]]) -> float | None:
    if name not in args:
        return None
    try:
        return float(args[name][0])
    except ValueError:
        raise ShardplanError(f"{name} takes a number, got {args[name][0]!r}") from None


def has_experts(args: Mapping[str, list[str]], notes: list[str]) -> bool:
    """Whether the arguments build a mixture of experts (``--num-experts`` above 0, as
    Megatron-LM reads 0 as none); a note for each argument of the experts given without."""
    if "--num-experts" in args and _int("--num-experts", args, minimum=0) > 0:
        return True
    notes += [f"{a} without --num-experts does nothing" for a in _NEEDS_EXPERTS if a in args]
    return False


def moe_dims(args: Mapping[str, list[str]], dims: Mapping[str, int], notes: list[str]
             ) -> ModelDims:
    """The mixture of experts the arguments build (module docstring); ``dims`` holds the
    model's ``hidden``, ``layers``, ``heads``, ``kv_heads``, ``ffn``, ``vocab`` and ``seq`` as
    the dense arguments give them.

    Raises
    ------
    ShardplanError
        An MLP without gating, a pattern of dense and expert layers other than the dense ones
        first, shared experts not a whole number of routed experts' width, a sliding window
        on other layers than every other one, what Megatron-LM refuses (top-1 softmax routing
        without ``--moe-router-pre-softmax``, group top-k without groups, the expert bias
        without sigmoid scores), a model that does not fit together.
    """
    if "--swiglu" not in args and "--quick-geglu" not in args:
        raise ShardplanError("shardplan's mixtures of experts have gated experts: give "
                             "--swiglu (or --quick-geglu)")
    bias = "--disable-bias-linear" not in args
    experts = _int("--num-experts", args)
    # the model's own check refuses these too; here in the arguments' own names
    topk = _int("--moe-router-topk", args, 2)
    if topk > experts:
        raise ShardplanError(f"--moe-router-topk {topk} is above --num-experts {experts}")
    if "--moe-router-num-groups" in args:
        groups = _int("--moe-router-num-groups", args)
        if experts % groups:
            raise ShardplanError(f"--moe-router-num-groups {groups} does not divide "
                                 f"--num-experts {experts}")
        chosen = _int("--moe-router-group-topk", args, 1)
        if chosen > groups:
            raise ShardplanError(f"--moe-router-group-topk {chosen} is above "
                                 f"--moe-router-num-groups {groups}")
    moe_ffn = _int("--moe-ffn-hidden-size", args, dims["ffn"])
    first = _first_dense(args, dims["layers"])
    values: dict[str, Any] = {
        "dim": dims["hidden"], "n_layers": dims["layers"], "n_heads": dims["heads"],
        "vocab_size": dims["vocab"], "num_experts": experts, "moe_dim": moe_ffn,
        "first_k_dense": first, "dense_ffn_dim": dims["ffn"] if first else 0,
        "num_shared_experts": _shared(args, moe_ffn), "router_bias": bias,
        "expert_bias": bias, "swiglu_limit": _float("--activation-func-clamp-value", args),
        **_attention(args, dims, bias, notes), **_router(args, experts)}
    return moe_model(values, dims["seq"])


def _first_dense(args: Mapping[str, list[str]], layers: int) -> int:
    """The leading dense layers of ``--moe-layer-freq`` (refused: any other pattern)."""
    text = args.get("--moe-layer-freq", ["1"])[0]
    pattern = layer_pattern(text, layers)
    first = pattern.index(1) if 1 in pattern else layers
    if 0 in pattern[first:]:
        raise ShardplanError(f"shardplan's mixtures of experts have their dense layers first "
                             f"(--moe-layer-freq like ([0]*3+[1]*58)), not {text}")
    return first


def _shared(args: Mapping[str, list[str]], moe_ffn: int) -> int:
    if "--moe-shared-expert-intermediate-size" not in args:
        return 0
    size = _int("--moe-shared-expert-intermediate-size", args)
    if size % moe_ffn:
        raise ShardplanError(f"--moe-shared-expert-intermediate-size {size} is not a whole "
                             f"number of experts of --moe-ffn-hidden-size {moe_ffn} (shardplan's "
                             f"shared experts have the routed experts' width)")
    return size // moe_ffn


def _attention(args: Mapping[str, list[str]], dims: Mapping[str, int], bias: bool,
               notes: list[str]) -> dict[str, Any]:
    """The attention fields: multi-head latent attention, or grouped queries."""
    if "--multi-latent-attention" in args:
        if bias:
            notes.append("biases of multi-latent attention's projections are not modelled")
        return {"attention": "mla", "q_lora_rank": _int("--q-lora-rank", args, 0, 0),
                "kv_lora_rank": _int("--kv-lora-rank", args, 32),
                "qk_nope_head_dim": _int("--qk-head-dim", args, 128),
                "qk_rope_head_dim": _int("--qk-pos-emb-head-dim", args, 64),
                "v_head_dim": _int("--v-head-dim", args, 128)}
    for name in ("--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim",
                 "--v-head-dim"):
        if name in args:
            notes.append(f"{name} without --multi-latent-attention does nothing")
    if "--add-qkv-bias" in args and not bias:
        notes.append("--add-qkv-bias (biases on the query, key and value projections alone) "
                     "is not modelled")
    softmax = args.get("--softmax-type", ["vanilla"])[0]
    if softmax not in ("vanilla", "off-by-one", "learnable"):
        raise ShardplanError(f"--softmax-type is vanilla, off-by-one or learnable, got "
                             f"{softmax!r}")
    if softmax == "off-by-one":
        notes.append("--softmax-type off-by-one is modelled as the plain softmax")
    head_dim = _int("--kv-channels", args, 0, 0) or None
    return {"attention": "gqa", "n_kv_heads": dims["kv_heads"], "head_dim": head_dim,
            "qk_norm": "--qk-layernorm" in args, "attn_bias": bias,
            "attn_sinks": softmax == "learnable", "sliding_window": _window(args)}


def _window(args: Mapping[str, list[str]]) -> int | None:
    """The sliding window of ``--window-size L,0`` on every other layer, or None."""
    if "--window-size" not in args:
        return None
    text = args["--window-size"][0]
    parts = text.strip("()").split(",")
    try:
        left, right = (int(p) for p in parts)
    except ValueError:
        raise ShardplanError(f"--window-size is LEFT,RIGHT (128,0), got {text!r}") from None
    if left < 0:  # -1: an infinite window, plain causal attention
        return None
    if right != 0:
        raise ShardplanError(f"--window-size {text}: a causal decoder sees no later token "
                             f"(RIGHT 0)")
    skip = args.get("--window-attn-skip-freq", [None])[0]
    if skip != "2":
        raise ShardplanError("shardplan's mixtures of experts slide the window on every other "
                             "layer: give --window-attn-skip-freq 2")
    return max(left, 1)


def _router(args: Mapping[str, list[str]], experts: int) -> dict[str, Any]:
    """The router's fields, with Megatron-Core's checks of them."""
    score = args.get("--moe-router-score-function", ["softmax"])[0]
    if score not in ("softmax", "sigmoid"):
        raise ShardplanError(f"--moe-router-score-function is softmax or sigmoid, got "
                             f"{score!r}")
    top_k = _int("--moe-router-topk", args, 2)
    pre = "--moe-router-pre-softmax" in args
    balancing = args.get("--moe-router-load-balancing-type", ["aux_loss"])
    if top_k == 1 and score == "softmax" and not pre and "sinkhorn" not in balancing:
        raise ShardplanError("Megatron-LM refuses top-1 softmax routing without "
                             "--moe-router-pre-softmax (the gradient of a softmax over one "
                             "score is zero)")
    if "--moe-router-enable-expert-bias" in args and score != "sigmoid":
        raise ShardplanError("--moe-router-enable-expert-bias needs "
                             "--moe-router-score-function sigmoid, as Megatron-LM says")
    groups, chosen = 1, 1
    if "--moe-router-group-topk" in args:
        if "--moe-router-num-groups" not in args:
            raise ShardplanError("--moe-router-group-topk needs --moe-router-num-groups")
        groups = _int("--moe-router-num-groups", args)
        chosen = _int("--moe-router-group-topk", args)
    scale = _float("--moe-router-topk-scaling-factor", args)
    return {"top_k": top_k, "score_func": score, "route_norm": not (pre and score == "softmax"),
            "route_scale": 1.0 if scale is None else scale, "n_groups": groups,
            "topk_groups": chosen}


def expert_grid(args: Mapping[str, list[str]], tp: int, *, biases: bool) -> tuple[int, int | None]:
    """``(ep, etp)``: ``--expert-model-parallel-size`` and ``--expert-tensor-parallel-size``,
    the latter None when not given or equal to ``tp`` (Megatron-Core's default).

    Raises
    ------
    ShardplanError
        Biases in the experts with an expert tensor-parallel size above 1 (megatron-core's
        ``TransformerConfig``: "Bias in Moe is only supported when ETP==1").
    """
    ep = _int("--expert-model-parallel-size", args, 1)
    etp = _int("--expert-tensor-parallel-size", args, tp)
    if biases and etp > 1:
        raise ShardplanError(f"megatron-core keeps biases in the experts only with expert "
                             f"tensor parallelism 1, and it is {etp}: give "
                             f"--disable-bias-linear or --expert-tensor-parallel-size 1")
    return ep, None if etp == tp else etp


def moe_settings(args: Mapping[str, list[str]], notes: list[str]) -> dict[str, Any]:
    """The execution settings of a mixture of experts (module docstring)."""
    dispatcher = args.get("--moe-token-dispatcher-type", ["allgather"])[0]
    if dispatcher not in ("allgather", "alltoall", "flex"):
        raise ShardplanError(f"--moe-token-dispatcher-type is allgather, alltoall or flex, "
                             f"got {dispatcher!r}")
    if "--moe-enable-deepep" in args and dispatcher != "flex":
        raise ShardplanError("--moe-enable-deepep needs --moe-token-dispatcher-type flex, as "
                             "megatron-core says")
    if dispatcher == "flex":
        notes.append("--moe-token-dispatcher-type flex (DeepEP's or HybridEP's kernels) moves "
                     "each token to its experts' ranks and back as alltoall does: modelled as "
                     "alltoall")
        dispatcher = "alltoall"
    balancing = args.get("--moe-router-load-balancing-type", ["aux_loss"])
    for b in balancing:
        if b not in _LOAD_BALANCING:
            raise ShardplanError(f"--moe-router-load-balancing-type is one of "
                                 f"{', '.join(_LOAD_BALANCING)}, got {b!r}")
    capacity = _float("--moe-expert-capacity-factor", args)
    if capacity is not None and capacity < 0:
        capacity = None  # megatron-core: a negative capacity factor is dropless
    elif capacity == 0:
        raise ShardplanError("--moe-expert-capacity-factor 0 drops every token (negative: "
                             "dropless)")
    if capacity is not None and "sinkhorn" in balancing:
        raise ShardplanError("--moe-expert-capacity-factor works with aux_loss, seq_aux_loss, "
                             "global_aux_loss or none load balancing, as megatron-core says")
    out: dict[str, Any] = {"moe_dispatcher": dispatcher, "moe_capacity_factor": capacity,
                           "moe_grouped_gemm": "--moe-grouped-gemm" in args,
                           "moe_force_balance": "--moe-router-force-load-balancing" in args,
                           "moe_a2a_overlap": "--overlap-moe-expert-parallel-comm" in args}
    if "--moe-router-load-balancing-type" in args:
        out["moe_load_balancing"] = ",".join(balancing)
        notes.append(f"--moe-router-load-balancing-type {' '.join(balancing)} is recorded, not "
                     f"priced: shardplan prices the published wait for the busiest expert "
                     f"rank (shardplan/cost/_llm_moe.py), none under "
                     f"--moe-router-force-load-balancing")
    return out


_LAYOUT_GROUP = re.compile(r"\(([^()]*)\)\*(\d+)")
_LAYOUT_REPEAT = re.compile(r"([ELtm])\*(\d+)")


def _layout_stages_text(text: str) -> list[str]:
    """The stages of a layout string, repetitions unrolled (``Et|(tt|)*2L`` -> ``["Et",
    "tt", "tt", "L"]``)."""
    expr = text.replace(",", "").replace(" ", "")
    if re.search(r"[^ELtm|()*\d]", expr):
        raise ShardplanError(f"--pipeline-model-parallel-layout holds E, t, m, L, |, (...)*n "
                             f"and x*n only, got {text!r}")
    for _ in range(len(expr)):
        m = _LAYOUT_GROUP.search(expr)
        if m is None:
            break
        expr = expr[:m.start()] + m.group(1) * int(m.group(2)) + expr[m.end():]
    expr = _LAYOUT_REPEAT.sub(lambda m: m.group(1) * int(m.group(2)), expr)
    if re.search(r"[()*\d]", expr):
        raise ShardplanError(f"--pipeline-model-parallel-layout {text!r}: cannot unroll its "
                             f"repetitions")
    return expr.split("|")


def layout_stages(text: str, pp: int, num_layers: int, mtp: int, notes: list[str]
                  ) -> tuple[int, tuple[int, ...] | None]:
    """``(vp, stage_layers)`` of a ``--pipeline-model-parallel-layout``: the virtual stages
    per pipeline rank and the blocks (``t``) of each virtual stage in pipeline order (None
    when even), checked as megatron-core's ``PipelineParallelLayerLayout`` checks it. MTP
    layers (``m``) are not modelled (a note). O(length of the unrolled layout).

    Raises
    ------
    ShardplanError
        Stages not a multiple of ``pp``, the embedding (``E``) not first in the first stage
        or the loss (``L``) not last in the last, decoder layers other than ``num_layers``,
        MTP layers other than ``--mtp-num-layers`` or before a decoder layer.

    Examples
    --------
    >>> layout_stages("Et|(tt|)*2mL", 2, 5, 1, [])
    (2, (1, 2, 2, 0))
    """
    stages = _layout_stages_text(text)
    flat = "".join(stages)
    name = "--pipeline-model-parallel-layout"
    if len(stages) % pp:
        raise ShardplanError(f"{name} has {len(stages)} stages, not a multiple of the {pp} "
                             f"pipeline ranks")
    if not stages[0].startswith("E") or flat.count("E") != 1:
        raise ShardplanError(f"{name} starts with the embedding (E), once")
    if not stages[-1].endswith("L") or flat.count("L") != 1:
        raise ShardplanError(f"{name} ends with the loss (L), once")
    if flat.count("t") != num_layers:
        raise ShardplanError(f"{name} places {flat.count('t')} decoder layers (t), the model "
                             f"has {num_layers}")
    if flat.count("m") != mtp:
        raise ShardplanError(f"{name} places {flat.count('m')} MTP layers (m), "
                             f"--mtp-num-layers is {mtp}")
    if "m" in flat and "t" in flat[flat.index("m"):]:
        raise ShardplanError(f"{name} places decoder layers after the MTP layers")
    counts = tuple(s.count("t") for s in stages)
    return len(stages) // pp, None if len(set(counts)) == 1 else counts
