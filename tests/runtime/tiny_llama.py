"""A tiny Llama for the LLM runtime's tests (``tests/runtime/tiny_llama.py:build``), with
torchtitan's module names and structure: ``tok_embeddings``, ``layers`` (a ``ModuleDict``
keyed by block index), ``layers.N.attention_norm``, ``layers.N.attention.wq/wk/wv/wo`` (one
``F.scaled_dot_product_attention`` call, grouped-query attention, rotary embeddings),
``layers.N.ffn_norm``, ``layers.N.feed_forward.w1/w2/w3`` (SwiGLU), ``norm`` and an untied
``output``. It stands in for :mod:`shardplan.workload.llama` until that model lands.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, LAYERS, HEADS, KV_HEADS, FFN, SEQ, BATCH = 64, 32, 5, 4, 2, 48, 8, 8


def _rope(head_dim: int, seq: int) -> torch.Tensor:
    inv = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    ang = torch.outer(torch.arange(seq).float(), inv)
    return torch.cat([ang.cos(), ang.sin()], dim=-1)  # (seq, head_dim)


def _apply_rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    cos, sin = freqs[: x.shape[1], :half], freqs[: x.shape[1], half:]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = HEADS, KV_HEADS, DIM // HEADS
        self.wq = nn.Linear(DIM, HEADS * self.head_dim, bias=False)
        self.wk = nn.Linear(DIM, KV_HEADS * self.head_dim, bias=False)
        self.wv = nn.Linear(DIM, KV_HEADS * self.head_dim, bias=False)
        self.wo = nn.Linear(HEADS * self.head_dim, DIM, bias=False)

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim)  # -1: the heads this rank holds
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        q, k = _apply_rope(q, freqs), _apply_rope(k, freqs)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(DIM, FFN, bias=False)
        self.w2 = nn.Linear(FFN, DIM, bias=False)
        self.w3 = nn.Linear(DIM, FFN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(DIM, eps=1e-5)
        self.attention = Attention()
        self.ffn_norm = nn.RMSNorm(DIM, eps=1e-5)
        self.feed_forward = FeedForward()

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs)
        return h + self.feed_forward(self.ffn_norm(h))


class TinyLlama(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.register_buffer("freqs_cis", _rope(DIM // HEADS, SEQ), persistent=False)
        self.layers = nn.ModuleDict({str(i): Block() for i in range(LAYERS)})
        self.norm = nn.RMSNorm(DIM, eps=1e-5)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.freqs_cis)
        return self.output(self.norm(h))


def build() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The model (seeded weights) and a batch of token ids."""
    torch.manual_seed(0)
    model = TinyLlama()
    return model, (torch.randint(0, VOCAB, (BATCH, SEQ)),)
