"""Measured per-operator seconds (``shardplan capture --profile``).

The paper's planner weighs nodes by their cost; FLOPs are a proxy, and on a given machine the
measured time is the real thing. :func:`profile_ops` runs the exported program once on real
tensors with a :class:`torch.fx.Interpreter` that times every operator: forward alone, and
backward (``torch.autograd.grad`` of the operator's outputs, with a gradient of ones, with
respect to fresh leaf copies of the inputs that need a gradient). Each operator's time is
the mean of ``repeats`` calls measured by ``torch.utils.benchmark.Timer``, which warms up and
synchronises CUDA around the measurement (a bare ``time.perf_counter`` around a CUDA operator
measures only its launch); the copies and the forward a backward needs are made in the
timer's setup, outside the measured calls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils import _pytree as pytree
from torch.utils import benchmark

from shardplan.capture._export import OpCapture

__all__ = ["model_step_seconds", "profile_ops", "scale_to_model"]


def _program_args(ep: torch.export.ExportedProgram, example_inputs: Sequence[Any]
                  ) -> list[Any]:
    """Real values for the exported graph's placeholders, in order."""
    from torch.export.graph_signature import InputKind

    flat_user = pytree.tree_leaves(tuple(example_inputs))
    state = ep.state_dict
    values: list[Any] = []
    user_i = 0
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            values.append(flat_user[user_i])
            user_i += 1
        elif spec.kind == InputKind.PARAMETER and spec.target in state:
            values.append(state[spec.target])
        elif spec.kind == InputKind.BUFFER and spec.target in state:
            values.append(state[spec.target].clone())  # train-mode ops update buffers
        else:
            values.append(ep.constants[spec.target])
    return values


def _mean_seconds(prepare: Callable[[], Any], run: Callable[[Any], Any], repeats: int) -> float:
    """Seconds per call of ``run(state)``, ``state = prepare()`` made once in the timer's
    untimed setup: ``torch.utils.benchmark.Timer.timeit(repeats)`` (its warm-up calls first,
    CUDA synchronised around the block), with the current number of threads. ``run`` must
    be repeatable on the same state."""
    timer = benchmark.Timer(stmt="run(state)", setup="state = prepare()",
                            globals={"prepare": prepare, "run": run},
                            num_threads=torch.get_num_threads())
    return float(timer.timeit(max(int(repeats), 1)).median)


class _TimingInterpreter(torch.fx.Interpreter):
    """Runs the program for real, timing every captured operator on the way."""

    def __init__(self, gm: torch.fx.GraphModule, index: dict[str, int], repeats: int,
                 progress: Callable[[str, int, int], None] | None) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.index = index
        self.repeats = repeats
        self.progress = progress
        self.fwd = [0.0] * len(index)
        self.bwd = [0.0] * len(index)
        self.grad_env: dict[str, bool] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op != "call_function" or n.name not in self.index:
            if n.op != "placeholder":  # (getitem of a split, ...): a gradient flows through
                self.grad_env[n.name] = any(self.grad_env.get(a.name, False)
                                            for a in n.all_input_nodes)
            with torch.no_grad():
                return super().run_node(n)
        i = self.index[n.name]
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        mutates = bool(getattr(getattr(n.target, "_schema", None), "is_mutable", False))
        needs = {id(self.env[a]): self.grad_env.get(a.name, False) for a in n.all_input_nodes
                 if isinstance(self.env.get(a), torch.Tensor)}

        def fresh(with_grad: bool) -> tuple[Any, Any, list[torch.Tensor]]:
            leaves: list[torch.Tensor] = []

            def copy(t: torch.Tensor) -> torch.Tensor:
                new = t.detach().clone() if mutates else t.detach()
                if with_grad and new.is_floating_point() and needs.get(id(t), False):
                    new = new.clone().requires_grad_(True)
                    leaves.append(new)
                return new

            a, k = pytree.tree_map_only(torch.Tensor, copy, (args, kwargs))
            return a, k, leaves

        def forward_inputs() -> tuple[Any, Any]:
            a, k, _ = fresh(False)
            return a, k

        def forward(state: tuple[Any, Any]) -> None:
            with torch.no_grad():
                n.target(*state[0], **state[1])

        def backward_inputs() -> tuple[list[torch.Tensor], list[torch.Tensor], list[Any]]:
            a, k, leaves = fresh(True)
            if mutates:  # an in-place op may not write into a leaf: give it a non-leaf copy
                a, k = pytree.tree_map_only(torch.Tensor, lambda t: t * 1, (a, k))
            out = n.target(*a, **k)
            outs = [t for t in pytree.tree_leaves(out)
                    if isinstance(t, torch.Tensor) and t.requires_grad]
            return outs, leaves, [torch.ones_like(t) for t in outs]

        def backward(state: tuple[list[torch.Tensor], list[torch.Tensor], list[Any]]) -> None:
            outs, leaves, grads = state
            if outs:  # repeatable: the timer calls it several times on one forward
                torch.autograd.grad(outs, leaves, grads, allow_unused=True, retain_graph=True)

        self.fwd[i] = _mean_seconds(forward_inputs, forward, self.repeats)
        has_grad = any(needs.values())
        if has_grad and backward_inputs()[0]:  # outputs that carry a gradient
            self.bwd[i] = _mean_seconds(backward_inputs, backward, self.repeats)
        with torch.no_grad():
            result = super().run_node(n)
        self.grad_env[n.name] = has_grad
        if self.progress is not None:
            self.progress("profile", i + 1, len(self.index))
        return result


def profile_ops(ep: torch.export.ExportedProgram, cap: OpCapture, model: torch.nn.Module,
                example_inputs: Sequence[Any], *, repeats: int = 3,
                progress: Callable[[str, int, int], None] | None = None
                ) -> tuple[list[float], list[float]]:
    """Measured forward and backward seconds of every captured operator, on this machine.

    Parameters
    ----------
    ep : ExportedProgram
    cap : OpCapture
        The operator capture of ``ep`` (which nodes are ops).
    model : torch.nn.Module
        The exported model (parameters decide which inputs need gradients).
    example_inputs : sequence
        Real inputs, as given to the export.
    repeats : int
        Timed repetitions after one warm-up; the median is kept.

    Returns
    -------
    (list of float, list of float)
        Forward and backward seconds per op, in capture order.

    Notes
    -----
    Runs with one intra-op thread (``torch.set_num_threads(1)``), as the planner's workers
    will. Cost: about ``2 (repeats + 1)`` real forward-and-backward steps of the model.
    Buffers are updated as in one training step of the exported program (on the exported
    program's copies, not the model's).
    """
    old_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        index = {nm: i for i, nm in enumerate(cap.names)}
        interp = _TimingInterpreter(ep.graph_module, index, repeats, progress)
        params = set(ep.graph_signature.inputs_to_parameters)
        for ph in ep.graph_module.graph.find_nodes(op="placeholder"):
            interp.grad_env[ph.name] = ph.name in params
        interp.run(*_program_args(ep, example_inputs), enable_io_processing=False)
        return interp.fwd, interp.bwd
    finally:
        torch.set_num_threads(old_threads)


def model_step_seconds(model: torch.nn.Module, example_inputs: Sequence[Any], *,
                       repeats: int = 5) -> tuple[float, float]:
    """Forward and backward seconds of the whole model, run as a training step runs it.

    Each of ``repeats + 1`` steps (the first a warm-up) clears the parameters' gradients
    (untimed, as an optimizer's ``zero_grad`` does), runs the forward with autograd
    recording, then the backward of the model's floating outputs (a gradient of ones) into
    fresh ``.grad`` tensors, the inputs not needing a gradient: a run's order and cache
    state, which operators timed one at a time on warm caches miss. Each pass is timed by
    ``time.perf_counter`` with CUDA synchronised around it; the medians are kept. One
    intra-op thread, as :func:`profile_ops`.

    Parameters
    ----------
    model : torch.nn.Module
        The captured model, in the mode it was captured in. Its buffers (train-mode
        statistics), parameter gradients and random state are restored afterwards.
    example_inputs : sequence
        The capture's inputs.
    repeats : int
        Timed steps.

    Returns
    -------
    (float, float)
        Forward seconds, and backward seconds (0 when no output carries a gradient).

    Notes
    -----
    Why (``benchmarks/calibration_breakdown.py``): operators timed one at a time sum to
    less than the model's forward (paper 000's MLP at 64 samples: 1.7 against 1.9 ms; a
    small transformer: 4.3 against 5.0 ms) and, each backward a separate ``autograd.grad``
    call, to more than its backward (4.6 against 3.1 ms; 10.2 against 8.8 ms).
    :func:`shardplan.capture.capture` scales the operators' times to these totals
    (:func:`scale_to_model`), keeping their proportions. Cost: ``repeats + 1`` training
    steps of the model, without the optimizer.
    """
    import time

    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    grads = [(p, p.grad) for p in model.parameters()]
    params = [p for p in model.parameters() if p.requires_grad]
    inputs = tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in example_inputs)
    cuda = any(p.is_cuda for p in model.parameters()) or any(
        isinstance(t, torch.Tensor) and t.is_cuda for t in inputs)

    def now() -> float:
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    fwd: list[float] = []
    bwd: list[float] = []
    old_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with torch.random.fork_rng(devices=[]):
        try:
            for step in range(max(int(repeats), 1) + 1):
                for p in params:
                    p.grad = None
                t0 = now()
                out = model(*inputs)
                t1 = now()
                outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)
                        and t.is_floating_point() and t.requires_grad]
                ones = [torch.ones_like(t) for t in outs]
                t2 = now()
                if outs:
                    torch.autograd.backward(outs, ones)
                t3 = now()
                if step:  # the first step warms up
                    fwd.append(t1 - t0)
                    bwd.append(t3 - t2 if outs else 0.0)
                del out, outs, ones
        finally:
            with torch.no_grad():
                for b, saved in buffers:
                    b.copy_(saved)
            for p, g in grads:
                p.grad = g
            torch.set_num_threads(old_threads)
    return float(np.median(fwd)), float(np.median(bwd))


def scale_to_model(fwd: Sequence[float], bwd: Sequence[float], model_fwd: float,
                   model_bwd: float) -> tuple[list[float], list[float], dict[str, float]]:
    """The operators' seconds scaled so that each pass sums to the whole model's
    (:func:`model_step_seconds`), keeping their proportions; a pass whose operators sum to
    0 or whose model time is not positive is left as it is (factor 1).

    Returns ``(fwd, bwd, record)``, ``record`` the graph's ``meta["profile_scale"]``:
    ``{"fwd": factor, "bwd": factor, "model_fwd_seconds", "model_bwd_seconds"}``. O(n).
    """
    def factor(parts: Sequence[float], total: float) -> float:
        s = float(sum(parts))
        return total / s if s > 0 and total > 0 else 1.0

    ff, fb = factor(fwd, model_fwd), factor(bwd, model_bwd)
    return ([t * ff for t in fwd], [t * fb for t in bwd],
            {"fwd": ff, "bwd": fb, "model_fwd_seconds": float(model_fwd),
             "model_bwd_seconds": float(model_bwd)})
