"""The model zoo, kept importable here for old scripts: it lives in :mod:`shardplan.workload`
(:mod:`shardplan.workload.zoo` names the models, one module per family)."""

from __future__ import annotations

from shardplan.workload._common import OutputSelector, normalize_inputs
from shardplan.workload.gnn import GNN, GNNConfig, GraphConv, gnn_edges
from shardplan.workload.gpt import GPTDecoder, GPTDecoderConfig
from shardplan.workload.hf import HF_CONFIGS
from shardplan.workload.mlp import MLP
from shardplan.workload.zoo import build_model, list_models

__all__ = ["GNN", "GNNConfig", "GPTDecoder", "GPTDecoderConfig", "GraphConv", "HF_CONFIGS",
           "MLP", "OutputSelector", "build_model", "gnn_edges", "list_models",
           "normalize_inputs"]
