"""Operator-level capture: ``torch.export`` program -> :class:`~shardplan.ir.Graph`.

Paper 000, section 3.2 traces the model with ``torch.export`` and builds the execution graph
whose vertices are the traced operations and whose edges are the data flowing between them.
Here every ``call_function`` node of the exported (training IR) program is one graph node,
except ``operator.getitem``, which is folded into the operator whose output it selects, and
bookkeeping calls that produce no tensor and have no users (``_assert_tensor_metadata``), and
in-place updates of buffers that nothing reads (BatchNorm's ``num_batches_tracked += 1``: they
would be isolated nodes with no FLOPs, noise for every partitioner; their count is kept in the
graph's ``dropped_buffer_updates``).
Placeholders (parameters, buffers, user inputs) and the output are not nodes.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.fx.node import map_arg

from shardplan.capture._flops import count_op_flops
from shardplan.ir import Graph
from shardplan.workload.program import export_model, graph_ops, tensor_bytes
from shardplan.workload.program import is_buffer_update as _is_buffer_update
from shardplan.workload.program import kept_ops as _kept
from shardplan.workload.program import module_stack as _module_stack
from shardplan.workload.program import node_args as _node_args
from shardplan.workload.program import op_name as _op_name
from shardplan.workload.program import strip_prefix as _strip

__all__ = ["OpCapture", "TensorUse", "capture_ops", "export_model", "graph_ops", "ops_to_graph",
           "tensor_bytes"]

Progress = Callable[[str, int, int], None]



@dataclass(frozen=True, slots=True)
class TensorUse:
    """Tensor ``key`` of op ``producer`` (``bytes`` bytes) is read by op ``consumer``."""

    producer: int
    key: tuple[int, ...]
    bytes: int
    consumer: int


@dataclass(slots=True)
class OpCapture:
    """What operator-level capture knows, before it becomes a :class:`Graph`.

    Attributes
    ----------
    names, ops, modules : list of str
        Per op: fx node name, aten op name (``conv2d``), innermost module path.
    stacks : list of tuple of (str, str)
        Per op: the module stack, outermost first, as ``(fqn, class name)``; the root module
        is ``("", ClassName)``.
    fwd_flops, bwd_flops, param_bytes, param_count, output_bytes : list of int
    param_tensors : list of int
        Per op: the parameter tensors it owns (the first op to read a parameter owns it).
    shared_params : list of list of str
        Per op: parameters it reads that an earlier op already owns (tied weights).
    uses : list of TensorUse
        Every (distinct tensor, consumer) pair between ops.
    outputs : list of (int, tuple, int)
        Model outputs produced by ops: (producer, key, bytes).
    fx_nodes : list of torch.fx.Node
        The exported node of each op (profiling runs them).
    input_shapes, input_dtypes : list
        Shape and dtype name of each tensor input of the model (batch dimension first); the
        graph keeps them in ``meta`` so that ``shardplan train`` feeds the captured shapes.
    """

    names: list[str] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)
    stacks: list[tuple[tuple[str, str], ...]] = field(default_factory=list)
    fwd_flops: list[int] = field(default_factory=list)
    bwd_flops: list[int] = field(default_factory=list)
    param_bytes: list[int] = field(default_factory=list)
    param_count: list[int] = field(default_factory=list)
    param_tensors: list[int] = field(default_factory=list)
    output_bytes: list[int] = field(default_factory=list)
    shared_params: list[list[str]] = field(default_factory=list)
    uses: list[TensorUse] = field(default_factory=list)
    outputs: list[tuple[int, tuple[int, ...], int]] = field(default_factory=list)
    fx_nodes: list[torch.fx.Node] = field(default_factory=list)
    input_bytes: int = 0
    input_shapes: list[list[int]] = field(default_factory=list)
    input_dtypes: list[str] = field(default_factory=list)
    buffer_bytes: int = 0
    dropped_buffer_updates: int = 0
    flop_methods: dict[str, list[str]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.names)



def capture_ops(
    model: torch.nn.Module,
    ep: torch.export.ExportedProgram,
    *,
    module_prefix: str = "",
    progress: Progress | None = None,
) -> OpCapture:
    """Turn an exported program into per-operator records with FLOPs, bytes and edges.

    Parameters
    ----------
    model : torch.nn.Module
        The exported model (its parameters decide tied weights and ``requires_grad``).
    ep : ExportedProgram
        ``torch.export.export(model, ...)``.
    module_prefix : str
        A prefix to strip from module paths (a wrapper's attribute name plus ``"."``).
    progress : callable, optional
        ``progress(stage, done, total)`` after each operator.

    Returns
    -------
    OpCapture

    Notes
    -----
    Parameters are attributed to the first operator (in program order) that reads them; a
    parameter object reached through several placeholders (tied weights, which ``torch.export``
    lifts once per name) is counted once, and later readers list it in ``shared_params``.
    FLOPs come from :func:`~shardplan.capture._flops.count_op_flops`; an activation needs a
    gradient when any input of its producer does (parameters with ``requires_grad``; user
    inputs only if they require grad themselves). O(n + m) plus one fake dispatch of every
    operator forward and backward.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    sig = ep.graph_signature
    param_of = dict(sig.inputs_to_parameters)
    buffer_of = dict(sig.inputs_to_buffers)
    user_inputs = set(sig.user_inputs)
    graph = ep.graph_module.graph

    # Placeholders: parameters (resolved to the model's parameter objects), buffers, inputs.
    param_obj: dict[str, torch.nn.Parameter] = {}
    needs_grad: dict[str, bool] = {}
    cap = OpCapture()
    for node in graph.find_nodes(op="placeholder"):
        val = node.meta.get("val")
        if node.name in param_of:
            try:
                p = model.get_parameter(param_of[node.name])
            except AttributeError:
                p = None
            if p is not None:
                param_obj[node.name] = p
            needs_grad[node.name] = bool(p.requires_grad if p is not None else True)
        elif node.name in buffer_of:
            cap.buffer_bytes += tensor_bytes(val)
            needs_grad[node.name] = False
        else:
            if node.name in user_inputs:
                cap.input_bytes += tensor_bytes(val)
                if isinstance(val, torch.Tensor):
                    cap.input_shapes.append([int(d) for d in val.shape])
                    cap.input_dtypes.append(str(val.dtype).removeprefix("torch."))
            needs_grad[node.name] = bool(isinstance(val, torch.Tensor) and val.requires_grad)

    # Ops in program order; getitem resolves to (producer, key).
    op_index: dict[str, int] = {}
    getitem_src: dict[str, tuple[int, tuple[int, ...]]] = {}
    calls = [n for n in graph.nodes if n.op == "call_function"]
    kept = _kept(calls, buffer_of)
    cap.dropped_buffer_updates = sum(1 for n in calls if _is_buffer_update(n, buffer_of))
    for n in kept:
        op_index[n.name] = len(op_index)
    fake_mode = FakeTensorMode()
    owner: dict[int, int] = {}  # id(parameter) -> op index owning it
    getitem_users: dict[str, set[int]] = {}
    for n in calls:
        if n.target is operator.getitem and n.users:
            idx = n.args[1] if isinstance(n.args[1], int) else -1
            getitem_users.setdefault(n.args[0].name, set()).add(idx)

    def source(arg: torch.fx.Node) -> tuple[int, tuple[int, ...]] | None:
        if arg.name in op_index:
            return op_index[arg.name], ()
        return getitem_src.get(arg.name)

    total = len(kept)
    for n in calls:
        if n.target is operator.getitem:
            parent = n.args[0]
            base = source(parent) if isinstance(parent, torch.fx.Node) else None
            if base is not None:
                getitem_src[n.name] = (base[0], (*base[1], n.args[1]))
            if isinstance(parent, torch.fx.Node):
                needs_grad[n.name] = needs_grad.get(parent.name, False)
            continue
        if n.name not in op_index:
            continue
        i = op_index[n.name]
        stack = _module_stack(n, module_prefix)
        cap.names.append(n.name)
        cap.ops.append(_op_name(n.target))
        cap.modules.append(stack[-1][0] if stack else "")
        cap.stacks.append(stack)
        cap.fx_nodes.append(n)
        cap.output_bytes.append(tensor_bytes(n.meta.get("val")))

        # Inputs: parameters read, tensors from other ops.
        pbytes = pcount = ptensors = 0
        shared: list[str] = []
        seen_keys: set[tuple[int, tuple[int, ...]]] = set()
        templates: dict[int, bool] = {}
        for arg in _node_args(n):
            val = arg.meta.get("val")
            if isinstance(val, torch.Tensor):
                templates[id(val)] = needs_grad.get(arg.name, False)
            if arg.name in param_of:
                p = param_obj.get(arg.name)
                key = id(p) if p is not None else id(arg)
                if key not in owner:
                    owner[key] = i
                    numel = p.numel() if p is not None else (val.numel() if val is not None
                                                              else 0)
                    esize = p.element_size() if p is not None else val.element_size()
                    pbytes += numel * esize
                    pcount += numel
                    ptensors += 1
                elif owner[key] != i:
                    shared.append(_strip(param_of[arg.name], module_prefix))
                continue
            src = source(arg)
            if src is None or src in seen_keys:
                continue
            seen_keys.add(src)
            cap.uses.append(TensorUse(src[0], src[1], tensor_bytes(val), i))
        cap.param_bytes.append(pbytes)
        cap.param_count.append(pcount)
        cap.param_tensors.append(ptensors)
        cap.shared_params.append(shared)

        used_fn = _used_outputs(n, getitem_users.get(n.name, set()))
        args = map_arg(n.args, lambda a: _template(ep.graph_module, a))
        kwargs = map_arg(n.kwargs, lambda a: _template(ep.graph_module, a))
        res = count_op_flops(n.target, args, kwargs, lambda t, _m=templates: _m.get(id(t), False),
                             fake_mode, used_outputs=used_fn)
        cap.fwd_flops.append(res.fwd)
        cap.bwd_flops.append(res.bwd)
        needs_grad[n.name] = res.requires_grad
        if res.method != "fake":
            cap.flop_methods.setdefault(res.method, []).append(n.name)
        if progress is not None:
            progress("flops", i + 1, total)

    for out in graph.find_nodes(op="output"):
        seen: set[tuple[int, tuple[int, ...]]] = set()
        for arg in _node_args(out):
            src = source(arg)
            if src is not None and src not in seen:
                seen.add(src)
                cap.outputs.append((src[0], src[1], tensor_bytes(arg.meta.get("val"))))
    return cap


def _template(gm: torch.fx.GraphModule, arg: torch.fx.Node) -> Any:
    """What stands for ``arg`` when an op is re-run: its traced value, or the attribute itself
    (the subgraph of a higher-order op such as ``wrap_with_set_grad_enabled``)."""
    if arg.op == "get_attr":
        obj: Any = gm
        for part in str(arg.target).split("."):
            obj = getattr(obj, part)
        return obj
    return arg.meta.get("val")


def _used_outputs(node: torch.fx.Node, getitems: set[int]) -> Callable[[int], bool] | None:
    """Which output leaves of ``node`` feed something (None: all of them).

    Eager autograd sends no gradient into an output nobody reads, so neither do we.
    """
    if any(u.target is not operator.getitem for u in node.users):
        return None
    if not node.users:
        mutates = bool(getattr(getattr(node.target, "_schema", None), "is_mutable", False))
        return None if mutates else (lambda k: False)
    if -1 in getitems:
        return None
    return lambda k: k in getitems



def ops_to_graph(cap: OpCapture, *, name: str, batch_size: int,
                 meta: Mapping[str, Any] | None = None,
                 seconds: tuple[Sequence[float], Sequence[float]] | None = None) -> Graph:
    """The operator-level :class:`~shardplan.ir.Graph` of a capture.

    One edge per (producer, consumer) pair, carrying the bytes of the distinct tensors the
    consumer reads from the producer. O(n + m log m).
    """
    pair_bytes: dict[tuple[int, int], int] = {}
    for u in cap.uses:
        pair_bytes[(u.producer, u.consumer)] = pair_bytes.get((u.producer, u.consumer), 0) + u.bytes
    pairs = sorted(pair_bytes)
    src = np.array([p[0] for p in pairs], dtype=np.int64)
    dst = np.array([p[1] for p in pairs], dtype=np.int64)
    eb = np.array([pair_bytes[p] for p in pairs], dtype=np.int64)
    extra = tuple({"shared_params": s} if s else {} for s in cap.shared_params)
    optional: dict[str, Any] = {}
    if cap.fx_nodes and len(cap.fx_nodes) == len(cap.names):
        # PaSE iteration spaces of the ops we recognise (others: None = batch-only).
        from shardplan.capture._spaces import graph_spaces_of

        spaces = graph_spaces_of(cap.fx_nodes, cap.ops, pairs, batch_size)
        if any(sp is not None for sp in spaces):
            optional["spaces"] = tuple(spaces)
    if seconds is not None:
        optional["fwd_seconds"] = np.asarray(seconds[0], dtype=np.float64)
        optional["bwd_seconds"] = np.asarray(seconds[1], dtype=np.float64)
    return Graph(
        name=name, batch_size=int(batch_size), names=tuple(cap.names), ops=tuple(cap.ops),
        modules=tuple(cap.modules),
        fwd_flops=np.array(cap.fwd_flops, dtype=np.float64),
        bwd_flops=np.array(cap.bwd_flops, dtype=np.float64),
        param_bytes=np.array(cap.param_bytes, dtype=np.int64),
        param_tensors=np.array(cap.param_tensors, dtype=np.float64),
        output_bytes=np.array(cap.output_bytes, dtype=np.int64),
        weight=np.array(cap.param_count, dtype=np.float64),
        src=src, dst=dst, edge_bytes=eb,
        node_extra=extra if any(extra) else None,
        meta={**({"input_shapes": cap.input_shapes, "input_dtypes": cap.input_dtypes}
                 if cap.input_shapes else {}), **dict(meta or {})},
        **optional,
    )
