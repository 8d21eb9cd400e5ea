"""torchvision models of the zoo (``torchvision:NAME``): any classification or semantic
segmentation model, ``weights=None`` (segmentation models return their ``"out"`` tensor
through :class:`~shardplan.workload.OutputSelector`). torchvision is imported only here.
"""

from __future__ import annotations

import difflib
from typing import Any

import torch
from torch import nn

from shardplan.errors import ShardplanError
from shardplan.workload._common import OutputSelector

__all__ = ["build_torchvision", "torchvision_names"]


_TV_INPUT = {"inception_v3": 299}
_TV_KWARGS = {"inception_v3": {"aux_logits": False, "init_weights": False},
              "googlenet": {"aux_logits": False, "init_weights": False}}


def torchvision_names() -> tuple[list[str], list[str]]:
    import torchvision

    cls = torchvision.models.list_models(module=torchvision.models)
    seg = torchvision.models.list_models(module=torchvision.models.segmentation)
    return sorted(cls), sorted(seg)


def build_torchvision(name: str, batch_size: int, image_size: int | None
                       ) -> tuple[nn.Module, tuple[Any, ...]]:
    try:
        import torchvision
    except ImportError as exc:  # pragma: no cover
        raise ShardplanError(f"torchvision:{name} needs torchvision ({exc})") from None
    cls, seg = torchvision_names()
    if name not in cls and name not in seg:
        close = difflib.get_close_matches(name.lower(), cls + seg, n=5, cutoff=0.6)
        hint = f" (did you mean {', '.join(close)}?)" if close else \
            " (see torchvision.models.list_models())"
        raise ShardplanError(f"unknown torchvision classification or segmentation model "
                             f"{name!r}{hint}")
    kwargs = dict(_TV_KWARGS.get(name, {}))
    if name in seg:
        kwargs["weights_backbone"] = None  # its default would download ImageNet weights
    model = torchvision.models.get_model(name, weights=None, **kwargs)
    if name in seg:
        model = OutputSelector(model, "out")
    size = image_size or _TV_INPUT.get(name, 224)
    return model, (torch.randn(batch_size, 3, size, size),)
