"""The model zoo behind ``shardplan capture MODEL`` and ``shardplan train --model``.

``MODEL`` is one of

- ``mlp``: the multilayer perceptron of paper 000, section 4: three ``Linear`` layers and a
  softmax over 10 classes, on 767 bag-of-words features (767 -> 1024 -> 1024 -> 10, ReLU
  between the layers, which the paper leaves unsaid);
- ``transformer``: a small GPT-style decoder of ours (:class:`~shardplan.workload.gpt.GPTDecoder`);
- ``gnn``: paper 000's graph neural network (its Figure 2): two chains of graph convolutions
  joined by a third convolution, message passing in plain torch
  (:class:`~shardplan.workload.gnn.GNN`);
- ``torchvision:NAME``: any torchvision classification or semantic segmentation model,
  ``weights=None``;
- ``transformers:NAME``: BERT (``BertForMaskedLM``) and GPT-2 (``GPT2LMHeadModel``) built from
  their published configurations, so nothing is downloaded;
- ``FILE.py:FUNCTION``: ``FUNCTION()`` in that file returns ``(model, example_inputs)``.

``transformer``, ``gnn`` and ``transformers:NAME`` take configuration overrides after commas,
such as ``transformer,num_layers=2``, ``gnn,hidden=64`` or ``transformers:gpt2,n_layer=2``.

One module per model family: :mod:`~shardplan.workload.mlp`, :mod:`~shardplan.workload.gpt`,
:mod:`~shardplan.workload.gnn`, :mod:`~shardplan.workload.vision` (torchvision),
:mod:`~shardplan.workload.hf` (transformers), and :mod:`~shardplan.workload.llama` (to come);
this module names them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from shardplan.errors import ShardplanError
from shardplan.workload._common import parse_overrides as _parse_overrides
from shardplan.workload._user import load_user_function as _load_user_function
from shardplan.workload.gnn import build_gnn as _build_gnn
from shardplan.workload.gpt import build_transformer as _build_transformer
from shardplan.workload.hf import HF_CONFIGS
from shardplan.workload.hf import build_hf as _build_hf
from shardplan.workload.mlp import MLP
from shardplan.workload.vision import build_torchvision as _build_torchvision
from shardplan.workload.vision import torchvision_names as _torchvision_names

__all__ = ["build_model", "list_models"]


def list_models() -> list[str]:
    """Every ``MODEL`` name the zoo knows (``FILE.py:FUNCTION`` aside).

    Lists torchvision's classification and segmentation models when torchvision imports.
    """
    names = ["mlp", "transformer", "gnn", *(f"transformers:{n}" for n in HF_CONFIGS)]
    try:
        cls, seg = _torchvision_names()
    except ImportError:  # pragma: no cover
        return names
    return names + [f"torchvision:{n}" for n in cls + seg]


def build_model(spec: str, *, batch_size: int = 8, seq_len: int = 128,
                image_size: int | None = None) -> tuple[nn.Module, tuple[Any, ...], str]:
    """Build a model of the zoo and example inputs for it, deterministically.

    Parameters
    ----------
    spec : str
        ``mlp``, ``transformer[,key=value...]``, ``gnn[,key=value...]``, ``torchvision:NAME``,
        ``transformers:NAME[,key=value...]`` or ``FILE.py:FUNCTION``.
    batch_size : int
        Leading dimension of the example inputs (ignored for ``FILE.py:FUNCTION``).
    seq_len : int
        Tokens per sequence for language models.
    image_size : int, optional
        Height and width of image inputs (default 224; inception_v3 299).

    Returns
    -------
    (model, example_inputs, name)
        ``example_inputs`` is a tuple of positional arguments; ``name`` a short model name.

    Raises
    ------
    ShardplanError
        Unknown model, bad option, or a user file that cannot provide a model.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ShardplanError("the model must be a non-empty name")
    spec = spec.strip()
    for what, v in (("batch size", batch_size), ("sequence length", seq_len)):
        if not isinstance(v, int) or v < 1:
            raise ShardplanError(f"{what} must be a positive integer, got {v!r}")
    if image_size is not None and (not isinstance(image_size, int) or image_size < 1):
        raise ShardplanError(f"image size must be a positive integer, got {image_size!r}")
    torch.manual_seed(0)
    head, _, opts = spec.partition(",")
    if ":" in spec and spec.rsplit(":", 1)[0].endswith(".py"):
        return _load_user_function(spec)
    if head == "mlp":
        if opts:
            raise ShardplanError("mlp takes no options")
        return MLP(), (torch.randn(batch_size, 767),), "mlp"
    if head == "transformer":
        model, inputs = _build_transformer(_parse_overrides(opts, spec), batch_size, seq_len)
        return model, inputs, "transformer"
    if head == "gnn":
        model, inputs = _build_gnn(_parse_overrides(opts, spec), batch_size)
        return model, inputs, "gnn"
    kind, _, name = head.partition(":")
    if kind == "torchvision" and name:
        if opts:
            raise ShardplanError("torchvision models take no options")
        model, inputs = _build_torchvision(name, batch_size, image_size)
        return model, inputs, name
    if kind == "transformers" and name:
        model, inputs = _build_hf(name, _parse_overrides(opts, spec), batch_size, seq_len)
        return model, inputs, name
    raise ShardplanError(f"unknown model {spec!r} (expected mlp, transformer, gnn, "
                         f"torchvision:NAME, transformers:NAME or FILE.py:FUNCTION)")
