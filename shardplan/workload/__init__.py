"""The workload: a model, the batch it trains on and its loss; what capture traces and the
runtime trains, so that neither has to ask the other.

=====================  =====================================================================
module                 holds
=====================  =====================================================================
:mod:`.zoo`            :func:`build_model` by spec (``mlp``, ``transformer``, ``gnn``,
                       ``gpt:hidden=...``, ``llama3:FLAVOR``, ``llama2:FLAVOR``,
                       ``torchvision:NAME``, ``transformers:NAME``, ``FILE.py:FUNCTION``),
                       on the meta device when asked or when too large, and
                       :func:`list_models`
:mod:`.mlp`            paper 000's MLP
:mod:`.gpt`            the small GPT-style decoder and the Megatron-style GPT by dimensions
:mod:`.gnn`            paper 000's graph neural network
:mod:`.vision`         torchvision adapters
:mod:`.hf`             Hugging Face ``transformers`` adapters (BERT, GPT-2)
:mod:`.llama`          Llama 2 / 3 by their published flavors (torchtitan's dimensions)
:mod:`.program`        the model exported by ``torch.export`` and which of its nodes are
                       operators (capture's graph nodes, the runtime's split points)
``_data``              :func:`build` (the model in training mode), :func:`batch_for_step`
                       (each step's synthetic batch), :func:`loss_fn_for` (its loss)
=====================  =====================================================================

Layering (``docs/architecture.md``): this package imports torch and :mod:`shardplan.errors`
only; :mod:`shardplan.capture` and :mod:`shardplan.runtime` import it, never each other.
Importing ``shardplan.workload`` itself does not import torch: the names below are loaded on
first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["GNN", "MLP", "HF_CONFIGS", "GNNConfig", "GPTDecoder", "GPTDecoderConfig",
           "GraphConv", "OutputSelector", "batch_for_step", "build", "build_model",
           "export_model", "gnn_edges", "graph_ops", "list_models", "loss_fn_for",
           "normalize_inputs", "tensor_bytes"]

_WHERE = {
    "MLP": "mlp", "GPTDecoder": "gpt", "GPTDecoderConfig": "gpt", "GNN": "gnn",
    "GNNConfig": "gnn", "GraphConv": "gnn", "gnn_edges": "gnn", "HF_CONFIGS": "hf",
    "OutputSelector": "_common", "normalize_inputs": "_common", "build_model": "zoo",
    "list_models": "zoo", "build": "_data", "batch_for_step": "_data", "loss_fn_for": "_data",
    "export_model": "program", "graph_ops": "program", "tensor_bytes": "program",
}


def __getattr__(name: str) -> Any:
    """PEP 562: the names of :data:`__all__`, imported (with torch) on first access."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'shardplan.workload' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"shardplan.workload.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
