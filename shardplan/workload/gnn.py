"""Paper 000's graph neural network (its Figure 2; zoo name ``gnn[,key=value...]``).

Two chains of graph convolutions joined by a third convolution, message passing in plain
torch (:class:`GNN`); sizes are :class:`GNNConfig`'s fields, given as overrides after commas
(``gnn,hidden=64``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from shardplan.errors import ShardplanError

__all__ = ["GNN", "GNNConfig", "GraphConv", "build_gnn", "gnn_edges"]


@dataclass(kw_only=True, slots=True)
class GNNConfig:
    """Sizes of :class:`GNN`: a fixed graph of ``num_nodes`` nodes (a ring with
    ``chords`` extra seeded edges per node, both directions), ``in_features`` per node,
    ``hidden`` features in the convolutions, ``chain_length`` convolutions per chain."""

    num_nodes: int = 32
    in_features: int = 16
    hidden: int = 32
    num_classes: int = 4
    chain_length: int = 2
    chords: int = 2
    graph_seed: int = 0

    def __post_init__(self) -> None:
        for f in ("num_nodes", "in_features", "hidden", "num_classes", "chain_length"):
            if getattr(self, f) < 1:
                raise ShardplanError(f"gnn option {f} must be positive")
        if self.num_nodes < 3:
            raise ShardplanError("gnn option num_nodes must be at least 3 (a ring)")
        if self.chords < 0:
            raise ShardplanError("gnn option chords must be >= 0")


def gnn_edges(cfg: GNNConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """``(src, dst)`` of the GNN's fixed graph: a ring and ``chords`` seeded random edges
    per node, each in both directions, without self loops or repeats."""
    n = cfg.num_nodes
    gen = torch.Generator().manual_seed(int(cfg.graph_seed))
    pairs = {(i, (i + 1) % n) for i in range(n)}
    for i in range(n):
        for j in torch.randint(0, n, (cfg.chords,), generator=gen).tolist():
            if j != i:
                pairs.add((min(i, j), max(i, j)))
    both = sorted(pairs | {(b, a) for a, b in pairs})
    src = torch.tensor([a for a, _ in both], dtype=torch.int64)
    dst = torch.tensor([b for _, b in both], dtype=torch.int64)
    return src, dst


class GraphConv(nn.Module):
    """One graph convolution over a fixed graph: ``h_v' = relu(W_self h_v + W_nbr mean_{u ->
    v} h_u)``, messages gathered with ``index_select`` and summed per receiving node with
    ``index_add`` (plain torch, no graph library). Input and output ``(batch, nodes,
    features)``; the graph is the same for every sample (buffers, not inputs)."""

    def __init__(self, in_features: int, out_features: int, src: torch.Tensor,
                 dst: torch.Tensor, num_nodes: int) -> None:
        super().__init__()
        self.self_lin = nn.Linear(in_features, out_features)
        self.nbr_lin = nn.Linear(in_features, out_features, bias=False)
        deg = torch.zeros(num_nodes).index_add(0, dst, torch.ones(dst.numel()))
        self.register_buffer("src", src.clone(), persistent=False)
        self.register_buffer("dst", dst.clone(), persistent=False)
        self.register_buffer("inv_deg", (1.0 / deg.clamp_min(1.0)).unsqueeze(-1),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        messages = x.index_select(1, self.src)
        summed = torch.zeros_like(x).index_add(1, self.dst, messages)
        return torch.relu(self.self_lin(x) + self.nbr_lin(summed * self.inv_deg))


class GNN(nn.Module):
    """Paper 000's graph neural network (its Figure 2): two chains of graph convolutions
    over the same input, joined by a third convolution on their concatenated features, then
    a mean over the nodes and a linear classifier (graph classification).

    Input: node features ``(batch, nodes, in_features)``; output: logits ``(batch,
    classes)``. Captured at module level with ``--atomic GraphConv``, every convolution is
    one vertex (the readout and classifier fold into the joining one).
    """

    def __init__(self, cfg: GNNConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or GNNConfig()
        src, dst = gnn_edges(cfg)

        def chain() -> nn.ModuleList:
            sizes = [cfg.in_features] + [cfg.hidden] * cfg.chain_length
            return nn.ModuleList(GraphConv(a, b, src, dst, cfg.num_nodes)
                                 for a, b in zip(sizes, sizes[1:], strict=False))

        self.chain_a = chain()
        self.chain_b = chain()
        self.combine = GraphConv(2 * cfg.hidden, cfg.hidden, src, dst, cfg.num_nodes)
        self.head = nn.Linear(cfg.hidden, cfg.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x
        for conv in self.chain_a:
            a = conv(a)
        b = x
        for conv in self.chain_b:
            b = conv(b)
        h = self.combine(torch.cat([a, b], dim=-1))
        return self.head(h.mean(dim=1))


def build_gnn(overrides: dict[str, Any], batch_size: int) -> tuple[nn.Module, tuple[Any, ...]]:
    known = {f.name for f in fields(GNNConfig)}
    bad = sorted(set(overrides) - known)
    if bad:
        raise ShardplanError(f"unknown gnn option {bad[0]!r} (choose from "
                             f"{', '.join(sorted(known))})")
    for k, v in overrides.items():
        if isinstance(v, bool) or not isinstance(v, int):
            raise ShardplanError(f"gnn option {k} must be an integer, got {v!r}")
    cfg = GNNConfig(**overrides)
    model = GNN(cfg)
    return model, (torch.randn(batch_size, cfg.num_nodes, cfg.in_features),)
