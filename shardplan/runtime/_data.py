"""Models, synthetic data and losses of a run: the same on every rank and in the reference."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from shardplan.errors import ShardplanError

__all__ = ["batch_for_step", "build", "loss_fn_for", "microbatches"]

# Models whose output is already a probability distribution (paper 000's MLP ends in softmax).
_PROBABILITY_OUTPUT = ("mlp",)


def build(spec: str, *, batch_size: int, seq_len: int) -> tuple[nn.Module, tuple[Any, ...], str]:
    """The zoo model in training mode and example inputs of ``batch_size`` samples."""
    from shardplan.capture import build_model

    with torch.random.fork_rng(devices=[]):  # build_model seeds the global RNG
        model, inputs, name = build_model(spec, batch_size=batch_size, seq_len=seq_len)
    model.train()
    return model, tuple(inputs), name


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
    tshape = (batch_size, *example_inputs[0].shape[1:]) if _is_tokens(example_inputs) \
        else (batch_size,)
    target = torch.randint(0, output_classes, tshape, generator=gen)
    return tuple(inputs), target


def _is_tokens(example_inputs: tuple[Any, ...]) -> bool:
    t = example_inputs[0]
    return not t.is_floating_point() and t.dim() == 2


def microbatches(inputs: tuple[torch.Tensor, ...], target: torch.Tensor, count: int
                 ) -> list[tuple[tuple[torch.Tensor, ...], torch.Tensor]]:
    """Split a batch into ``count`` equal consecutive chunks (the order every run uses)."""
    xs = [t.tensor_split(count) for t in inputs]
    ys = target.tensor_split(count)
    return [(tuple(x[i] for x in xs), ys[i]) for i in range(count)]
