"""Capture a PyTorch model's computation graph (paper 000, section 3.2).

:func:`capture` traces a model with ``torch.export`` and returns a
:class:`~shardplan.ir.Graph` at operator level (one node per aten operator, with forward and
backward FLOPs, parameter and output bytes, module path) or at module level (one node per
instance of the module types the user calls atomic). :func:`capture_spec` builds a model of the
zoo (:mod:`shardplan.workload`) and captures it. With the workload, the runtime and the
measurement ranks, it is one of the places that import torch (``docs/architecture.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from shardplan.errors import ShardplanError
from shardplan.ir import Graph

__all__ = ["GRANULARITIES", "MODES", "build_model", "capture", "capture_spec", "flop_mapping",
           "list_models", "reference_flops"]

GRANULARITIES = ("op", "module")
MODES = ("train", "eval")

Progress = Callable[[str, int, int], None]


def _atomic_list(atomic: str | Sequence[str] | None) -> list[str]:
    if atomic is None:
        return []
    items = atomic.split(",") if isinstance(atomic, str) else list(atomic)
    return [a.strip() for a in items if isinstance(a, str) and a.strip()]


def _check_options(granularity: str, atomic: list[str], mode: str) -> None:
    if granularity not in GRANULARITIES:
        raise ShardplanError(f"unknown granularity {granularity!r} (choose from op, module)")
    if mode not in MODES:
        raise ShardplanError(f"unknown mode {mode!r} (choose from train, eval)")
    if atomic and granularity != "module":
        raise ShardplanError("--atomic needs --granularity module")
    if granularity == "module" and not atomic:
        raise ShardplanError("--granularity module needs --atomic TYPE,... (the module types "
                             "that are the units of sharding, such as Linear)")


def capture(
    model: Any,
    example_inputs: Any,
    *,
    name: str | None = None,
    granularity: str = "op",
    atomic: str | Sequence[str] | None = None,
    profile: bool = False,
    mode: str = "train",
    batch_size: int | None = None,
    progress: Progress | None = None,
    loss: str = "",
) -> Graph:
    """Capture the computation graph of ``model`` called on ``example_inputs``.

    Parameters
    ----------
    model : torch.nn.Module
        The model. It is put in ``mode`` for the capture and restored afterwards.
    example_inputs : tensor or tuple
        Positional arguments of one forward call (their shapes fix the graph's sizes).
    name : str, optional
        Graph name (default: the model's class name).
    granularity : {"op", "module"}
        One node per aten operator, or one per instance of the ``atomic`` module types.
    atomic : str or sequence of str, optional
        Module class names (``"Linear,TransformerEncoderLayer"``); module granularity only.
    profile : bool
        Also measure every node's forward and backward seconds on this machine (real compute,
        about fourteen training steps of the model): operators timed one at a time
        (:func:`~shardplan.capture._profile.profile_ops`), scaled per pass to the whole
        model's forward and backward (:func:`~shardplan.capture._profile.scale_to_model`;
        the factors in ``meta["profile_scale"]``).
    mode : {"train", "eval"}
        The model mode traced: train (dropout, batch statistics; what the planner plans) or
        eval.
    batch_size : int, optional
        Recorded in the graph (default: leading dimension of the first tensor input).
    progress : callable, optional
        ``progress(stage, done, total)`` while FLOPs are counted and operators profiled.
    loss : str
        The model spec whose training loss ``profile`` also times
        (:func:`shardplan.workload.loss_fn_for`; ``""``: cross-entropy on logits),
        recorded in ``meta["loss"]`` (:mod:`shardplan.capture._loss`) and charged to the node
        producing the model's output by the cost model.

    Returns
    -------
    Graph
        Node ids in program (topological) order. ``fwd_flops`` sum exactly to what
        ``FlopCounterMode`` (with :func:`flop_mapping`) counts over one eager forward of the
        model in the same mode; ``param_bytes`` sum to the bytes of ``model.parameters()``
        (tied weights once); ``weight`` is the parameter count. ``Graph.meta`` records the
        model, granularity, mode, input and buffer bytes, ``parameters`` (the parameter count,
        tied weights once), ``device`` ``"meta"`` when the model has no storage, a
        ``transformer`` dict (``family``, ``hidden``, ``layers``, ``heads``, ``kv_heads``,
        ``ffn``, ``vocab``, ``seq``, ``tied``, ``parameters``) when the model describes its
        dimensions (``model.transformer_meta(seq_len)``, the zoo's GPT and Llama), and any
        operators whose FLOPs needed a fallback (``flop_fallbacks``).

    Raises
    ------
    ShardplanError
        Bad options, a model ``torch.export`` cannot trace, an atomic type not in the model.

    Notes
    -----
    Paper 000, section 3.2. A model whose parameters or inputs are on the meta device is
    captured without allocating them (no ``profile``). ``torch.export.export(strict=False)``
    traces the model on fake tensors; per-operator FLOPs are counted on fake tensors too (no
    arithmetic), so capture costs seconds even for large models. O(n + m) in the number of
    operators and edges, plus one fake dispatch of each operator forward and backward; module
    folding adds O(k (n + m)) for k atomic instances.
    """
    import torch

    from shardplan.capture._export import capture_ops, export_model, ops_to_graph
    from shardplan.workload._common import OutputSelector, normalize_inputs

    atomic_names = _atomic_list(atomic)
    _check_options(granularity, atomic_names, mode)
    if not isinstance(model, torch.nn.Module):
        raise ShardplanError(f"the model must be a torch.nn.Module, got {type(model).__name__}")
    inputs = normalize_inputs(example_inputs)
    if batch_size is None:
        first = next((t for t in inputs if isinstance(t, torch.Tensor) and t.dim() > 0), None)
        batch_size = int(first.shape[0]) if first is not None else 1
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ShardplanError(f"batch size must be a positive integer, got {batch_size!r}")
    name = name or type(model).__name__
    on_meta = any(t.is_meta for t in (*model.parameters(), *model.buffers(), *(
        x for x in inputs if isinstance(x, torch.Tensor))))
    if on_meta and profile:
        raise ShardplanError("--profile times real compute: it cannot run on a model built "
                             "on the meta device")
    prefix = OutputSelector.prefix if isinstance(model, OutputSelector) else ""

    was_training = model.training
    model.train(mode == "train")
    try:
        ep = export_model(model, inputs, name=name)
        cap = capture_ops(model, ep, module_prefix=prefix, progress=progress)
        seconds = None
        loss_cost = None
        profile_scale = None
        if profile:
            from shardplan.capture._profile import model_step_seconds, profile_ops, scale_to_model

            fwd_s, bwd_s = profile_ops(ep, cap, model, inputs, progress=progress)
            fwd_s, bwd_s, profile_scale = scale_to_model(
                fwd_s, bwd_s, *model_step_seconds(model, inputs))
            seconds = (fwd_s, bwd_s)
            if cap.outputs:
                from shardplan.capture._loss import profile_loss

                loss_cost = profile_loss(model, inputs, cap.names[cap.outputs[0][0]],
                                         spec=loss, batch_size=batch_size)
    finally:
        model.train(was_training)
    param_total = sum(p.numel() * p.element_size() for p in model.parameters())
    meta: dict[str, Any] = {
        "parameters": sum(p.numel() for p in model.parameters()),  # tied weights once
        "granularity": "op", "mode": mode, "input_bytes": cap.input_bytes,
        "buffer_bytes": cap.buffer_bytes,
        "dropped_buffer_updates": cap.dropped_buffer_updates,
        "model_output_bytes": sum(b for _, _, b in cap.outputs),
        "torch_version": torch.__version__,
    }
    if on_meta:
        meta["device"] = "meta"
    dims = getattr(model, "transformer_meta", None)
    if callable(dims) and inputs and isinstance(inputs[0], torch.Tensor) \
            and inputs[0].dim() >= 2:
        meta["transformer"] = dims(int(inputs[0].shape[1]))
    if cap.flop_methods:
        meta["flop_fallbacks"] = cap.flop_methods
    if loss_cost is not None:
        meta["loss"] = loss_cost
    if profile_scale is not None:
        meta["profile_scale"] = profile_scale
    graph = ops_to_graph(cap, name=name, batch_size=batch_size, meta=meta, seconds=seconds)
    captured = int(graph.param_bytes.sum())
    if captured != param_total:  # parameters no operator reads (unused modules)
        graph = graph.replace(meta={**graph.meta, "unused_param_bytes": param_total - captured})
    if granularity == "module":
        from shardplan.capture._module import fold_modules

        graph = fold_modules(cap, graph, atomic_names)
    return graph


def capture_spec(
    spec: str,
    *,
    batch_size: int = 8,
    seq_len: int = 128,
    image_size: int | None = None,
    name: str | None = None,
    granularity: str = "op",
    atomic: str | Sequence[str] | None = None,
    profile: bool = False,
    mode: str = "train",
    progress: Progress | None = None,
    meta: bool | None = None,
) -> Graph:
    """Build a zoo model by name (:func:`build_model`) and :func:`capture` it.

    ``batch_size`` is recorded in the graph for zoo models; for ``FILE.py:FUNCTION`` the
    leading dimension of the function's first input is. ``meta["model"]`` is ``spec``.
    ``meta``: build on the meta device (True), or when the model would not fit in memory
    (None, a :class:`~shardplan.errors.ShardplanWarning` says so), or in memory (False).
    """
    from shardplan.workload.zoo import block_spec, check_spec_sizes, resolve_meta

    check_spec_sizes(spec, batch_size=batch_size, seq_len=seq_len)
    atomic_names = _atomic_list(atomic)
    _check_options(granularity, atomic_names, mode)
    on_meta = resolve_meta(spec, False if meta is None and profile else meta, seq_len=seq_len)
    if on_meta and profile:
        raise ShardplanError("--profile times real compute: it cannot run on a model built "
                             "on the meta device")
    blocks = block_spec(spec, seq_len=seq_len) if on_meta and granularity == "op" else None
    if blocks is not None and blocks.num_blocks > 2:
        graph = _capture_stamped(spec, blocks, batch_size=batch_size, seq_len=seq_len,
                                 name=name, mode=mode, progress=progress)
        if graph is not None:
            return graph
    model, inputs, default_name = build_model(spec, batch_size=batch_size, seq_len=seq_len,
                                              image_size=image_size, meta=on_meta)
    is_file = ":" in spec and spec.rsplit(":", 1)[0].endswith(".py")
    graph = capture(model, inputs, name=name or default_name, granularity=granularity,
                    atomic=atomic_names, profile=profile, mode=mode,
                    batch_size=None if is_file else batch_size, progress=progress,
                    loss=spec)
    return graph.replace(meta={"model": spec, **graph.meta})


def _capture_stamped(spec: str, blocks: Any, *, batch_size: int, seq_len: int,
                     name: str | None, mode: str, progress: Progress | None) -> Graph | None:
    """Capture ``blocks.two_blocks`` on the meta device and stamp its second block out to
    ``blocks.num_blocks`` (:func:`~shardplan.capture._stamp.stamp_blocks`); None when the
    two-block graph cannot be stamped (capture the whole model then)."""
    from shardplan.capture._stamp import stamp_blocks

    small = capture_spec(blocks.two_blocks, batch_size=batch_size, seq_len=seq_len,
                         name=name, mode=mode, progress=progress, meta=True)
    graph = stamp_blocks(small, blocks.num_blocks, container=blocks.container)
    if graph is None:
        return None
    unread = int(small.meta["parameters"]) - int(round(float(small.weight.sum())))
    meta = {**small.meta, "model": spec, "transformer": dict(blocks.transformer),
            "parameters": int(round(float(graph.weight.sum()))) + unread,
            "stamped": {"template_blocks": 2, "blocks": blocks.num_blocks,
                        "container": blocks.container}}
    return graph.replace(meta=meta)


def build_model(spec: str, *, batch_size: int = 8, seq_len: int = 128,
                image_size: int | None = None, meta: bool | None = False
                ) -> tuple[Any, tuple[Any, ...], str]:
    """Build ``(model, example_inputs, name)``; see :func:`shardplan.workload.zoo.build_model`."""
    from shardplan.workload.zoo import build_model as _build

    return _build(spec, batch_size=batch_size, seq_len=seq_len, image_size=image_size,
                  meta=meta)


def list_models() -> list[str]:
    """The zoo's model names; see :func:`shardplan.workload.zoo.list_models`."""
    from shardplan.workload.zoo import list_models as _list

    return _list()


def flop_mapping() -> dict[Any, Any]:
    """The ``FlopCounterMode`` custom mapping capture counts with (CPU attention formulas)."""
    from shardplan.capture._flops import flop_mapping as _mapping

    return _mapping()


def reference_flops(model: Any, example_inputs: Any) -> tuple[int, int]:
    """Eager ``FlopCounterMode`` totals of one real step; see :mod:`shardplan.capture._flops`."""
    from shardplan.capture._flops import reference_flops as _ref
    from shardplan.workload._common import normalize_inputs

    return _ref(model, normalize_inputs(example_inputs))
