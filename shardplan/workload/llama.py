"""Llama 2 / Llama 3 by their published flavors (zoo names ``llama3:FLAVOR``, ``llama2:FLAVOR``).

The model follows torchtitan's Llama (``torchtitan/models/llama3``): RMSNorm before attention
and feed-forward, rotary position embeddings, grouped-query attention, a SwiGLU feed-forward
and an untied output head, with torchtitan's module names (``tok_embeddings``,
``layers.N.attention_norm``, ``layers.N.attention.wq|wk|wv|wo``, ``layers.N.ffn_norm``,
``layers.N.feed_forward.w1|w2|w3``, ``norm``, ``output``), which tensor-parallel plans and the
exporters key on. The model never knows how it is split.

Two departures from torchtitan, both so that ``torch.export`` and capture see what a planner
needs:

- attention is one ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` call, the
  key and value heads repeated to the query heads before it (torchtitan's ``repeat_kv``), so
  capture makes one operator with an iteration space (batch, heads, query, key, head dim);
- the rotary embedding is applied with real-valued ``cos`` / ``sin`` buffers (the same
  rotation as torchtitan's complex ``freqs_cis``, pairs of adjacent features rotated), since
  complex tensors do not export everywhere.

A spec is ``llama3:8B`` or ``llama2:7B`` with :class:`LlamaConfig` fields as overrides after
commas, and ``seq`` for the example inputs' sequence length
(``llama3:8B,seq=4096,n_layers=2``). Large flavors are built on the meta device (no memory)
when asked or when their parameters would not fit (:func:`build_llama`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from shardplan.errors import ShardplanError

__all__ = ["FLAVORS", "TRAINING_SEQ", "Attention", "FeedForward", "Llama", "LlamaConfig",
           "RMSNorm", "TransformerBlock", "apply_rotary", "build_llama", "config_of",
           "ffn_hidden_dim", "parameter_count", "rope_tables", "transformer_meta"]


@dataclass(kw_only=True, slots=True)
class LlamaConfig:
    """torchtitan's Llama model arguments.

    Attributes
    ----------
    dim : int
        Hidden size.
    n_layers, n_heads : int
    n_kv_heads : int or None
        Key/value heads of grouped-query attention (None: ``n_heads``).
    vocab_size : int
    multiple_of : int
        The feed-forward width is rounded up to a multiple of it.
    ffn_dim_multiplier : float or None
        Scales ``int(8 dim / 3)`` before rounding (:func:`ffn_hidden_dim`).
    norm_eps, rope_theta : float
    max_seq_len : int
        Length of the rotary tables (at least the sequence the model is called on).
    ffn_dim : int or None
        The feed-forward width itself (Megatron-LM's ``--ffn-hidden-size``), in place of
        the multiplier's rule; None: the rule.
    """

    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int | None = None
    vocab_size: int = 128256
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_seq_len: int = 2048
    ffn_dim: int | None = None

    def __post_init__(self) -> None:
        fd = self.ffn_dim
        if fd is not None and (isinstance(fd, bool) or not isinstance(fd, int) or fd < 1):
            raise ShardplanError(f"llama option ffn_dim must be a positive integer, got {fd!r}")
        for f in ("dim", "n_layers", "n_heads", "vocab_size", "multiple_of", "max_seq_len"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ShardplanError(f"llama option {f} must be a positive integer, got {v!r}")
        kv = self.n_kv_heads
        if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int) or kv < 1):
            raise ShardplanError(f"llama option n_kv_heads must be a positive integer, "
                                 f"got {kv!r}")
        if self.dim % self.n_heads:
            raise ShardplanError(f"llama dim={self.dim} is not divisible by "
                                 f"n_heads={self.n_heads}")
        if (self.dim // self.n_heads) % 2:
            raise ShardplanError("llama head dimension (dim / n_heads) must be even for "
                                 "rotary embeddings")
        if self.n_heads % self.kv_heads:
            raise ShardplanError(f"llama n_heads={self.n_heads} is not a multiple of "
                                 f"n_kv_heads={self.kv_heads}")
        m = self.ffn_dim_multiplier
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float)) or m <= 0):
            raise ShardplanError(f"llama option ffn_dim_multiplier must be positive, got {m!r}")
        for f in ("norm_eps", "rope_theta"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                raise ShardplanError(f"llama option {f} must be positive, got {v!r}")

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


_L3 = {"vocab_size": 128256, "rope_theta": 500000.0}
_L2 = {"vocab_size": 32000, "rope_theta": 10000.0}

#: The published flavors, as torchtitan (and Meta's reference code) define them.
FLAVORS: dict[str, LlamaConfig] = {
    "llama3:debug": LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256,
                                multiple_of=32, rope_theta=500000.0),
    "llama3:8B": LlamaConfig(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                             ffn_dim_multiplier=1.3, multiple_of=1024, **_L3),
    "llama3:70B": LlamaConfig(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8,
                              ffn_dim_multiplier=1.3, multiple_of=4096, **_L3),
    "llama3:405B": LlamaConfig(dim=16384, n_layers=126, n_heads=128, n_kv_heads=8,
                               ffn_dim_multiplier=1.2, multiple_of=4096, **_L3),
    "llama2:debug": LlamaConfig(dim=64, n_layers=2, n_heads=4, vocab_size=256,
                                multiple_of=32),
    "llama2:7B": LlamaConfig(dim=4096, n_layers=32, n_heads=32, **_L2),
    "llama2:13B": LlamaConfig(dim=5120, n_layers=40, n_heads=40, **_L2),
    "llama2:70B": LlamaConfig(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8,
                              ffn_dim_multiplier=1.3, multiple_of=4096, **_L2),
}


#: The sequence each family's published flavors were trained at: Llama 3 and 3.1 pre-trained
#: at 8,192 tokens (arXiv 2407.21783, section 3.4.1: "a sequence length of 8K tokens" before
#: long-context pre-training), Llama 2 at 4,096 (arXiv 2307.09288, section 2.2: "we double
#: the context length", 4k tokens). The ``debug`` flavors are no published run: not listed.
TRAINING_SEQ: dict[str, int] = {
    **{k: 8192 for k in FLAVORS if k.startswith("llama3:") and not k.endswith(":debug")},
    **{k: 4096 for k in FLAVORS if k.startswith("llama2:") and not k.endswith(":debug")},
}

def ffn_hidden_dim(cfg: LlamaConfig) -> int:
    """The SwiGLU width: ``int(2 * 4 dim / 3)``, times ``ffn_dim_multiplier`` (truncated),
    rounded up to a multiple of ``multiple_of`` (torchtitan's ``FeedForward``)."""
    if cfg.ffn_dim is not None:
        return cfg.ffn_dim
    hidden = int(2 * (4 * cfg.dim) / 3)
    if cfg.ffn_dim_multiplier is not None:
        hidden = int(cfg.ffn_dim_multiplier * hidden)
    return cfg.multiple_of * ((hidden + cfg.multiple_of - 1) // cfg.multiple_of)


def parameter_count(cfg: LlamaConfig) -> int:
    """Parameters of :class:`Llama` for ``cfg``, from its dimensions (no model built).

    Per layer: ``wq``, ``wo`` (dim x dim), ``wk``, ``wv`` (dim x kv_heads head_dim), three
    feed-forward matrices (dim x ffn) and two norm weights; plus the embedding, the final
    norm and the untied output head.
    """
    d, kv = cfg.dim, cfg.kv_heads * cfg.head_dim
    layer = 2 * d * d + 2 * d * kv + 3 * d * ffn_hidden_dim(cfg) + 2 * d
    return cfg.n_layers * layer + 2 * cfg.vocab_size * d + d


def transformer_meta(cfg: LlamaConfig, seq_len: int) -> dict[str, Any]:
    """The dimensions planners read (a graph's ``meta["transformer"]``)."""
    return {"family": "llama", "hidden": cfg.dim, "layers": cfg.n_layers,
            "heads": cfg.n_heads, "kv_heads": cfg.kv_heads, "ffn": ffn_hidden_dim(cfg),
            "vocab": cfg.vocab_size, "seq": int(seq_len), "tied": False,
            "parameters": parameter_count(cfg)}


class RMSNorm(nn.Module):
    """``x / rms(x) * weight`` over the last dimension (computed in float32; a float32 input
    is not converted, so that no no-op casts reach the captured graph)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x if x.dtype == torch.float32 else x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y if x.dtype == torch.float32 else y.type_as(x)) * self.weight


def rope_tables(head_dim: int, seq_len: int, theta: float,
                device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` of the rotary angles, each ``(seq_len, head_dim / 2)``."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device)[: head_dim // 2]
                             .float() / head_dim))
    angles = torch.outer(torch.arange(seq_len, device=device).float(), freqs)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent feature pairs of ``x`` (batch, seq, heads, head_dim) by the angles;
    the real form of torchtitan's ``x * freqs_cis`` on complex pairs."""
    b, s, h, d = x.shape
    pairs = (x if x.dtype == torch.float32 else x.float()).reshape(b, s, h, d // 2, 2)
    re, im = pairs[..., 0], pairs[..., 1]
    c, sn = cos[:s].view(1, s, 1, d // 2), sin[:s].view(1, s, 1, d // 2)
    out = torch.stack((re * c - im * sn, re * sn + im * c), dim=-1)
    out = out.reshape(b, s, h, d)
    return out if x.dtype == torch.float32 else out.type_as(x)


class Attention(nn.Module):
    """Grouped-query attention: one ``F.scaled_dot_product_attention`` call (causal)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.n_heads, self.head_dim)
        k = self.wk(x).view(b, s, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(b, s, self.n_kv_heads, self.head_dim)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        rep = self.n_heads // self.n_kv_heads
        if rep > 1:  # torchtitan's repeat_kv: each key/value head serves rep query heads
            k = k.unsqueeze(3).expand(b, s, self.n_kv_heads, rep, self.head_dim) \
                .reshape(b, s, self.n_heads, self.head_dim)
            v = v.unsqueeze(3).expand(b, s, self.n_kv_heads, rep, self.head_dim) \
                .reshape(b, s, self.n_heads, self.head_dim)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, s, self.n_heads * self.head_dim))


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        hidden = ffn_hidden_dim(cfg)
        self.w1 = nn.Linear(cfg.dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """``h = x + attention(attention_norm(x))``, then ``h + feed_forward(ffn_norm(h))``."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    """Token ids ``(batch, seq)`` -> logits ``(batch, seq, vocab)``."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg)
                                     for i in range(cfg.n_layers)})
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def transformer_meta(self, seq_len: int) -> dict[str, Any]:
        """The dimensions planners read (:func:`transformer_meta`)."""
        return transformer_meta(self.cfg, seq_len)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.rope_cos, self.rope_sin)
        return self.output(self.norm(h))


def flavor_overrides(flavor: str, overrides: dict[str, Any], flavors: dict[str, Any],
                     config_cls: type, what: str, nullable: tuple[str, ...] = ()
                     ) -> tuple[dict[str, Any], int | None]:
    """A flavor's overrides checked against its config's fields: ``(the fields to replace,
    the seq override or None)``, ``none`` given to a ``nullable`` field read as None. Shared
    by the Llama and the MoE zoo (``what`` names the kind in the errors).

    Raises
    ------
    ShardplanError
        Unknown flavor or option, or an invalid ``seq``.
    """
    if flavor not in flavors:
        family = flavor.split(":", 1)[0]
        known = ", ".join(k.split(":", 1)[1] for k in flavors if k.startswith(family + ":"))
        raise ShardplanError(f"unknown flavor {flavor!r} (choose from {known})")
    values = dict(overrides)
    seq = values.pop("seq", None)
    if seq is not None and (isinstance(seq, bool) or not isinstance(seq, int) or seq < 1):
        raise ShardplanError(f"{what} option seq must be a positive integer, got {seq!r}")
    known_fields = {f.name for f in fields(config_cls)}
    bad = sorted(set(values) - known_fields)
    if bad:
        raise ShardplanError(f"unknown {what} option {bad[0]!r} (choose from seq, "
                             f"{', '.join(sorted(known_fields))})")
    for key in nullable:
        if isinstance(values.get(key), str) and values[key].lower() == "none":
            values[key] = None
    return values, seq


def config_of(flavor: str, overrides: dict[str, Any]) -> tuple[LlamaConfig, int | None]:
    """The flavor's config with ``overrides`` applied, and the ``seq`` override (or None).

    Raises
    ------
    ShardplanError
        Unknown flavor or option, or an invalid value.
    """
    values, seq = flavor_overrides(flavor, overrides, FLAVORS, LlamaConfig, "llama",
                                   ("ffn_dim_multiplier",))
    return replace(FLAVORS[flavor], **values), seq


def build_llama(flavor: str, overrides: dict[str, Any], batch_size: int, seq_len: int, *,
                device: str = "cpu") -> tuple[nn.Module, tuple[Any, ...], LlamaConfig, int]:
    """Build a Llama flavor and example token ids.

    Parameters
    ----------
    flavor : str
        ``llama3:8B`` and the other keys of :data:`FLAVORS`.
    overrides : dict
        :class:`LlamaConfig` fields, and ``seq`` (overrides ``seq_len``).
    batch_size, seq_len : int
    device : {"cpu", "meta"}
        ``"meta"``: parameters, buffers and inputs without storage.

    Returns
    -------
    (model, example_inputs, config, seq_len)
    """
    cfg, seq = config_of(flavor, overrides)
    return build_decoder(Llama, cfg, seq or seq_len, batch_size, device)


def build_decoder(make: Any, cfg: Any, seq: int, batch_size: int, device: str
                  ) -> tuple[nn.Module, tuple[Any, ...], Any, int]:
    """``make(cfg)`` on ``device`` with ``max_seq_len`` raised to ``seq`` when shorter, and
    ``batch_size x seq`` random token ids: what :func:`build_llama` and the mixtures of
    experts' builder return. O(model)."""
    if seq > cfg.max_seq_len:
        cfg = replace(cfg, max_seq_len=seq)
    with torch.device(device):
        model = make(cfg)
        tokens = torch.randint(0, cfg.vocab_size, (batch_size, seq))
    return model, (tokens,), cfg, seq
