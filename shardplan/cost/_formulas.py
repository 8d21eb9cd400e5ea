"""The execution model's formulas, each written once.

Everything that prices compute, a message, an all-reduce, an optimizer step or a stage's
memory -- the cost model, the partitioners' dynamic programs and refinement, the mapping
search and the simulator -- calls these elementwise functions (on scalars or arrays), so a
change to the model is a change here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["GRAD_CAST_BYTES", "MIXED_PRECISION_STEP_BYTES", "OPTIMIZER_FLOPS", "OPTIMIZER_STATE",
           "OPTIMIZER_STEP_TEMPORARY", "message_seconds",
           "optimizer_seconds", "ring_allreduce_seconds", "stage_memory", "sync_shards",
           "work_seconds"]

OPTIMIZER_STATE: Mapping[str, float] = {
    "sgd": 0.0,
    "sgd-momentum": 1.0,
    "momentum": 1.0,
    "adam": 2.0,
    "adamw": 2.0,
}
"""Optimizer state per parameter, in parameter copies: momentum is one buffer, Adam keeps the
first and second moments (Kingma & Ba 2015, Algorithm 1)."""

OPTIMIZER_STEP_TEMPORARY: Mapping[str, float] = {
    "sgd": 0.0,
    "sgd-momentum": 0.0,
    "momentum": 0.0,
    "adam": 2.0,
    "adamw": 2.0,
}
"""Memory the optimizer step allocates for a moment, in copies of the largest parameter
tensor: torch's Adam on CPU updates one tensor at a time and holds two temporaries of its
size (``sqrt(v)`` and the update); SGD, with or without momentum, works in place. Measured
with ``torch.distributed._tools.mem_tracker.MemTracker`` on torch 2.14
(``benchmarks/memory_calibration.py``)."""

OPTIMIZER_FLOPS: Mapping[str, float] = {"sgd": 2.0, "sgd-momentum": 4.0, "momentum": 4.0,
                                        "adam": 12.0, "adamw": 14.0}
"""FLOPs of one optimizer update per parameter: our estimate of the elementwise work (SGD's
scale and add; momentum's extra buffer update; Adam's two moment updates, bias corrections,
square root and division; AdamW's decoupled weight decay)."""

_MASTER_BYTES = 4  # fp32 master weights and optimizer state under mixed precision
_OPT_PARAM_BYTES = 4.0  # bytes per parameter when counting the optimizer's parameters


def work_seconds(measured: Any, flops: Any, speed: Any, rate: Any) -> Any:
    """Seconds of work on a device: ``measured / speed + flops / rate``.

    ``measured`` are profiled seconds (0 where the work was not measured), ``speed`` how much
    faster the device is than the profiling machine, ``flops`` the unmeasured FLOPs and
    ``rate`` the device's effective FLOP/s (peak times efficiency). Parmesan's c_u
    (section 4, equation 1). Broadcasts. O(size)."""
    return np.asarray(measured) / speed + np.asarray(flops) / rate


def message_seconds(tensors: Any, latency: Any, nbytes: Any, inv_bandwidth: Any) -> Any:
    """Seconds of one message carrying ``tensors`` tensors of ``nbytes`` in all over a link:
    ``tensors * latency + nbytes * inv_bandwidth`` (alpha-beta; one latency per tensor,
    sent back to back), 0 when nothing is sent. ``inv_bandwidth`` is ``inf`` where no route
    exists (then the message takes forever). Parmesan's c_m (sections 4.1 and 5.2).
    Broadcasts. O(size)."""
    b = np.asarray(nbytes, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        t = np.asarray(tensors) * latency + b * inv_bandwidth
    return np.where(b > 0, t, 0.0)


def ring_allreduce_seconds(replicas: Any, nbytes: Any, latency: Any, inv_bandwidth: Any) -> Any:
    """Seconds of a ring all-reduce of ``nbytes`` over ``replicas`` devices whose slowest ring
    link has ``latency`` and ``inv_bandwidth``: ``2 (R - 1) (latency + nbytes / (R B))``
    (reduce-scatter then all-gather, each of R - 1 synchronised steps of ``nbytes / R`` per
    device). 0 for one replica or no bytes. Parmesan's c_AR (equation 7, footnote 1) plus a
    latency per step. Broadcasts. O(size)."""
    r = np.asarray(replicas, dtype=np.float64)
    b = np.asarray(nbytes, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        t = 2.0 * (r - 1.0) * (np.asarray(latency) + b / np.maximum(r, 1.0) * inv_bandwidth)
    return np.where((r > 1) & (b > 0), t, 0.0)


#: Bytes one optimizer update reads and writes per 4-byte parameter: SGD reads the parameter
#: and its gradient and writes the parameter; momentum also reads and writes its buffer;
#: Adam reads parameter, gradient and both moments and writes parameter and moments.
OPTIMIZER_BYTES: Mapping[str, float] = {"sgd": 12.0, "sgd-momentum": 20.0, "momentum": 20.0,
                                        "adam": 28.0, "adamw": 28.0}


#: Bytes per parameter a mixed-precision step moves besides the update itself, counted from
#: Megatron-LM's ``MixedPrecisionOptimizer.step`` (``megatron/core/optimizer/optimizer.py``;
#: the same passes since its 2020 ``FP16_Optimizer``): the half-precision gradients copied
#: to the fp32 main gradients (2 read + 4 written), the gradient norm for clipping (4 read),
#: the updated fp32 main parameters copied back to the half-precision model (4 read + 2
#: written); fp16 also unscales the main gradients and checks them for inf (4 read + 4
#: written, ``_amp_foreach_non_finite_check_and_unscale_``). fp32 training has none.
MIXED_PRECISION_STEP_BYTES: Mapping[str, float] = {"fp32": 0.0, "bf16": 16.0, "fp8": 16.0,
                                                   "fp16": 24.0}
#: The part of :data:`MIXED_PRECISION_STEP_BYTES` that copies half-precision gradients to
#: fp32 (2 read + 4 written): gradients already accumulated in fp32 (Megatron-LM's
#: ``main_grad`` buffer under ``--accumulate-allreduce-grads-in-fp32``, FSDP2's fp32
#: ``reduce_dtype``) are used as they are (``main_grad.float()`` is the same tensor).
GRAD_CAST_BYTES = 6.0


def optimizer_seconds(param_bytes: Any, optimizer: str, rate: Any,
                      bandwidth: Any = np.inf, precision: str = "fp32",
                      fp32_grads: bool = False) -> Any:
    """Seconds of the optimizer step over ``param_bytes`` of parameters by a roofline: the
    larger of :data:`OPTIMIZER_FLOPS` per parameter at ``rate`` FLOP/s and
    :data:`OPTIMIZER_BYTES` per parameter at the device's memory ``bandwidth`` (bytes/s;
    ``inf``: not known, FLOPs alone), plus under a half ``precision`` the passes of the
    mixed-precision step (:data:`MIXED_PRECISION_STEP_BYTES`, less :data:`GRAD_CAST_BYTES`
    with ``fp32_grads``: gradients kept in fp32) at that bandwidth. The update
    is elementwise, so on most devices memory bound: on this machine's CPU an Adam step over
    1.85 M parameters takes 5.2 ms, 24x its FLOP time at 1e11 FLOP/s
    (``benchmarks/calibration.py``). Broadcasts. O(size).

    Examples
    --------
    >>> float(optimizer_seconds(4e9, "adam", 1e15, 1e12))  # 1e9 parameters x 28 bytes
    0.028
    >>> float(optimizer_seconds(4e9, "adam", 1e15, 1e12, precision="bf16"))  # + 16 bytes
    0.044
    >>> float(optimizer_seconds(4e9, "adam", 1e15, 1e12, "bf16", fp32_grads=True))  # + 10
    0.038
    >>> float(optimizer_seconds(4e9, "adam", 1e15, 1e12, "fp32", fp32_grads=True))  # no step
    0.028
    """
    n = np.asarray(param_bytes) / _OPT_PARAM_BYTES
    bw = np.asarray(bandwidth)
    step = MIXED_PRECISION_STEP_BYTES[precision]
    if fp32_grads and step > 0:
        step -= GRAD_CAST_BYTES
    return np.maximum(n * OPTIMIZER_FLOPS[optimizer] / rate,
                      n * OPTIMIZER_BYTES[optimizer] / bw) + n * step / bw


def sync_shards(gradient_sync: str, replicas: Any) -> tuple[Any, Any]:
    """``(shards, state_shards)`` of :func:`stage_memory` for a gradient synchronisation
    over ``replicas``: ``sharded`` (FSDP / ZeRO-3) splits everything over the replicas
    ``(replicas, 1)``; ``zero1`` (the distributed optimizer) only the master weights and
    optimizer state ``(1, replicas)``; ``end`` and ``bucketed`` nothing ``(1, 1)``."""
    if gradient_sync == "sharded":
        return replicas, 1
    if gradient_sync == "zero1":
        return 1, replicas
    return 1, 1


def stage_memory(*, params: Any, outputs: Any, received: Any, inputs: Any, extra: Any,
                 in_flight: Any, replicas: Any, optimizer: str, recompute: bool,
                 mixed_precision: bool = False, param_dtype_bytes: int = 2,
                 shards: Any = 1, gathered: Any = 0.0,
                 largest_param: Any = 0.0, state_shards: Any = 1) -> dict[str, Any]:
    """Every memory term of a stage, bytes per device, elementwise over stages.

    With ``P = params`` (parameter bytes):

    - ``params = P``, ``gradients = P``;
    - ``optimizer = f P`` with ``f`` from :data:`OPTIMIZER_STATE`; under
      ``mixed_precision`` the optimizer keeps fp32 master weights,
      ``master = 4 P / param_dtype_bytes``, and fp32 state ``f * master`` (Micikevicius et
      al. 2018; ZeRO's 16 bytes per parameter for Adam with fp16, Rajbhandari et al. 2020);
    - ``activations``: one micro-batch's are the stage's ``outputs`` plus what it
      ``received`` from other stages; it keeps them for each of the ``in_flight``
      micro-batches. With ``recompute`` (GPipe section 2.3) it keeps only its inputs
      (``received`` plus the outputs of graph inputs in the stage, ``inputs``) per micro-batch
      in flight and re-creates one micro-batch's other outputs during its backward. The
      ``replicas`` of a stage split every micro-batch, so activations are divided by them
      (parameters and optimizer state are replicated in full);
    - ``extra``: other working memory, once;
    - sharded data parallelism (FSDP, ZeRO-3): parameters, gradients, master weights and
      optimizer state are split over ``shards`` devices, and ``gathered`` bytes of
      parameters are held whole at a time (the units all-gathered for the running and the
      prefetched layer).
    - the distributed optimizer (ZeRO-1, ``gradient_sync="zero1"``): master weights,
      optimizer state and the step's temporaries are split over ``state_shards`` devices
      (further, after ``shards``); parameters and gradients stay whole (Rajbhandari et al.
      2020, section 5.1, P_os; Megatron's ``--use-distributed-optimizer``).

    - ``step_temporary``: what the optimizer step allocates for a moment,
      :data:`OPTIMIZER_STEP_TEMPORARY` copies of the ``largest_param`` tensor (fp32 master
      copies under mixed precision, split over ``shards``). The step runs after the last
      backward has freed the activations, so the peak holds the larger of the two.

    ``total`` is the sum of everything but the activations and the step temporaries, plus
    the larger of those two: the peak of the compute phase or of the optimizer step
    (``benchmarks/memory_calibration.py`` checks it against torch's MemTracker).
    Broadcasts. O(size).
    """
    factor = OPTIMIZER_STATE[optimizer]
    p = np.asarray(params, dtype=np.float64) / np.asarray(shards, dtype=np.float64)
    state = p / np.asarray(state_shards, dtype=np.float64)
    if mixed_precision:
        master = state * (_MASTER_BYTES / param_dtype_bytes)
        opt = factor * master
    else:
        master = np.zeros_like(p)
        opt = factor * state
    flight = np.asarray(in_flight, dtype=np.float64)
    if recompute:
        acts = flight * (np.asarray(received) + inputs) + (np.asarray(outputs) - inputs)
    else:
        acts = flight * (np.asarray(outputs) + received)
    acts = acts / np.asarray(replicas, dtype=np.float64)
    extra = np.asarray(extra, dtype=np.float64) + 0.0 * p
    whole = np.asarray(gathered, dtype=np.float64) + 0.0 * p
    temp = OPTIMIZER_STEP_TEMPORARY[optimizer] * np.asarray(largest_param, dtype=np.float64) \
        / np.asarray(shards, dtype=np.float64) / np.asarray(state_shards, dtype=np.float64) \
        + 0.0 * p
    if mixed_precision:
        temp = temp * (_MASTER_BYTES / param_dtype_bytes)
    total = p + p + master + opt + np.maximum(acts, temp) + extra + whole
    return {"params": p, "gradients": p.copy(), "master": master, "optimizer": opt,
            "activations": acts, "step_temporary": temp, "extra": extra, "gathered": whole,
            "total": total}
