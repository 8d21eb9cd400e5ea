"""Swin-L (Liu et al. 2021, Table 1 / section 3.3) as torchvision's ``SwinTransformer``.

Swin-L's published sizes: patch 4, embedding dimension C = 192, stage depths (2, 2, 18, 2),
heads (6, 12, 24, 48), window 7 at 224 x 224 pixels (ImageNet-22K pre-training), MLP ratio 4,
stochastic depth 0.2 (inactive under capture: it only drops paths in training mode, and
the capture traces the train-mode graph with it kept as identity-or-drop; the FLOPs are the
same). torchvision ships Swin-T/S/B only; this is the same class with Swin-L's sizes.

A ``FILE.py:FUNCTION`` spec for ``shardplan capture`` and ``benchmarks._graphs.captured``::

    .venv/bin/shardplan capture benchmarks/models/swin_l.py:build -o swin_l.json

``build`` uses a batch of 8 images (``FILE.py:FUNCTION`` specs choose their own inputs);
``build_batch`` takes another.
"""

from __future__ import annotations

from typing import Any

BATCH_SIZE = 8
IMAGE_SIZE = 224


def build_batch(batch_size: int = BATCH_SIZE, image_size: int = IMAGE_SIZE,
                num_classes: int = 1000) -> tuple[Any, Any]:
    """``(model, example_inputs)``: Swin-L and a batch of random images."""
    import torch
    from torchvision.models.swin_transformer import SwinTransformer

    model = SwinTransformer(patch_size=[4, 4], embed_dim=192, depths=[2, 2, 18, 2],
                            num_heads=[6, 12, 24, 48], window_size=[7, 7],
                            stochastic_depth_prob=0.2, num_classes=num_classes)
    return model, torch.randn(batch_size, 3, image_size, image_size)


def build() -> tuple[Any, Any]:
    """Swin-L with a batch of 8 images of 224 x 224."""
    return build_batch()
