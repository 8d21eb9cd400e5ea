"""A small GPT-style decoder of ours (zoo name ``transformer[,key=value...]``).

Pre-LayerNorm decoder blocks with causal self-attention through
``F.scaled_dot_product_attention`` and a GELU MLP, learned position embeddings and an untied
LM head. Its sizes are :class:`GPTDecoderConfig`'s fields, given as overrides after commas
(``transformer,num_layers=2``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from shardplan.errors import ShardplanError

__all__ = ["CausalSelfAttention", "DecoderBlock", "FeedForward", "GPTDecoder",
           "GPTDecoderConfig", "build_transformer"]


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
