"""Mixture-of-experts decoders by their published flavors (zoo names ``mixtral:FLAVOR``,
``deepseek_v3:FLAVOR``, ``qwen3_moe:FLAVOR``, ``gpt_oss:FLAVOR``).

The model follows torchtitan's MoE decoders (``torchtitan/models/moe``, ``deepseek_v3``,
``qwen3``, ``llama4``) and keeps their module names, which planners and exporters key on:
``tok_embeddings``, ``layers.N.attention_norm``, ``layers.N.attention``, ``layers.N.ffn_norm``,
then either ``layers.N.feed_forward.w1|w2|w3`` (a dense SwiGLU layer, DeepSeek-V3's first
``first_k_dense`` layers) or ``layers.N.moe``, made of

- ``moe.router``: the linear gate (``moe.router.gate``), its scores (softmax or sigmoid) and
  the top-k choice of experts per token;
- ``moe.dispatch``: tokens copied into each expert's slots, a padded
  ``(experts, capacity, dim)`` tensor (index arithmetic and a scatter, no FLOPs);
- ``moe.experts``: the routed experts as grouped GEMMs, one ``torch.bmm`` per projection over
  all experts (``w1``, ``w3``: ``(experts, dim, hidden)``, ``w2``: ``(experts, hidden, dim)``);
- ``moe.combine``: each token's expert outputs gathered back and summed, weighted by the
  router's scores;
- ``moe.shared_experts``: the always-on SwiGLU expert(s), when the flavor has them;

then ``norm`` and the untied ``output`` head. Each of these is its own node in a captured
graph (``capture_spec``), under its module path.

Grouped GEMMs: ``torch._grouped_mm`` takes per-expert token offsets whose values decide the
work, which neither the meta device nor a static graph can know; the experts run instead as a
``torch.bmm`` over a padded ``(experts, capacity, dim)`` tensor. The capacity is
``ceil(capacity_factor * tokens * top_k / experts)`` (at most the token count): with the
default ``capacity_factor=1.0`` the experts' FLOPs are exactly the routed tokens' FLOPs under
balanced routing, and a token beyond an expert's capacity is dropped (its combine weight is
zero, as in GShard / Switch routing). ``capacity_factor=None`` is dropless (every expert has a
slot for every token; the graph then counts ``experts / top_k`` times the routed FLOPs).

Attention is one ``F.scaled_dot_product_attention`` call per layer, with rotary embeddings
applied by real ``cos`` / ``sin`` tables (as :mod:`~shardplan.workload.llama`):

- grouped-query attention (Mixtral, Qwen3-MoE, GPT-OSS), with Qwen3's per-head RMSNorm of
  queries and keys (``q_norm``, ``k_norm``), GPT-OSS's projection biases, its learned
  attention sinks (one logit per head joining the softmax's denominator: a zero key and value
  appended, the sink given as that key's mask bias) and its 128-token sliding window on every
  other layer (layers 0, 2, ...);
- DeepSeek-V3's multi-head latent attention: queries through a low-rank ``wq_a`` ->
  ``q_norm`` -> ``wq_b``, keys and values through ``wkv_a`` (the 512-wide latent and the
  64-wide shared rotary key) -> ``kv_norm`` -> ``wkv_b``, then ``wo``.

What is left out (none of it changes a parameter count or a GEMM's shape): YaRN rotary
scaling (DeepSeek-V3, GPT-OSS), load-balancing losses and the update of DeepSeek-V3's
expert bias (kept as the ``moe.router.expert_bias`` buffer, zero), multi-token prediction
(DeepSeek-V3's 14 B MTP module is not built: its published 671 B excludes it), dropout.

A spec is ``deepseek_v3:671B`` with :class:`MoEConfig` fields as overrides after commas and
``seq`` for the example inputs' sequence length (``mixtral:8x7B,seq=4096,n_layers=2``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from shardplan.errors import ShardplanError
from shardplan.workload.llama import (
    RMSNorm,
    apply_rotary,
    build_decoder,
    flavor_overrides,
    rope_tables,
)

__all__ = ["FLAVORS", "PUBLISHED", "TRAINING_SEQ", "Combine", "Dispatch", "GroupedExperts",
           "GroupedQueryAttention", "MoE", "MoEConfig", "MoETransformer",
           "MultiLatentAttention", "SwiGLU", "TokenChoiceTopKRouter", "active_parameter_count",
           "build_moe", "config_of", "parameter_count", "transformer_meta"]


@dataclass(kw_only=True, slots=True)
class MoEConfig:
    """The arguments of a mixture-of-experts decoder (torchtitan's ``MoEModelArgs`` and
    ``DeepSeekV3ModelArgs``, with Hugging Face's names where torchtitan has none).

    Attributes
    ----------
    dim, n_layers, n_heads, vocab_size : int
        Hidden size, decoder layers, attention (query) heads, vocabulary.
    n_kv_heads : int or None
        Key/value heads of grouped-query attention (None: ``n_heads``).
    head_dim : int or None
        Per-head width of grouped-query attention (None: ``dim / n_heads``).
    attention : {"gqa", "mla"}
        Grouped-query or DeepSeek's multi-head latent attention.
    qk_norm, attn_bias, attn_sinks : bool
        Qwen3's per-head query/key RMSNorm; GPT-OSS's projection biases and attention sinks.
    sliding_window : int or None
        Window of the sliding-window layers (every other one, from layer 0); None: none.
    q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim : int
        Multi-head latent attention's ranks and per-head widths.
    first_k_dense, dense_ffn_dim : int
        The first layers with a dense SwiGLU feed-forward, and its width.
    num_experts, top_k, moe_dim : int
        Routed experts, experts per token, and each expert's SwiGLU width.
    num_shared_experts : int
        Always-on experts of width ``moe_dim`` (fused into one SwiGLU of
        ``num_shared_experts * moe_dim``, as torchtitan does).
    score_func : {"softmax", "sigmoid"}
    route_norm : bool
        Renormalise the chosen experts' scores to sum to one.
    route_scale : float
        Multiplies the routing weights (DeepSeek-V3's 2.5).
    n_groups, topk_groups : int
        DeepSeek-V3's group-limited routing: experts in ``n_groups`` groups, a token's
        experts chosen within its best ``topk_groups`` groups (1, 1: unlimited).
    router_bias, expert_bias : bool
        GPT-OSS's biases on the gate and on the experts' projections.
    swiglu_limit : float or None
        GPT-OSS's clamped SwiGLU (``limit`` 7, ``alpha`` 1.702); None: plain SwiGLU.
    capacity_factor : float or None
        Expert slots per balanced share of routed tokens (module docstring); None: dropless.
    norm_eps, rope_theta : float
    max_seq_len : int
    """

    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int | None = None
    head_dim: int | None = None
    vocab_size: int = 32000
    attention: str = "gqa"
    qk_norm: bool = False
    attn_bias: bool = False
    attn_sinks: bool = False
    sliding_window: int | None = None
    q_lora_rank: int = 0
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    first_k_dense: int = 0
    dense_ffn_dim: int = 0
    num_experts: int = 8
    top_k: int = 2
    moe_dim: int = 14336
    num_shared_experts: int = 0
    score_func: str = "softmax"
    route_norm: bool = True
    route_scale: float = 1.0
    n_groups: int = 1
    topk_groups: int = 1
    router_bias: bool = False
    expert_bias: bool = False
    swiglu_limit: float | None = None
    capacity_factor: float | None = 1.0
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_seq_len: int = 2048

    def __post_init__(self) -> None:
        def positive_int(name: str, value: Any, low: int = 1) -> None:
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ShardplanError(f"moe option {name} must be an integer >= {low}, "
                                     f"got {value!r}")

        for f in ("dim", "n_layers", "n_heads", "vocab_size", "num_experts", "top_k",
                  "moe_dim", "n_groups", "topk_groups", "max_seq_len", "kv_lora_rank",
                  "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            positive_int(f, getattr(self, f))
        for f in ("q_lora_rank", "first_k_dense", "dense_ffn_dim", "num_shared_experts"):
            positive_int(f, getattr(self, f), 0)
        for f in ("n_kv_heads", "head_dim", "sliding_window"):
            if getattr(self, f) is not None:
                positive_int(f, getattr(self, f))
        for f in ("qk_norm", "attn_bias", "attn_sinks", "route_norm", "router_bias",
                  "expert_bias"):
            if not isinstance(getattr(self, f), bool):
                raise ShardplanError(f"moe option {f} must be true or false, "
                                     f"got {getattr(self, f)!r}")
        if self.attention not in ("gqa", "mla"):
            raise ShardplanError(f"moe option attention must be gqa or mla, "
                                 f"got {self.attention!r}")
        if self.score_func not in ("softmax", "sigmoid"):
            raise ShardplanError(f"moe option score_func must be softmax or sigmoid, "
                                 f"got {self.score_func!r}")
        if self.top_k > self.num_experts:
            raise ShardplanError(f"moe top_k={self.top_k} exceeds num_experts="
                                 f"{self.num_experts}")
        if self.num_experts % self.n_groups or self.topk_groups > self.n_groups or \
                self.top_k > self.topk_groups * (self.num_experts // self.n_groups):
            raise ShardplanError(f"moe routing groups do not fit: {self.num_experts} experts, "
                                 f"n_groups={self.n_groups}, topk_groups={self.topk_groups}, "
                                 f"top_k={self.top_k}")
        if self.first_k_dense > self.n_layers:
            raise ShardplanError(f"moe first_k_dense={self.first_k_dense} exceeds n_layers="
                                 f"{self.n_layers}")
        if self.first_k_dense and not self.dense_ffn_dim:
            raise ShardplanError("moe first_k_dense needs dense_ffn_dim")
        if self.attention == "gqa":
            if self.head_dim is None and self.dim % self.n_heads:
                raise ShardplanError(f"moe dim={self.dim} is not divisible by "
                                     f"n_heads={self.n_heads} (give head_dim)")
            if self.n_heads % self.kv_heads:
                raise ShardplanError(f"moe n_heads={self.n_heads} is not a multiple of "
                                     f"n_kv_heads={self.kv_heads}")
        if self.rope_dim % 2:
            raise ShardplanError("moe rotary head dimension must be even")
        cf = self.capacity_factor
        if cf is not None and (isinstance(cf, bool) or not isinstance(cf, (int, float))
                               or cf <= 0):
            raise ShardplanError(f"moe option capacity_factor must be positive, got {cf!r}")
        for f in ("norm_eps", "rope_theta", "route_scale"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                raise ShardplanError(f"moe option {f} must be positive, got {v!r}")

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def gqa_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.dim // self.n_heads

    @property
    def rope_dim(self) -> int:
        """The width the rotary embedding turns (per head)."""
        return self.qk_rope_head_dim if self.attention == "mla" else self.gqa_head_dim

    def is_moe_layer(self, layer: int) -> bool:
        return layer >= self.first_k_dense


_MIXTRAL = {"n_heads": 32, "n_kv_heads": 8, "num_experts": 8, "top_k": 2, "vocab_size": 32000,
            "rope_theta": 1e6}
_QWEN3 = {"n_kv_heads": 4, "head_dim": 128, "qk_norm": True, "num_experts": 128, "top_k": 8,
          "vocab_size": 151936, "norm_eps": 1e-6, "rope_theta": 1e6}
_DSV3 = {"attention": "mla", "score_func": "sigmoid", "route_norm": True, "norm_eps": 1e-6}
_GPT_OSS = {"n_heads": 64, "n_kv_heads": 8, "head_dim": 64, "attn_bias": True,
            "attn_sinks": True, "sliding_window": 128, "top_k": 4, "router_bias": True,
            "expert_bias": True, "swiglu_limit": 7.0, "vocab_size": 201088,
            "rope_theta": 150000.0}

#: The published flavors. Sources: Mixtral, the Hugging Face configs of
#: mistralai/Mixtral-8x7B-v0.1 and Mixtral-8x22B-v0.1 (arXiv 2401.04088, table 1); DeepSeek-V3,
#: deepseek-ai/DeepSeek-V3's config.json (arXiv 2412.19437, section 4.2); Qwen3-MoE, the
#: configs of Qwen/Qwen3-30B-A3B and Qwen/Qwen3-235B-A22B (arXiv 2505.09388, table 2);
#: GPT-OSS, openai/gpt-oss-120b's config.json and model card (arXiv 2508.10925). The
#: ``debug`` flavors are ours, for tests.
FLAVORS: dict[str, MoEConfig] = {
    "mixtral:debug": MoEConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256,
                               num_experts=4, top_k=2, moe_dim=96),
    "mixtral:8x7B": MoEConfig(dim=4096, n_layers=32, moe_dim=14336, **_MIXTRAL),
    "mixtral:8x22B": MoEConfig(dim=6144, n_layers=56, moe_dim=16384,
                               **{**_MIXTRAL, "n_heads": 48, "vocab_size": 32768}),
    "deepseek_v3:debug": MoEConfig(dim=64, n_layers=3, n_heads=4, vocab_size=256,
                                   q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16,
                                   qk_rope_head_dim=8, v_head_dim=16, first_k_dense=1,
                                   dense_ffn_dim=128, num_experts=8, top_k=2, moe_dim=32,
                                   num_shared_experts=1, n_groups=2, topk_groups=1,
                                   route_scale=2.5, **_DSV3),
    "deepseek_v3:671B": MoEConfig(dim=7168, n_layers=61, n_heads=128, vocab_size=129280,
                                  q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                                  qk_rope_head_dim=64, v_head_dim=128, first_k_dense=3,
                                  dense_ffn_dim=18432, num_experts=256, top_k=8, moe_dim=2048,
                                  num_shared_experts=1, n_groups=8, topk_groups=4,
                                  route_scale=2.5, **_DSV3),
    "qwen3_moe:debug": MoEConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32,
                                 qk_norm=True, vocab_size=256, num_experts=8, top_k=2,
                                 moe_dim=32),
    "qwen3_moe:30B-A3B": MoEConfig(dim=2048, n_layers=48, n_heads=32, moe_dim=768, **_QWEN3),
    "qwen3_moe:235B-A22B": MoEConfig(dim=4096, n_layers=94, n_heads=64, moe_dim=1536,
                                     **_QWEN3),
    "gpt_oss:debug": MoEConfig(dim=64, n_layers=2, num_experts=4, moe_dim=64, max_seq_len=64,
                               **{**_GPT_OSS, "vocab_size": 256, "n_heads": 4, "n_kv_heads": 2,
                                  "head_dim": 16, "top_k": 2, "sliding_window": 4}),
    "gpt_oss:120B": MoEConfig(dim=2880, n_layers=36, num_experts=128, moe_dim=2880,
                              **_GPT_OSS),
}

#: Published total and active parameters per token, and what the active count covers
#: (``"all"``: with the embedding and output head; ``"no_embedding"``: the output head but
#: not the embedding lookup, as GPT-OSS's model card counts). DeepSeek-V3's 671 B is the main
#: model without its 14 B multi-token-prediction module (its README: 685 B with it).
PUBLISHED: dict[str, tuple[float, float, str]] = {
    "mixtral:8x7B": (46.7e9, 12.9e9, "all"),          # arXiv 2401.04088, section 2.1
    "mixtral:8x22B": (141e9, 39e9, "all"),            # mistral.ai/news/mixtral-8x22b
    "deepseek_v3:671B": (671e9, 37e9, "no_embedding"),  # arXiv 2412.19437, abstract
    "qwen3_moe:30B-A3B": (30.5e9, 3.3e9, "all"),      # Qwen/Qwen3-30B-A3B model card
    "qwen3_moe:235B-A22B": (235e9, 22e9, "all"),      # Qwen/Qwen3-235B-A22B model card
    "gpt_oss:120B": (116.83e9, 5.13e9, "no_embedding"),  # gpt-oss model card, table 1
}

#: Pre-training sequence lengths where published: DeepSeek-V3 4K (arXiv 2412.19437,
#: section 4.2: "maximum sequence length to 4K during pre-training"), Qwen3 4,096 in its
#: first two pre-training stages (arXiv 2505.09388, section 3.2), Mixtral 32K (arXiv
#: 2401.04088, section 2: "trained with a context size of 32k tokens"). Mixtral 8x22B and
#: GPT-OSS publish none.
TRAINING_SEQ: dict[str, int] = {"mixtral:8x7B": 32768, "deepseek_v3:671B": 4096,
                                "qwen3_moe:30B-A3B": 4096, "qwen3_moe:235B-A22B": 4096}


def _attention_parameters(cfg: MoEConfig) -> int:
    d = cfg.dim
    if cfg.attention == "mla":
        h, qk = cfg.n_heads, cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        q = (d * cfg.q_lora_rank + cfg.q_lora_rank + cfg.q_lora_rank * h * qk
             if cfg.q_lora_rank else d * h * qk)
        kv = d * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) + cfg.kv_lora_rank \
            + cfg.kv_lora_rank * h * (cfg.qk_nope_head_dim + cfg.v_head_dim)
        return q + kv + h * cfg.v_head_dim * d
    q, kv = cfg.n_heads * cfg.gqa_head_dim, cfg.kv_heads * cfg.gqa_head_dim
    n = 2 * d * q + 2 * d * kv
    if cfg.attn_bias:
        n += q + 2 * kv + d
    if cfg.qk_norm:
        n += 2 * cfg.gqa_head_dim
    if cfg.attn_sinks:
        n += cfg.n_heads
    return n


def _expert_parameters(cfg: MoEConfig) -> int:
    """One routed expert."""
    return 3 * cfg.dim * cfg.moe_dim + (2 * cfg.moe_dim + cfg.dim if cfg.expert_bias else 0)


def _layer_parameters(cfg: MoEConfig, layer: int, experts: int) -> int:
    """Layer ``layer`` with ``experts`` routed experts counted (all, or the active top-k)."""
    n = 2 * cfg.dim + _attention_parameters(cfg)
    if not cfg.is_moe_layer(layer):
        return n + 3 * cfg.dim * cfg.dense_ffn_dim
    router = cfg.dim * cfg.num_experts + (cfg.num_experts if cfg.router_bias else 0)
    shared = 3 * cfg.dim * cfg.moe_dim * cfg.num_shared_experts
    return n + router + shared + experts * _expert_parameters(cfg)


def parameter_count(cfg: MoEConfig) -> int:
    """Parameters of :class:`MoETransformer` for ``cfg``, from its dimensions."""
    layers = sum(_layer_parameters(cfg, i, cfg.num_experts) for i in range(cfg.n_layers))
    return layers + 2 * cfg.vocab_size * cfg.dim + cfg.dim


def active_parameter_count(cfg: MoEConfig, *, embedding: bool = True) -> int:
    """Parameters one token uses: every dense weight, the router, the shared experts and
    ``top_k`` routed experts per MoE layer, the output head, and (``embedding``) the token
    embedding's table (a lookup reads one row of it; publishers differ on counting it)."""
    layers = sum(_layer_parameters(cfg, i, cfg.top_k) for i in range(cfg.n_layers))
    return layers + (2 if embedding else 1) * cfg.vocab_size * cfg.dim + cfg.dim


def transformer_meta(cfg: MoEConfig, seq_len: int, family: str = "moe") -> dict[str, Any]:
    """The dimensions planners read (a graph's ``meta["transformer"]``), with the MoE's own:
    ``experts``, ``top_k``, ``moe_ffn``, ``shared_experts``, ``first_k_dense``,
    ``active_parameters``; ``sliding_window`` and ``window_layers`` (the layers that
    attend within it) when the flavor has one. ``ffn`` is the dense layers' width (the
    experts' when none)."""
    heads_dim = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim if cfg.attention == "mla" \
        else cfg.gqa_head_dim
    window = {} if cfg.sliding_window is None else {
        "sliding_window": cfg.sliding_window,
        "window_layers": list(range(0, cfg.n_layers, 2))}  # as the blocks are built
    return {**window, "family": family, "hidden": cfg.dim, "layers": cfg.n_layers,
            "heads": cfg.n_heads, "kv_heads": cfg.n_heads if cfg.attention == "mla"
            else cfg.kv_heads, "head_dim": heads_dim, "attention": cfg.attention,
            "ffn": cfg.dense_ffn_dim or cfg.moe_dim, "vocab": cfg.vocab_size,
            "seq": int(seq_len), "tied": False, "parameters": parameter_count(cfg),
            "experts": cfg.num_experts, "top_k": cfg.top_k, "moe_ffn": cfg.moe_dim,
            "shared_experts": cfg.num_shared_experts, "first_k_dense": cfg.first_k_dense,
            "active_parameters": active_parameter_count(cfg)}


class SwiGLU(nn.Module):
    """``w2(silu(w1 x) * w3 x)`` (a dense layer's ``feed_forward``, the shared experts)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def _causal_mask(s: int, window: int, device: torch.device) -> torch.Tensor:
    """True where query ``i`` sees key ``j``: ``0 <= i - j < window``."""
    pos = torch.arange(s, device=device)
    diff = pos.view(s, 1) - pos.view(1, s)
    return (diff >= 0) & (diff < window)


class GroupedQueryAttention(nn.Module):
    """Grouped-query attention with the options of Mixtral, Qwen3 and GPT-OSS (module
    docstring); ``window`` is this layer's sliding window (None: full causal)."""

    def __init__(self, cfg: MoEConfig, window: int | None) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, \
            cfg.gqa_head_dim
        q, kv = cfg.n_heads * self.head_dim, cfg.kv_heads * self.head_dim
        self.wq = nn.Linear(cfg.dim, q, bias=cfg.attn_bias)
        self.wk = nn.Linear(cfg.dim, kv, bias=cfg.attn_bias)
        self.wv = nn.Linear(cfg.dim, kv, bias=cfg.attn_bias)
        self.wo = nn.Linear(q, cfg.dim, bias=cfg.attn_bias)
        self.q_norm = RMSNorm(self.head_dim, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.norm_eps) if cfg.qk_norm else None
        self.sinks = nn.Parameter(torch.zeros(cfg.n_heads)) if cfg.attn_sinks else None
        # full layers use a window past any sequence, so both kinds of layer have one graph
        self.window = window if window is not None else cfg.max_seq_len + 1

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h, kvh, hd = self.n_heads, self.n_kv_heads, self.head_dim
        q = self.wq(x).view(b, s, h, hd)
        k = self.wk(x).view(b, s, kvh, hd)
        v = self.wv(x).view(b, s, kvh, hd)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        rep = h // kvh
        if rep > 1:
            k = k.unsqueeze(3).expand(b, s, kvh, rep, hd).reshape(b, s, h, hd)
            v = v.unsqueeze(3).expand(b, s, kvh, rep, hd).reshape(b, s, h, hd)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.sinks is None and self.window > s:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            allowed = _causal_mask(s, self.window, x.device)
            bias = torch.zeros(s, s, dtype=q.dtype, device=x.device) \
                .masked_fill(~allowed, float("-inf"))
            if self.sinks is not None:  # a zero key and value whose logit is the sink
                k = torch.cat((k, k.new_zeros(b, h, 1, hd)), dim=2)
                v = torch.cat((v, v.new_zeros(b, h, 1, hd)), dim=2)
                bias = torch.cat((bias.expand(h, s, s),
                                  self.sinks.to(q.dtype).view(h, 1, 1).expand(h, s, 1)), -1)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.wo(y.transpose(1, 2).reshape(b, s, h * hd))


class MultiLatentAttention(nn.Module):
    """DeepSeek-V3's multi-head latent attention (arXiv 2412.19437, section 2.1.1)."""

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.nope, self.rope, self.v_dim = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, \
            cfg.v_head_dim
        self.kv_rank = cfg.kv_lora_rank
        qk = self.nope + self.rope
        if cfg.q_lora_rank:
            self.wq_a = nn.Linear(cfg.dim, cfg.q_lora_rank, bias=False)
            self.q_norm = RMSNorm(cfg.q_lora_rank, cfg.norm_eps)
            self.wq_b = nn.Linear(cfg.q_lora_rank, cfg.n_heads * qk, bias=False)
        else:
            self.wq = nn.Linear(cfg.dim, cfg.n_heads * qk, bias=False)
        self.wkv_a = nn.Linear(cfg.dim, cfg.kv_lora_rank + self.rope, bias=False)
        self.kv_norm = RMSNorm(cfg.kv_lora_rank, cfg.norm_eps)
        self.wkv_b = nn.Linear(cfg.kv_lora_rank, cfg.n_heads * (self.nope + self.v_dim),
                               bias=False)
        self.wo = nn.Linear(cfg.n_heads * self.v_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.n_heads
        q = self.wq_b(self.q_norm(self.wq_a(x))) if hasattr(self, "wq_a") else self.wq(x)
        q = q.view(b, s, h, self.nope + self.rope)
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        q = torch.cat((q_nope, apply_rotary(q_pe, cos, sin)), dim=-1)
        kv, k_pe = self.wkv_a(x).split([self.kv_rank, self.rope], dim=-1)
        k_pe = apply_rotary(k_pe.unsqueeze(2), cos, sin)  # one rotary key for all heads
        kv = self.wkv_b(self.kv_norm(kv)).view(b, s, h, self.nope + self.v_dim)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        k = torch.cat((k_nope, k_pe.expand(b, s, h, self.rope)), dim=-1)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, s, h * self.v_dim))


class TokenChoiceTopKRouter(nn.Module):
    """Scores every expert for each token (``gate``, then softmax or sigmoid) and keeps the
    ``top_k`` best: ``(weights, experts)``, each ``(tokens, top_k)``.

    Softmax routers (Mixtral, Qwen3, GPT-OSS) renormalise the chosen scores (the same as a
    softmax over the top-k logits); DeepSeek-V3's sigmoid router chooses by score plus
    ``expert_bias`` within the best ``topk_groups`` of ``n_groups`` groups (a group scored by
    its two best experts), then weighs by the unbiased scores, normalised, times
    ``route_scale``.
    """

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.gate = nn.Linear(cfg.dim, cfg.num_experts, bias=cfg.router_bias)
        self.num_experts, self.top_k = cfg.num_experts, cfg.top_k
        self.score_func, self.route_norm, self.route_scale = cfg.score_func, cfg.route_norm, \
            cfg.route_scale
        self.n_groups, self.topk_groups = cfg.n_groups, cfg.topk_groups
        self.expert_bias: torch.Tensor | None
        if cfg.score_func == "sigmoid":
            self.register_buffer("expert_bias", torch.zeros(cfg.num_experts), persistent=True)
        else:
            self.expert_bias = None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.gate(x)
        if self.score_func == "softmax":
            scores = F.softmax(logits, dim=-1, dtype=torch.float32)
        else:
            scores = torch.sigmoid(logits.float())
        choice = scores if self.expert_bias is None else scores + self.expert_bias
        if self.n_groups > 1:
            t = choice.shape[0]
            grouped = choice.view(t, self.n_groups, -1)
            best = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(-1)
            keep = torch.zeros_like(best).scatter(
                1, best.topk(self.topk_groups, dim=-1).indices, 1.0).bool()
            choice = grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).view(t, -1)
        experts = choice.topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, experts)
        if self.route_norm:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return (weights * self.route_scale).type_as(x), experts


def _capacity(tokens: int, top_k: int, num_experts: int, factor: float | None) -> int:
    if factor is None:
        return tokens
    return max(1, min(tokens, math.ceil(factor * tokens * top_k / num_experts)))


class Dispatch(nn.Module):
    """Tokens into the experts' slots: ``(experts, capacity, dim)`` and each (token, choice)'s
    slot index (``experts * capacity`` for a dropped one)."""

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.num_experts, self.top_k, self.capacity_factor = cfg.num_experts, cfg.top_k, \
            cfg.capacity_factor

    def forward(self, x: torch.Tensor, experts: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        t, d = x.shape
        e, k = self.num_experts, self.top_k
        cap = _capacity(t, k, e, self.capacity_factor)
        flat = experts.reshape(t * k, 1)
        onehot = torch.zeros(t * k, e, dtype=torch.int64, device=x.device).scatter(1, flat, 1)
        position = (onehot.cumsum(0) - 1).gather(1, flat).squeeze(1)  # rank within expert
        slot = torch.where(position < cap, flat.squeeze(1) * cap + position,
                           torch.full_like(position, e * cap))
        routed = x.unsqueeze(1).expand(t, k, d).reshape(t * k, d)
        slots = x.new_zeros(e * cap + 1, d).index_add(0, slot, routed)
        return slots[: e * cap].view(e, cap, d), slot


class GroupedExperts(nn.Module):
    """The routed experts' SwiGLU as grouped GEMMs: one ``torch.bmm`` per projection over
    all experts (GPT-OSS: with biases and its clamped SwiGLU)."""

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        e, d, hdim = cfg.num_experts, cfg.dim, cfg.moe_dim
        self.w1 = nn.Parameter(torch.empty(e, d, hdim))
        self.w2 = nn.Parameter(torch.empty(e, hdim, d))
        self.w3 = nn.Parameter(torch.empty(e, d, hdim))
        self.b1: nn.Parameter | None = None
        self.b2: nn.Parameter | None = None
        self.b3: nn.Parameter | None = None
        if cfg.expert_bias:
            self.b1 = nn.Parameter(torch.zeros(e, 1, hdim))
            self.b2 = nn.Parameter(torch.zeros(e, 1, d))
            self.b3 = nn.Parameter(torch.zeros(e, 1, hdim))
        self.limit = cfg.swiglu_limit
        if not self.w1.is_meta:
            for w, fan_in in ((self.w1, d), (self.w2, hdim), (self.w3, d)):
                nn.init.uniform_(w, -fan_in ** -0.5, fan_in ** -0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = torch.bmm(x, self.w1), torch.bmm(x, self.w3)
        if self.b1 is not None and self.b3 is not None:
            gate, up = gate + self.b1, up + self.b3
        if self.limit is None:
            h = F.silu(gate) * up
        else:  # GPT-OSS: clamped gate and up, gate * sigmoid(1.702 gate) * (up + 1)
            gate, up = gate.clamp(max=self.limit), up.clamp(-self.limit, self.limit)
            h = gate * torch.sigmoid(1.702 * gate) * (up + 1)
        out = torch.bmm(h, self.w2)
        return out + self.b2 if self.b2 is not None else out


class Combine(nn.Module):
    """Each token's expert outputs back from their slots, weighted and summed."""

    def forward(self, out: torch.Tensor, slot: torch.Tensor, weights: torch.Tensor
                ) -> torch.Tensor:
        e, cap, d = out.shape
        t, k = weights.shape
        rows = torch.cat((out.reshape(e * cap, d), out.new_zeros(1, d)))  # the dropped row
        return (rows[slot].view(t, k, d) * weights.unsqueeze(-1)).sum(1)


class MoE(nn.Module):
    """``router`` -> ``dispatch`` -> ``experts`` -> ``combine``, plus ``shared_experts``."""

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.router = TokenChoiceTopKRouter(cfg)
        self.dispatch = Dispatch(cfg)
        self.experts = GroupedExperts(cfg)
        self.combine = Combine()
        self.shared_experts = SwiGLU(cfg.dim, cfg.moe_dim * cfg.num_shared_experts) \
            if cfg.num_shared_experts else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        flat = x.reshape(b * s, d)
        weights, experts = self.router(flat)
        slots, slot = self.dispatch(flat, experts)
        out = self.combine(self.experts(slots), slot, weights)
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)
        return out.view(b, s, d)


class TransformerBlock(nn.Module):
    """``h = x + attention(attention_norm(x))``, then ``h + ffn(ffn_norm(h))`` with ``ffn``
    the dense ``feed_forward`` or the ``moe``."""

    def __init__(self, cfg: MoEConfig, layer: int) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention: nn.Module = MultiLatentAttention(cfg) if cfg.attention == "mla" else \
            GroupedQueryAttention(cfg, cfg.sliding_window if layer % 2 == 0 else None)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        if cfg.is_moe_layer(layer):
            self.moe = MoE(cfg)
        else:
            self.feed_forward = SwiGLU(cfg.dim, cfg.dense_ffn_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        ffn = self.moe if hasattr(self, "moe") else self.feed_forward
        return h + ffn(self.ffn_norm(h))


class MoETransformer(nn.Module):
    """Token ids ``(batch, seq)`` -> logits ``(batch, seq, vocab)``."""

    def __init__(self, cfg: MoEConfig, family: str = "moe") -> None:
        super().__init__()
        self.cfg, self.family = cfg, family
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg, i)
                                     for i in range(cfg.n_layers)})
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg.rope_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def transformer_meta(self, seq_len: int) -> dict[str, Any]:
        """The dimensions planners read (:func:`transformer_meta`)."""
        return transformer_meta(self.cfg, seq_len, self.family)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.rope_cos, self.rope_sin)
        return self.output(self.norm(h))


def config_of(flavor: str, overrides: dict[str, Any]) -> tuple[MoEConfig, int | None]:
    """The flavor's config with ``overrides`` applied, and the ``seq`` override (or None).

    Raises
    ------
    ShardplanError
        Unknown flavor or option, or an invalid value.
    """
    values, seq = flavor_overrides(flavor, overrides, FLAVORS, MoEConfig, "moe",
                                   ("n_kv_heads", "head_dim", "sliding_window",
                                    "swiglu_limit", "capacity_factor"))
    cfg = replace(FLAVORS[flavor], **values)
    if "n_layers" in values and "first_k_dense" not in values and \
            cfg.first_k_dense > cfg.n_layers:
        cfg = replace(cfg, first_k_dense=cfg.n_layers)
    return cfg, seq


def build_moe(flavor: str, overrides: dict[str, Any], batch_size: int, seq_len: int, *,
              device: str = "cpu") -> tuple[nn.Module, tuple[Any, ...], MoEConfig, int]:
    """Build an MoE flavor and example token ids.

    Parameters
    ----------
    flavor : str
        ``deepseek_v3:671B`` and the other keys of :data:`FLAVORS`.
    overrides : dict
        :class:`MoEConfig` fields, and ``seq`` (overrides ``seq_len``).
    batch_size, seq_len : int
    device : {"cpu", "meta"}
        ``"meta"``: parameters, buffers and inputs without storage.

    Returns
    -------
    (model, example_inputs, config, seq_len)
    """
    cfg, seq = config_of(flavor, overrides)
    family = flavor.split(":", 1)[0]
    return build_decoder(lambda c: MoETransformer(c, family=family), cfg, seq or seq_len,
                         batch_size, device)
