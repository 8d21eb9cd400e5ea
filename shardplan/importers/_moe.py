"""Mixtures of experts as the importers name them: a zoo flavor and its overrides.

The zoo's MoE models (``shardplan/workload/moe.py``, which imports torch) are named by a flavor
and ``MoEConfig`` overrides (``deepseek_v3:671B,n_layers=4``). An importer reads a run's
architecture into the config's fields (Megatron-LM's ``--num-experts`` ... arguments,
torchtitan's flavors) and this module names it: the family by what no other family has
(multi-head latent attention: ``deepseek_v3``; attention sinks, a sliding window or a clamped
SwiGLU: ``gpt_oss``; per-head query/key norms: ``qwen3_moe``; else ``mixtral``), then the
family's flavor the fewest fields differ from, those fields written as overrides.

:data:`MOE_FLAVORS` is the zoo's table written out without torch, for the fields that give a
parameter count, a matrix product's shape or the routing (``tests/importers/test_moe.py``
checks it against the zoo's own); the zoo's numerical settings (``norm_eps``, ``rope_theta``,
``max_seq_len``) and its graph's ``capacity_factor`` are the flavor's and are never
overridden from a run. The run's expert capacity is an execution setting
(:attr:`~shardplan.ir.ExecutionSettings.moe_capacity_factor`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from shardplan.errors import ShardplanError
from shardplan.importers._run import MOE_FAMILIES, ModelDims, MoEDims

__all__ = ["MOE_DEFAULTS", "MOE_FLAVORS", "check_moe", "flavor_model", "layer_pattern",
           "moe_model"]

#: ``MoEConfig``'s defaults of the fields a run's architecture sets, in the config's order.
MOE_DEFAULTS: dict[str, Any] = {
    "dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": None, "head_dim": None,
    "vocab_size": 32000, "attention": "gqa", "qk_norm": False, "attn_bias": False,
    "attn_sinks": False, "sliding_window": None, "q_lora_rank": 0, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "first_k_dense": 0,
    "dense_ffn_dim": 0, "num_experts": 8, "top_k": 2, "moe_dim": 14336,
    "num_shared_experts": 0, "score_func": "softmax", "route_norm": True, "route_scale": 1.0,
    "n_groups": 1, "topk_groups": 1, "router_bias": False, "expert_bias": False,
    "swiglu_limit": None}

_MIXTRAL = {"n_heads": 32, "n_kv_heads": 8, "num_experts": 8, "top_k": 2, "vocab_size": 32000}
_QWEN3 = {"n_kv_heads": 4, "head_dim": 128, "qk_norm": True, "num_experts": 128, "top_k": 8,
          "vocab_size": 151936}
_DSV3 = {"attention": "mla", "score_func": "sigmoid", "route_norm": True}
_GPT_OSS = {"n_heads": 64, "n_kv_heads": 8, "head_dim": 64, "attn_bias": True,
            "attn_sinks": True, "sliding_window": 128, "top_k": 4, "router_bias": True,
            "expert_bias": True, "swiglu_limit": 7.0, "vocab_size": 201088}

#: The zoo's flavors (``shardplan.workload.moe.FLAVORS``, whose sources it names), the fields
#: that differ from :data:`MOE_DEFAULTS`; published flavors before each family's ``debug``.
MOE_FLAVORS: dict[str, dict[str, Any]] = {
    "mixtral:8x7B": {"dim": 4096, "n_layers": 32, "moe_dim": 14336, **_MIXTRAL},
    "mixtral:8x22B": {"dim": 6144, "n_layers": 56, "moe_dim": 16384,
                      **{**_MIXTRAL, "n_heads": 48, "vocab_size": 32768}},
    "mixtral:debug": {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
                      "vocab_size": 256, "num_experts": 4, "top_k": 2, "moe_dim": 96},
    "deepseek_v3:671B": {"dim": 7168, "n_layers": 61, "n_heads": 128, "vocab_size": 129280,
                         "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                         "qk_rope_head_dim": 64, "v_head_dim": 128, "first_k_dense": 3,
                         "dense_ffn_dim": 18432, "num_experts": 256, "top_k": 8,
                         "moe_dim": 2048, "num_shared_experts": 1, "n_groups": 8,
                         "topk_groups": 4, "route_scale": 2.5, **_DSV3},
    "deepseek_v3:debug": {"dim": 64, "n_layers": 3, "n_heads": 4, "vocab_size": 256,
                          "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16,
                          "qk_rope_head_dim": 8, "v_head_dim": 16, "first_k_dense": 1,
                          "dense_ffn_dim": 128, "num_experts": 8, "top_k": 2, "moe_dim": 32,
                          "num_shared_experts": 1, "n_groups": 2, "topk_groups": 1,
                          "route_scale": 2.5, **_DSV3},
    "qwen3_moe:30B-A3B": {"dim": 2048, "n_layers": 48, "n_heads": 32, "moe_dim": 768,
                          **_QWEN3},
    "qwen3_moe:235B-A22B": {"dim": 4096, "n_layers": 94, "n_heads": 64, "moe_dim": 1536,
                            **_QWEN3},
    "qwen3_moe:debug": {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
                        "head_dim": 32, "qk_norm": True, "vocab_size": 256, "num_experts": 8,
                        "top_k": 2, "moe_dim": 32},
    "gpt_oss:120B": {"dim": 2880, "n_layers": 36, "num_experts": 128, "moe_dim": 2880,
                     **_GPT_OSS},
    "gpt_oss:debug": {"dim": 64, "n_layers": 2, "num_experts": 4, "moe_dim": 64,
                      **{**_GPT_OSS, "vocab_size": 256, "n_heads": 4, "n_kv_heads": 2,
                         "head_dim": 16, "top_k": 2, "sliding_window": 4}},
}

_MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
               "v_head_dim")
_GQA_FIELDS = ("n_kv_heads", "head_dim", "qk_norm", "attn_bias", "attn_sinks",
               "sliding_window")


def _full(values: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(values) - set(MOE_DEFAULTS))
    if unknown:
        raise ShardplanError(f"unknown mixture-of-experts field {unknown[0]!r}")
    return {**MOE_DEFAULTS, **values}


def _shape(values: Mapping[str, Any]) -> dict[str, Any]:
    """The fields that decide the model, with defaults resolved (``n_kv_heads`` None: the
    heads; ``head_dim`` None: ``dim / n_heads``) and those of the other attention dropped."""
    out = dict(values)
    if out["attention"] == "mla":
        for f in _GQA_FIELDS:
            out.pop(f)
    else:
        out["n_kv_heads"] = out["n_kv_heads"] or out["n_heads"]
        out["head_dim"] = out["head_dim"] or out["dim"] // out["n_heads"]
        for f in _MLA_FIELDS:
            out.pop(f)
    if not out["first_k_dense"]:
        out.pop("dense_ffn_dim")
    return out


def check_moe(values: Mapping[str, Any]) -> dict[str, Any]:
    """The full field set of ``values`` (the defaults under it), checked as the zoo's
    ``MoEConfig`` checks it; one line naming the first field that does not fit.

    Raises
    ------
    ShardplanError
        A size below one, top-k above the experts, routing groups that do not divide the
        experts, more dense layers than layers, heads that do not divide into query groups.
    """
    v = _full(values)
    for f in ("dim", "n_layers", "n_heads", "vocab_size", "num_experts", "top_k", "moe_dim",
              "n_groups", "topk_groups", "kv_lora_rank", "qk_nope_head_dim",
              "qk_rope_head_dim", "v_head_dim"):
        if isinstance(v[f], bool) or not isinstance(v[f], int) or v[f] < 1:
            raise ShardplanError(f"mixture of experts: {f} must be an integer >= 1, "
                                 f"got {v[f]!r}")
    if v["top_k"] > v["num_experts"]:
        raise ShardplanError(f"{v['top_k']} experts per token exceed the {v['num_experts']} "
                             f"experts")
    groups, chosen = v["n_groups"], v["topk_groups"]
    if v["num_experts"] % groups or chosen > groups or \
            v["top_k"] > chosen * (v["num_experts"] // groups):
        raise ShardplanError(f"group-limited routing does not fit: {v['num_experts']} experts "
                             f"in {groups} groups, {chosen} chosen, top-{v['top_k']}")
    if v["first_k_dense"] > v["n_layers"]:
        raise ShardplanError(f"{v['first_k_dense']} dense layers exceed the {v['n_layers']} "
                             f"layers")
    if v["first_k_dense"] and not v["dense_ffn_dim"]:
        raise ShardplanError("the dense layers of the mixture of experts need an FFN width")
    if v["attention"] == "gqa":
        kv = v["n_kv_heads"] or v["n_heads"]
        if v["n_heads"] % kv:
            raise ShardplanError(f"{v['n_heads']} attention heads do not divide into {kv} "
                                 f"query groups")
        if v["head_dim"] is None and v["dim"] % v["n_heads"]:
            raise ShardplanError(f"hidden size {v['dim']} is not a multiple of the "
                                 f"{v['n_heads']} attention heads (give the head width)")
    return v


def _family(v: Mapping[str, Any]) -> str:
    """The zoo family by the feature only it has (module docstring)."""
    if v["attention"] == "mla":
        return "deepseek_v3"
    if v["attn_sinks"] or v["sliding_window"] is not None or v["swiglu_limit"] is not None:
        return "gpt_oss"
    return "qwen3_moe" if v["qk_norm"] else "mixtral"


def _overrides(v: Mapping[str, Any], flavor: str) -> tuple[tuple[str, Any], ...]:
    base = _shape(_full(MOE_FLAVORS[flavor]))
    want = _shape(v)
    return tuple((f, want[f]) for f in MOE_DEFAULTS
                 if f in want and (f not in base or want[f] != base[f]))


def moe_model(values: Mapping[str, Any], seq_len: int, *, flavor: str | None = None
              ) -> ModelDims:
    """A mixture of experts given its ``MoEConfig`` fields (the others at their defaults):
    the zoo flavor of its family with the fewest overrides (module docstring), or of
    ``flavor``. O(flavors x fields).

    Raises
    ------
    ShardplanError
        The fields do not make a model (:func:`check_moe`).

    Examples
    --------
    >>> moe_model(MOE_FLAVORS["mixtral:8x7B"], 4096).spec
    'mixtral:8x7B,seq=4096'
    >>> moe_model({**MOE_FLAVORS["mixtral:8x7B"], "n_layers": 2}, 128).spec
    'mixtral:8x7B,n_layers=2,seq=128'
    """
    v = check_moe(values)
    if flavor is None:
        family = _family(v)
        flavor = min((f for f in MOE_FLAVORS if f.startswith(family + ":")),
                     key=lambda f: len(_overrides(v, f)))
    elif flavor not in MOE_FLAVORS:
        raise ShardplanError(f"unknown mixture-of-experts flavor {flavor!r} (choose from "
                             f"{', '.join(MOE_FLAVORS)})")
    return _model_dims(v, flavor, _overrides(v, flavor), seq_len)


def flavor_model(flavor: str, seq_len: int, **overrides: Any) -> ModelDims:
    """The zoo flavor ``flavor`` with ``overrides`` (``MoEConfig`` fields) as a model.

    Examples
    --------
    >>> flavor_model("gpt_oss:120B", 8192, n_layers=24, num_experts=32).spec
    'gpt_oss:120B,n_layers=24,num_experts=32,seq=8192'
    """
    if flavor not in MOE_FLAVORS:
        raise ShardplanError(f"unknown mixture-of-experts flavor {flavor!r} (choose from "
                             f"{', '.join(MOE_FLAVORS)})")
    return moe_model({**MOE_FLAVORS[flavor], **overrides}, seq_len, flavor=flavor)


def _model_dims(v: Mapping[str, Any], flavor: str, overrides: tuple[tuple[str, Any], ...],
                seq_len: int) -> ModelDims:
    family, _, name = flavor.partition(":")
    assert family in MOE_FAMILIES
    mla = v["attention"] == "mla"
    dense = v["first_k_dense"]
    moe = MoEDims(flavor=flavor, overrides=overrides, num_experts=v["num_experts"],
                  top_k=v["top_k"], moe_ffn=v["moe_dim"], shared_experts=v["num_shared_experts"],
                  first_k_dense=dense, attention=v["attention"])
    return ModelDims(family=family, flavor=name, hidden=v["dim"], num_layers=v["n_layers"],
                     num_heads=v["n_heads"],
                     num_kv_heads=v["n_heads"] if mla else (v["n_kv_heads"] or v["n_heads"]),
                     ffn=v["dense_ffn_dim"] if dense else v["moe_dim"], vocab=v["vocab_size"],
                     seq_len=seq_len, moe=moe)


_GROUP = re.compile(r"\(([^()]*)\)(?:\*(\d+))?")
_LIST = re.compile(r"\[([\d,\s]*)\](?:\*(\d+))?")


def layer_pattern(text: str, num_layers: int, *, what: str = "--moe-layer-freq"
                  ) -> tuple[int, ...]:
    """Megatron-LM's per-layer pattern (``--moe-layer-freq``): an integer N (an expert layer
    every N layers, from layer 0) or a list expression of 0 and 1 such as ``([0]*3+[1]*58)``
    -- lists, ``*`` repetition, ``+`` concatenation and parentheses, which Megatron-LM
    evaluates with Python's ``eval`` and which are parsed here without it. O(length).

    Raises
    ------
    ShardplanError
        Text that is not such an expression, values other than 0 and 1, or a pattern of
        another length than ``num_layers`` (Megatron-Core's layer specs refuse it).

    Examples
    --------
    >>> layer_pattern("([0]*3+[1]*5)", 8)
    (0, 0, 0, 1, 1, 1, 1, 1)
    >>> layer_pattern("2", 4)
    (1, 0, 1, 0)
    """
    raw = text.replace(" ", "")
    if raw.isdigit():
        freq = int(raw)
        if freq < 1:
            raise ShardplanError(f"{what} must be >= 1, got {freq}")
        return tuple(1 if i % freq == 0 else 0 for i in range(num_layers))
    if not raw or re.search(r"[^\d,\[\]()+*]", raw):
        raise ShardplanError(f"{what} is an integer or a list expression like "
                             f"([0]*3+[1]*58), got {text!r}")
    expr = raw
    for _ in range(len(raw)):  # innermost parentheses first: (a+b)*n -> a+b+...+a+b
        m = _GROUP.search(expr)
        if m is None:
            break
        expr = expr[:m.start()] + "+".join([m.group(1)] * int(m.group(2) or 1)) + \
            expr[m.end():]
    out: list[int] = []
    for term in expr.split("+"):
        m = _LIST.fullmatch(term)
        if m is None:
            raise ShardplanError(f"{what}: cannot read {term!r} in {text!r} (lists like "
                                 f"[0]*3 joined by +)")
        items = [int(x) for x in m.group(1).split(",") if x.strip()]
        out += items * int(m.group(2) or 1)
    if any(x not in (0, 1) for x in out):
        raise ShardplanError(f"{what} holds 1 (experts) and 0 (dense) only, got {text!r}")
    if len(out) != num_layers:
        raise ShardplanError(f"{what} {text!r} gives {len(out)} layers, the model has "
                             f"{num_layers}")
    return tuple(out)
