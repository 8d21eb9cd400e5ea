"""Per-operator FLOP counting on fake tensors (paper 000, section 3.2: node weights).

Each operator of an exported program is run alone on :class:`FakeTensorMode` tensors (shapes,
dtypes and strides only; no arithmetic) under :class:`torch.utils.flop_counter.FlopCounterMode`.
The forward count is that of the call; the backward count is that of ``torch.autograd.grad`` of
the call's outputs with respect to the inputs that need a gradient in the real model. Because
``FlopCounterMode`` decomposes composite operators (``linear`` into ``addmm``, ``conv2d`` into
``convolution``) exactly as it does in eager mode, the per-operator forward counts add up to the
eager total of the whole model.

``FlopCounterMode`` has no formula for PyTorch's CPU flash attention, so it would count zero for
attention evaluated on this machine; :func:`flop_mapping` supplies the standard
scaled-dot-product formulas for it. Pass the same mapping to any reference count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils import flop_counter

__all__ = ["OpFlops", "count_op_flops", "flop_mapping", "reference_flops"]

_aten = torch.ops.aten

# Real-tensor fallback is allowed only below this many input elements (about 1 GB of float32).
_REAL_FALLBACK_MAX_NUMEL = 1 << 28


def _cpu_flash_fwd(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None,
                   **kwargs: Any) -> int:
    return flop_counter.sdpa_flop_count(query, key, value)


def _cpu_flash_bwd(grad_out: Any, query: Any, key: Any, value: Any, *args: Any,
                   out_shape: Any = None, **kwargs: Any) -> int:
    return flop_counter.sdpa_backward_flop_count(grad_out, query, key, value)


def flop_mapping() -> dict[Any, Callable[..., int]]:
    """The ``custom_mapping`` for ``FlopCounterMode`` that shardplan counts with.

    It adds formulas for ``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward
    (the attention kernels used on CPU), which ``FlopCounterMode`` otherwise counts as 0. The
    formulas are torch's own ``sdpa_flop_count`` (2 batched matmuls: ``4 b h s_q s_k d``) and
    ``sdpa_backward_flop_count`` (5 batched matmuls, recomputing the scores).

    Returns
    -------
    dict
        Operator overload packet -> shape formula, ready for
        ``FlopCounterMode(custom_mapping=flop_mapping())``.
    """
    return {
        _aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_fwd,
        _aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_bwd,
    }


def _counter() -> flop_counter.FlopCounterMode:
    return flop_counter.FlopCounterMode(display=False, custom_mapping=flop_mapping())


def reference_flops(model: torch.nn.Module, example_inputs: Sequence[Any]) -> tuple[int, int]:
    """Forward and backward FLOPs of one real eager step, counted by ``FlopCounterMode``.

    Runs ``model(*example_inputs)`` for real (in the model's current train/eval mode) and then
    the backward pass of every floating output that requires a gradient, with a gradient of
    ones. This is the yardstick the per-operator counts of :func:`shardplan.capture.capture`
    are checked against; it costs one real training step.

    Returns
    -------
    (int, int)
        ``(forward_flops, backward_flops)``.
    """
    with _counter() as counter:
        out = model(*example_inputs)
    fwd = counter.get_total_flops()
    outs = [t for t in pytree.tree_leaves(out)
            if isinstance(t, torch.Tensor) and t.requires_grad]
    bwd = 0
    if outs:
        with _counter() as counter:
            torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
        bwd = counter.get_total_flops()
    return fwd, bwd


@dataclass(frozen=True, slots=True)
class OpFlops:
    """FLOPs of one operator call, and how they were obtained."""

    fwd: int
    bwd: int
    requires_grad: bool
    method: str  # "fake", "meta", "real" or "failed"


def _is_grad_dtype(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


def _run_counted(target: Callable[..., Any], args: Any, kwargs: Any, grad_inputs: list[Any],
                 wanted: Callable[[int], bool], mutates: bool) -> OpFlops:
    """Run one call under the counter (forward), then its backward; inputs already built."""
    if mutates:  # in-place ops must not write into leaves that require grad
        args, kwargs = pytree.tree_map_only(torch.Tensor, lambda t: t.clone(), (args, kwargs))
    with _counter() as counter:
        out = target(*args, **kwargs)
    fwd = counter.get_total_flops()
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    outs = [t for i, t in enumerate(leaves) if t.requires_grad and wanted(i)]
    requires_grad = any(t.requires_grad for t in leaves)
    bwd = 0
    if outs and grad_inputs:
        with _counter() as counter:
            torch.autograd.grad(outs, grad_inputs, [torch.ones_like(t) for t in outs],
                                allow_unused=True)
        bwd = counter.get_total_flops()
    return OpFlops(fwd, bwd, requires_grad, "")


def count_op_flops(
    target: Callable[..., Any],
    args: Any,
    kwargs: Any,
    needs_grad: Callable[[Any], bool],
    fake_mode: Any,
    *,
    used_outputs: Callable[[int], bool] | None = None,
) -> OpFlops:
    """Forward and backward FLOPs of one operator call, without real arithmetic.

    Parameters
    ----------
    target : callable
        The operator (an ``OpOverload``, usually).
    args, kwargs : pytree
        The call's arguments; tensors are given as *templates* (tensors or fake tensors whose
        shape, stride and dtype matter, not their values). Every template is replaced by a fresh
        tensor.
    needs_grad : callable
        ``needs_grad(template)`` says whether that input requires a gradient in the real model
        (parameters, and activations computed from parameters).
    fake_mode : FakeTensorMode
        The mode the fresh tensors are created in.
    used_outputs : callable, optional
        ``used_outputs(i)`` says whether output leaf ``i`` is used downstream; unused outputs get
        no gradient in the backward pass (as in eager autograd). Default: all are used.

    Returns
    -------
    OpFlops
        ``method`` is ``"fake"`` normally; ``"meta"`` or ``"real"`` (zero-filled tensors) when
        the operator failed on fake tensors, ``"failed"`` (0 FLOPs) when it failed everywhere.

    Notes
    -----
    O(cost of dispatching the operator twice); no tensor memory is touched on the fake path.
    """
    wanted = used_outputs or (lambda i: True)
    mutates = bool(getattr(getattr(target, "_schema", None), "is_mutable", False))
    attempts: list[tuple[str, Callable[[torch.Tensor], torch.Tensor], Any]] = [
        ("fake", lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype,
                                               device="cpu"), fake_mode),
        ("meta", lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype,
                                               device="meta"), None),
        ("real", lambda t: torch.zeros(t.shape, dtype=t.dtype), None),
    ]
    templates = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    numel = sum(t.numel() for t in templates)
    for method, make, mode in attempts:
        if method == "real" and numel > _REAL_FALLBACK_MAX_NUMEL:
            continue
        grad_inputs: list[torch.Tensor] = []

        def fresh(t: torch.Tensor, _make: Callable[[torch.Tensor], torch.Tensor] = make,
                  _leaves: list[torch.Tensor] = grad_inputs) -> torch.Tensor:
            new = _make(t)
            if _is_grad_dtype(new) and needs_grad(t):
                new.requires_grad_(True)
                _leaves.append(new)
            return new

        try:
            if mode is not None:
                with mode:
                    a, k = pytree.tree_map_only(torch.Tensor, fresh, (args, kwargs))
                    res = _run_counted(target, a, k, grad_inputs, wanted, mutates)
            else:
                a, k = pytree.tree_map_only(torch.Tensor, fresh, (args, kwargs))
                res = _run_counted(target, a, k, grad_inputs, wanted, mutates)
        except Exception:  # noqa: BLE001 - any failure moves on to the next method
            continue
        return OpFlops(res.fwd, res.bwd, res.requires_grad, method)
    rg = any(needs_grad(t) and _is_grad_dtype(t) for t in templates)
    return OpFlops(0, 0, rg, "failed")
