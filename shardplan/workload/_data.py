"""The batch and loss a zoo model trains on: the model in training mode with its example
inputs, the synthetic data of every step, and the loss. The same on every rank, in the
single-process reference, and where capture times the loss (``capture --profile``)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from shardplan.errors import ShardplanError
from shardplan.workload.zoo import build_model

__all__ = ["batch_for_step", "build", "loss_fn_for"]

# Models whose output is already a probability distribution (paper 000's MLP ends in softmax).
_PROBABILITY_OUTPUT = ("mlp",)


def build(spec: str, *, batch_size: int, seq_len: int | None = None,
          image_size: int | None = None,
          input_shapes: tuple[tuple[int, ...], ...] | None = None
          ) -> tuple[nn.Module, tuple[Any, ...], str]:
    """The zoo model in training mode and example inputs of ``batch_size`` samples.

    ``seq_len`` / ``image_size`` None: the zoo's defaults. ``input_shapes`` (the graph's,
    without the batch dimension): the built inputs must have them, or the graph is not this
    model's.
    """
    kw: dict[str, Any] = {"image_size": image_size}
    if seq_len is not None:
        kw["seq_len"] = seq_len
    with torch.random.fork_rng(devices=[]):  # build_model seeds the global RNG
        model, inputs, name = build_model(spec, batch_size=batch_size, **kw)
    model.train()
    inputs = tuple(inputs)
    if input_shapes is not None:
        have = tuple(tuple(int(d) for d in t.shape[1:]) for t in inputs
                     if isinstance(t, torch.Tensor))
        if have != tuple(tuple(s) for s in input_shapes):
            raise ShardplanError(f"the graph's inputs are {_shapes(input_shapes)} per sample, "
                                 f"{spec!r} takes {_shapes(have)}: the graph does not match "
                                 f"the model")
    return model, inputs, name


def _shapes(shapes: Any) -> str:
    return ", ".join("x".join(map(str, s)) or "scalar" for s in shapes)


def loss_fn_for(spec: str) -> Any:
    """Mean cross-entropy over samples (and tokens): on logits, or on probabilities for
    models that end in a softmax."""
    head = spec.split(",", 1)[0].strip()
    if head in _PROBABILITY_OUTPUT:
        def nll(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return F.nll_loss(torch.log(output.clamp_min(1e-12)), target)

        return nll

    def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))

    return cross_entropy


def batch_for_step(example_inputs: tuple[Any, ...], output_classes: int, *, batch_size: int,
                   seed: int, step: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Step ``step``'s global batch: inputs shaped like the examples with ``batch_size``
    samples, and class targets.

    Floating inputs are standard normal; integer inputs (token ids) and targets are uniform
    below ``output_classes`` (the output's last dimension: classes, or the vocabulary of a
    language model). A pure function of ``(seed, step)``: resumed runs see the same data.
    """
    gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(step))
    inputs = []
    for t in example_inputs:
        if not isinstance(t, torch.Tensor) or t.dim() == 0:
            raise ShardplanError("the runtime feeds models whose inputs are batched tensors")
        shape = (batch_size, *t.shape[1:])
        if t.is_floating_point():
            inputs.append(torch.randn(shape, generator=gen, dtype=t.dtype))
        else:
            inputs.append(torch.randint(0, output_classes, shape, generator=gen, dtype=t.dtype))
    return tuple(inputs), learnable_target(inputs, output_classes, seed=seed)


def learnable_target(inputs: list[torch.Tensor], output_classes: int, *, seed: int
                     ) -> torch.Tensor:
    """Targets a model can learn from its inputs, so a run's loss falls: for token inputs
    each token's class is a fixed permutation of the token itself (``(31 t + 7) mod
    classes``: an embedding and a head learn it); otherwise the class a fixed random linear
    teacher gives the first input (the argmax of ``x W``, ``W`` drawn from ``seed`` alone, the
    same every step)."""
    if _is_tokens(tuple(inputs)):
        return (inputs[0].long() * 31 + 7) % output_classes
    x = inputs[0].flatten(1).float()
    teacher = torch.Generator().manual_seed(int(seed) * 7_919 + 17)
    w = torch.randn((x.shape[1], output_classes), generator=teacher)
    return (x @ w).argmax(dim=1)


def _is_tokens(example_inputs: tuple[Any, ...]) -> bool:
    t = example_inputs[0]
    return not t.is_floating_point() and t.dim() == 2
