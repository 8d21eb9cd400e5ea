"""The training loss's measured cost (``capture --profile``).

A captured graph holds the model's operators; the loss a run computes on the model's output
(:func:`shardplan.workload.loss_fn_for`: cross-entropy over logits, or the negative log
of probabilities for models ending in a softmax) is not among them, yet every micro-batch
pays its forward and backward on the last stage: about 1.5 ms per micro-batch of a small
language model's logits on one CPU core (``benchmarks/calibration_breakdown.py``). With
``profile``, capture times that loss on the model's real output and records it in the
graph's ``meta["loss"]``; :func:`shardplan.cost.split_work` charges it to the node producing
the output, so every planner and the simulator see it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from shardplan.capture._profile import _mean_seconds
from shardplan.workload._data import batch_for_step, loss_fn_for

__all__ = ["profile_loss"]


def profile_loss(model: torch.nn.Module, example_inputs: Sequence[Any], output_name: str,
                 *, spec: str = "", batch_size: int, repeats: int = 5
                 ) -> dict[str, Any] | None:
    """Forward and backward seconds of the runtime's loss on ``model``'s output.

    Parameters
    ----------
    model : torch.nn.Module
        The captured model (run once without gradients for its output).
    example_inputs : sequence
        The capture's inputs (``batch_size`` samples).
    output_name : str
        The graph node producing the model's (first) output: where the loss is charged.
    spec : str
        The model spec the runtime will run (it picks the loss); ``""``: cross-entropy.
    batch_size : int
        Samples of ``example_inputs``: the loss's seconds are for that many.
    repeats : int
        Timed calls of each pass (``torch.utils.benchmark.Timer``, after its warm-up).

    Returns
    -------
    dict or None
        ``{"function", "output", "batch_size", "fwd_seconds", "bwd_seconds"}`` (the
        ``meta["loss"]`` of a graph); None when the model's output is not a floating tensor
        with a class dimension (no loss the runtime computes).

    Notes
    -----
    The forward is timed with autograd recording (as a run computes it), the backward as
    ``torch.autograd.grad`` of the loss with respect to the output (the loss's own backward,
    not the model's). Targets are drawn as the runtime draws them
    (:func:`~shardplan.workload.batch_for_step`). One thread, as ``profile_ops``.
    O(output size x repeats).
    """
    was = model.training
    model.eval()  # no buffer updates; the output's shape is the same
    try:
        with torch.no_grad():
            out = model(*example_inputs)
    finally:
        model.train(was)
    if isinstance(out, (tuple, list)):
        out = out[0] if out else None
    if not isinstance(out, torch.Tensor) or not out.is_floating_point() or out.dim() < 2:
        return None
    tensors = tuple(t for t in example_inputs if isinstance(t, torch.Tensor))
    if len(tensors) != len(tuple(example_inputs)) or any(t.dim() == 0 for t in tensors):
        return None
    _, target = batch_for_step(tensors, int(out.shape[-1]), batch_size=int(out.shape[0]),
                               seed=0, step=0)
    loss_fn = loss_fn_for(spec)
    out = out.detach()

    def forward_state() -> torch.Tensor:
        return out.clone().requires_grad_(True)

    def forward(x: torch.Tensor) -> None:
        loss_fn(x, target)

    def backward_state() -> tuple[torch.Tensor, torch.Tensor]:
        x = out.clone().requires_grad_(True)
        return x, loss_fn(x, target)

    def backward(state: tuple[torch.Tensor, torch.Tensor]) -> None:
        torch.autograd.grad(state[1], state[0], retain_graph=True)

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fwd = _mean_seconds(forward_state, forward, repeats)
        bwd = _mean_seconds(backward_state, backward, repeats)
    finally:
        torch.set_num_threads(old)
    name = getattr(loss_fn, "__name__", "loss")
    return {"function": name, "output": str(output_name), "batch_size": int(batch_size),
            "fwd_seconds": fwd, "bwd_seconds": bwd}
