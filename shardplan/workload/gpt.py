"""GPT-style decoders: a small one of ours (zoo name ``transformer[,key=value...]``) and a
Megatron-style GPT given its dimensions (``gpt:hidden=...,layers=...,heads=...,vocab=...,seq=...``).

The small decoder: pre-LayerNorm decoder blocks with causal self-attention through
``F.scaled_dot_product_attention`` and a GELU MLP, learned position embeddings and an untied
LM head. Its sizes are :class:`GPTDecoderConfig`'s fields, given as overrides after commas
(``transformer,num_layers=2``).

The Megatron-style GPT (:class:`MegatronGPT`, arXiv 1909.08053 and 2104.04473): pre-LayerNorm,
a fused QKV projection, one causal ``F.scaled_dot_product_attention`` call, a GELU MLP of
width ``ffn`` (default 4 hidden), learned absolute positions, biases everywhere and an output
head tied to the word embedding. Module names follow torchtitan's so that plans keyed by
module name read both families alike: ``tok_embeddings``, ``pos_embeddings``,
``layers.N.attention_norm``, ``layers.N.attention.wqkv``, ``layers.N.attention.wo``,
``layers.N.ffn_norm``, ``layers.N.feed_forward.w1``, ``layers.N.feed_forward.w2``, ``norm``,
``output`` (its weight is ``tok_embeddings.weight``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from shardplan.errors import ShardplanError

__all__ = ["CausalSelfAttention", "DecoderBlock", "FeedForward", "GPTConfig", "GPTDecoder",
           "GPTDecoderConfig", "MegatronGPT", "build_gpt", "build_transformer", "gpt_config",
           "gpt_parameter_count", "gpt_transformer_meta"]


@dataclass(kw_only=True, slots=True)
class GPTDecoderConfig:
    """Sizes of :class:`GPTDecoder`."""

    vocab_size: int = 8192
    d_model: int = 256
    num_layers: int = 4
    num_heads: int = 4
    mlp_ratio: int = 4
    max_seq_len: int = 1024
    dropout: float = 0.0

    def __post_init__(self) -> None:
        for f in ("vocab_size", "d_model", "num_layers", "num_heads", "mlp_ratio",
                  "max_seq_len"):
            if getattr(self, f) < 1:
                raise ShardplanError(f"transformer option {f} must be positive")
        if self.d_model % self.num_heads:
            raise ShardplanError(f"transformer d_model={self.d_model} is not divisible by "
                                 f"num_heads={self.num_heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ShardplanError("transformer dropout must be in [0, 1)")


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through ``F.scaled_dot_product_attention``."""

    def __init__(self, cfg: GPTDecoderConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        shape = (b, s, self.num_heads, d // self.num_heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(b, s, d))


class FeedForward(nn.Module):
    """The position-wise MLP of a transformer block (GELU)."""

    def __init__(self, cfg: GPTDecoderConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
        self.act = nn.GELU()
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.fc(x)))


class DecoderBlock(nn.Module):
    """A pre-LayerNorm decoder block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, cfg: GPTDecoderConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = FeedForward(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPTDecoder(nn.Module):
    """A small GPT-style language model: embeddings, pre-LN decoder blocks, LM head.

    Input: token ids of shape ``(batch, seq)``; output: logits ``(batch, seq, vocab)``.
    """

    def __init__(self, cfg: GPTDecoderConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or GPTDecoderConfig()
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(DecoderBlock(cfg) for _ in range(cfg.num_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.tok_emb(ids) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def build_transformer(overrides: dict[str, Any], batch_size: int, seq_len: int
                       ) -> tuple[nn.Module, tuple[Any, ...]]:
    known = {f.name for f in fields(GPTDecoderConfig)}
    bad = sorted(set(overrides) - known)
    if bad:
        raise ShardplanError(f"unknown transformer option {bad[0]!r} (choose from "
                             f"{', '.join(sorted(known))})")
    values = {**overrides}
    values.setdefault("max_seq_len", max(1024, seq_len))
    cfg = GPTDecoderConfig(**values)
    if seq_len > cfg.max_seq_len:
        raise ShardplanError(f"--seq-len {seq_len} exceeds max_seq_len {cfg.max_seq_len}")
    model = GPTDecoder(cfg)
    return model, (torch.randint(0, cfg.vocab_size, (batch_size, seq_len)),)


@dataclass(kw_only=True, slots=True)
class GPTConfig:
    """Dimensions of a Megatron-style GPT (the ``gpt:`` spec's keys).

    Attributes
    ----------
    hidden, layers, heads, vocab : int
    seq : int
        Sequence length: the learned position table's rows and the example inputs' length.
    ffn : int or None
        MLP width (None: 4 hidden).
    dropout : float
        Megatron-LM's ``--hidden-dropout`` and ``--attention-dropout`` (both 0.1 by default,
        as there): after the embeddings, after each block's attention and MLP outputs, and
        on the attention probabilities.
    """

    hidden: int
    layers: int
    heads: int
    vocab: int
    seq: int
    ffn: int | None = None
    dropout: float = 0.1

    def __post_init__(self) -> None:
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) \
                or not 0.0 <= self.dropout < 1.0:
            raise ShardplanError(f"gpt dropout must be in [0, 1), got {self.dropout!r}")
        for f in ("hidden", "layers", "heads", "vocab", "seq", "ffn"):
            v = getattr(self, f)
            if v is None and f == "ffn":
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ShardplanError(f"gpt option {f} must be a positive integer, got {v!r}")
        if self.hidden % self.heads:
            raise ShardplanError(f"gpt hidden={self.hidden} is not divisible by "
                                 f"heads={self.heads}")

    @property
    def ffn_dim(self) -> int:
        return self.ffn if self.ffn is not None else 4 * self.hidden


def gpt_parameter_count(cfg: GPTConfig) -> int:
    """Parameters of :class:`MegatronGPT` (the tied head counted once), from its dimensions:
    per layer QKV and output projections with biases, two LayerNorms and the MLP; plus word
    and position embeddings and the final LayerNorm. With ``ffn = 4h`` this is Megatron's
    ``12 l h^2 (1 + 13 / (12 h)) + V h + s h``, plus the final LayerNorm's ``2 h``."""
    h, f = cfg.hidden, cfg.ffn_dim
    layer = (3 * h * h + 3 * h) + (h * h + h) + 4 * h + (h * f + f) + (f * h + h)
    return cfg.layers * layer + cfg.vocab * h + cfg.seq * h + 2 * h


def gpt_transformer_meta(cfg: GPTConfig) -> dict[str, Any]:
    """The dimensions planners read (a graph's ``meta["transformer"]``)."""
    return {"family": "gpt", "hidden": cfg.hidden, "layers": cfg.layers, "heads": cfg.heads,
            "kv_heads": cfg.heads, "ffn": cfg.ffn_dim, "vocab": cfg.vocab, "seq": cfg.seq,
            "tied": True, "parameters": gpt_parameter_count(cfg)}


class _GPTAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.dropout = cfg.dropout
        self.wqkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.wo = nn.Linear(cfg.hidden, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.wqkv(x).split(h, dim=-1)
        shape = (b, s, self.heads, h // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.wo(y.transpose(1, 2).reshape(b, s, h))


class _GPTMLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.hidden, cfg.ffn_dim)
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class _GPTBlock(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.dropout = cfg.dropout
        self.attention_norm = nn.LayerNorm(cfg.hidden)
        self.attention = _GPTAttention(cfg)
        self.ffn_norm = nn.LayerNorm(cfg.hidden)
        self.feed_forward = _GPTMLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Megatron's bias-dropout-add: the hidden dropout on the block's full hidden state,
        # after the row-parallel product's all-reduce (so it is not tensor-parallel work)
        p = self.dropout if self.training else 0.0
        h = x + F.dropout(self.attention(self.attention_norm(x)), p)
        return h + F.dropout(self.feed_forward(self.ffn_norm(h)), p)


class MegatronGPT(nn.Module):
    """A Megatron-style GPT: token ids ``(batch, seq)`` -> logits ``(batch, seq, vocab)``."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos_embeddings = nn.Embedding(cfg.seq, cfg.hidden)
        self.layers = nn.ModuleDict({str(i): _GPTBlock(cfg) for i in range(cfg.layers)})
        self.norm = nn.LayerNorm(cfg.hidden)
        self.output = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        self.output.weight = self.tok_embeddings.weight  # tied, as Megatron's

    def transformer_meta(self, seq_len: int) -> dict[str, Any]:
        """The dimensions planners read (:func:`gpt_transformer_meta`; ``seq_len`` is
        the configuration's)."""
        return gpt_transformer_meta(self.cfg)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        h = F.dropout(self.tok_embeddings(ids) + self.pos_embeddings(pos), self.cfg.dropout,
                      self.training)
        for layer in self.layers.values():
            h = layer(h)
        return self.output(self.norm(h))


def gpt_config(overrides: dict[str, Any], seq_len: int) -> GPTConfig:
    """:class:`GPTConfig` from a ``gpt:`` spec's options (``seq`` defaults to ``seq_len``).

    Raises
    ------
    ShardplanError
        A missing or unknown option, or a bad value.
    """
    known = {f.name for f in fields(GPTConfig)}
    bad = sorted(set(overrides) - known)
    if bad:
        raise ShardplanError(f"unknown gpt option {bad[0]!r} (choose from "
                             f"{', '.join(sorted(known))})")
    missing = [k for k in ("hidden", "layers", "heads", "vocab") if k not in overrides]
    if missing:
        raise ShardplanError(f"gpt needs {', '.join(missing)} (gpt:hidden=H,layers=L,heads=A,"
                             f"vocab=V[,seq=S,ffn=F])")
    return GPTConfig(**{"seq": seq_len, **overrides})


def build_gpt(overrides: dict[str, Any], batch_size: int, seq_len: int, *,
              device: str = "cpu") -> tuple[nn.Module, tuple[Any, ...], GPTConfig]:
    """A :class:`MegatronGPT` and example token ids of ``(batch_size, cfg.seq)``, on
    ``device`` (``"meta"``: no storage)."""
    cfg = gpt_config(overrides, seq_len)
    with torch.device(device):
        model = MegatronGPT(cfg)
        ids = torch.randint(0, cfg.vocab, (batch_size, cfg.seq))
    return model, (ids,), cfg
