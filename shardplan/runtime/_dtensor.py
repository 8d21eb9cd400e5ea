"""Run a program's operators on DTensors laid out as a strategy plan says (PaSE executed).

:class:`ShardedProgram` wraps a stage program (an ``fx.GraphModule`` cut from the model's
exported program by :func:`shardplan.runtime._split.split_program`) and interprets it with
``torch.distributed.tensor``: every value is a DTensor on the stage's device mesh; before an
operator of the graph runs, each tensor it reads is ``redistribute``-d to the placements its
configuration gives that tensor (:mod:`shardplan.runtime._sharding`), which is the
re-sharding the strategy's edge costs price; DTensor's sharding propagation then runs the
operator on the local shards and says how its output is laid out (a split reduced dimension
gives a ``Partial`` sum, reduced where the next operator reads it). Parameters are DTensor
parameters, stored as their first reader wants them (a weight split over ``n`` lives split:
parameter parallelism); their gradients are reduced to that layout after the backward
(:meth:`ShardedProgram.sync_grads`: the data-parallel all-reduce where the batch was split).

Equal to one process, by construction: DTensor computes every operator's global result
whatever the layouts, autograd runs through the redistributions, and the random operators
(dropout) draw from the process's random state exactly as one process does: every rank of
the mesh holds the same state (seeded per forward), a dropout draws the mask of the whole
tensor and keeps its shard, and other random operators run on whole tensors. Operators
DTensor has no sharding rule for run on whole tensors on every device (``replicated``
records which); attention (``scaled_dot_product_attention``, which has no rule on CPU) runs
on each device's batch or head shard (``local_map``-style), as its configuration splits it.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import fx, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import Placement

from shardplan.runtime._sharding import NodeSharding, arg_groups, placements

__all__ = ["GradBuckets", "ShardedProgram", "batch_split", "communicates", "make_mesh",
           "redistribute", "sync_grads",
           "to_placements"]

aten = torch.ops.aten

_RANDOM = {"bernoulli", "rand", "randn", "randint", "rand_like", "randn_like", "randint_like",
           "normal", "uniform", "randperm", "multinomial", "native_dropout",
           "feature_dropout", "alpha_dropout", "feature_alpha_dropout", "exponential",
           "geometric", "cauchy", "log_normal", "poisson"}
#: Operators DTensor (torch 2.14) runs forward but has no sharding rule for the backward of
#: (MobileNet's ReLU6 is ``hardtanh``): they run whole, so that their backward is local.
_NO_BACKWARD_RULE = {"hardtanh"}


def make_mesh(device_type: str, ranks: Sequence[Sequence[int]], shape: Sequence[int]
              ) -> DeviceMesh:
    """The mesh of one group of ``ranks`` (this rank's row), laid out as ``shape``.

    Every rank of the world calls this with every group (``ranks[g]``: the global ranks of
    group ``g``, in order): a mesh of shape ``(groups, *shape)`` is built (its sub-groups are
    created collectively) and this rank's group is sliced out of it."""
    groups = len(ranks)
    names = ("group", *(f"axis{i}" for i in range(len(shape))))
    full = torch.tensor([list(r) for r in ranks], dtype=torch.int64).reshape(groups, *shape)
    mesh = DeviceMesh(device_type, full, mesh_dim_names=names)
    return mesh[names[1:]] if len(names) > 2 else mesh[names[1]]


def to_placements(spec: Sequence[int]) -> tuple[Placement, ...]:
    """``-1`` -> ``Replicate()``, ``j`` -> ``Shard(j)`` (see :func:`_sharding.placements`)."""
    return tuple(Replicate() if j < 0 else Shard(int(j)) for j in spec)


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the gradient contiguous.

    DTensor (torch 2.14) gathers a non-contiguous gradient shard into a contiguous local
    tensor but keeps the gradient's old strides in its metadata; a later ``view`` of it then
    fails ("view size is not compatible ..."). Placed after every redistribution, this hands
    the redistribution's backward contiguous gradients only."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def redistribute(t: DTensor, mesh: DeviceMesh, want: Sequence[Placement]) -> DTensor:
    """``t.redistribute(mesh, want)``, its gradient kept contiguous (:class:`_ContiguousGrad`)
    and its input made contiguous (for the same reason, in the forward)."""
    if tuple(t.placements) == tuple(want):
        return t
    if not t.is_contiguous():
        t = t.contiguous()
    out = t.redistribute(mesh, want)
    return _ContiguousGrad.apply(out) if out.requires_grad else out


def communicates(src: Sequence[Placement], dst: Sequence[Placement]) -> bool:
    """Whether redistributing from ``src`` to ``dst`` moves data between devices: anything
    but keeping a placement or slicing a replicated dimension."""
    return any(a != b and not (isinstance(a, Replicate) and isinstance(b, Shard))
               for a, b in zip(src, dst, strict=True))


def _op_name(target: Any) -> str:
    name = getattr(target, "__name__", str(target))
    return name.split(".")[0]


def _out_of_place(node: fx.Node, target: Any, name: str) -> tuple[Any, str]:
    """An in-place ATen operator (``hardtanh_``: ``ReLU6(inplace=True)``) as its out-of-place
    twin when the tensor it would modify is read by nothing else and aliases nothing (an
    operator's fresh result, not a view, input or parameter): DTensor's redistributions hand
    out views that autograd refuses to modify in place. O(1)."""
    if not (name.endswith("_") and not name.startswith("_") and node.args):
        return target, name
    src = node.args[0]
    if not (isinstance(src, fx.Node) and src.op == "call_function" and len(src.users) == 1
            and isinstance(src.target, torch._ops.OpOverload)):
        return target, name
    returns = src.target._schema.returns
    if not returns or returns[0].alias_info is not None:  # a view: its base is read elsewhere
        return target, name
    packet = getattr(aten, name[:-1], None)
    overload = getattr(target, "_overloadname", None)
    if packet is None or overload is None or not hasattr(packet, overload):
        return target, name
    return getattr(packet, overload), name[:-1]


def _map(value: Any, fn: Any) -> Any:
    """``fn`` over the tensors of a nested tuple/list."""
    if isinstance(value, (tuple, list)):
        return type(value)(_map(v, fn) for v in value)
    return fn(value) if isinstance(value, torch.Tensor) else value


class ShardedProgram(nn.Module):
    """A stage program run on a device mesh under per-operator layouts.

    Parameters
    ----------
    program : torch.fx.GraphModule
        Stage program: placeholders (the values it receives), ``get_attr`` parameters,
        buffers and constants under the model's names, ``call_function`` operators.
    shardings : mapping of str to NodeSharding
        Per program node name, the layout of the graph operator it is (other nodes, the
        graph leaves out, run as DTensor propagates them).
    mesh : DeviceMesh
        The stage's devices.
    params : dict, optional
        Already-distributed parameters by original parameter object id (stages of one rank
        share tied weights); filled with this program's.

    Attributes
    ----------
    replicated : set of str
        Operators (program names) that ran on whole tensors on every device: no sharding
        rule in DTensor, or random operators other than dropout.
    redistributions : int
        Redistributions of operator inputs in the last forward.
    reshards : int
        Those of them that communicate (anything but slicing a replicated tensor): the
        strategy's re-shards between layers, as its edge costs price them.
    reductions : int
        Graph operators' partial outputs reduced in the last forward (split reduced
        dimensions: part of a layer's own cost).
    """

    def __init__(self, program: fx.GraphModule, shardings: Mapping[str, NodeSharding],
                 mesh: DeviceMesh, params: dict[int, nn.Parameter] | None = None) -> None:
        super().__init__()
        self.program = program
        self.mesh = mesh
        self.shardings = dict(shardings)
        self.replicated: set[str] = set()
        #: Return outputs split only by their batch as DTensors (see :meth:`_output`).
        self.batch_outputs = False
        #: A hybrid stage's boundaries: per input (output), the layout of the batch shard
        #: this device receives (sends) as :func:`~shardplan.runtime._sharding.placements`
        #: gives it, or None for a whole tensor (:func:`~shardplan.runtime._sharding.
        #: boundary_spec`). None: every input and output whole.
        self.input_specs: Sequence[tuple[int, ...] | None] | None = None
        self.output_specs: Sequence[tuple[int, ...] | None] | None = None
        self.redistributions = 0
        self.reshards = 0
        self.reductions = 0
        self._distribute_params({} if params is None else params)

    # ------------------------------------------------------------------ setup
    def _spec_for(self, node: fx.Node, position: int | str, value: Any) -> tuple[int, ...] | None:
        """Per mesh axis, the tensor dimension the argument at ``position`` of ``node`` is
        split over (None: ``node`` is not a graph operator, leave it as it comes)."""
        sh = self.shardings.get(node.name)
        if sh is None or not isinstance(value, torch.Tensor):
            return None
        shape = tuple(int(s) for s in value.shape)
        out = node.meta.get("val")
        if isinstance(out, (tuple, list)):
            out = out[0] if out else None
        out_shape = tuple(int(s) for s in out.shape) if isinstance(out, torch.Tensor) else None
        groups = None
        if isinstance(position, int) and position < len(node.args):
            prod = _producer(node.args[position])
            if prod is not None and prod.name in self.shardings:
                groups = sh.input_groups(prod.name)
        if groups is None or len(groups) != len(shape):
            groups = arg_groups(sh, position, shape, out_shape)
        spec = list(placements(sh, groups, self.mesh.ndim))
        # a dimension its axes do not divide stays whole (a reshape's input whose batch of
        # one sample the plan's leading split, made for a larger batch, cannot cut)
        for j in set(spec) - {-1}:
            axes = [a for a, d in enumerate(spec) if d == j]
            if shape[j] % int(np.prod([self.mesh.shape[a] for a in axes])):
                for a in axes:
                    spec[a] = -1
        return tuple(spec)

    def _distribute_params(self, memo: dict[int, nn.Parameter]) -> None:
        """Replace the program's parameters by DTensor parameters, laid out as their first
        graph reader wants them (replicated when no graph operator reads them directly)."""
        for node in self.program.graph.nodes:
            if node.op != "get_attr":
                continue
            target = str(node.target)
            try:
                p = self.program.get_parameter(target)
            except AttributeError:
                continue
            if id(p) in memo:
                new = memo[id(p)]
            elif isinstance(p, DTensor):
                continue
            else:
                spec: tuple[int, ...] | None = None
                for user in node.users:
                    for pos, a in _positions(user):
                        if a is node:
                            spec = self._spec_for(user, pos, p)
                            break
                    if spec is not None:
                        break
                pl = to_placements(spec or (-1,) * self.mesh.ndim)
                with torch.no_grad():
                    dt = distribute_tensor(p.detach(), self.mesh, pl, src_data_rank=None)
                new = nn.Parameter(dt, requires_grad=p.requires_grad)
                memo[id(p)] = new
            *path, last = target.split(".")
            mod = self.program
            for part in path:
                mod = getattr(mod, part)
            mod._parameters[last] = new

    # ------------------------------------------------------------------ running
    def _wrap(self, t: Any) -> Any:
        if isinstance(t, torch.Tensor) and not isinstance(t, DTensor):
            return DTensor.from_local(t, self.mesh, [Replicate()] * self.mesh.ndim,
                                      run_check=False)
        return t

    def _output(self, t: Any) -> Any:
        """An output as the program returns it: whole, or with :attr:`batch_outputs` a
        DTensor split only by its batch (each device computes the loss on its part, as
        data parallelism does, instead of gathering the model's output)."""
        if self.batch_outputs and batch_split(t):
            return t
        return self._full(t)

    def _full(self, t: Any) -> Any:
        if isinstance(t, DTensor):
            return redistribute(t, self.mesh, [Replicate()] * self.mesh.ndim).to_local()
        return t

    def _to(self, t: Any, spec: Sequence[int] | None) -> Any:
        if spec is None or not isinstance(t, DTensor):
            return t
        want = to_placements(spec)
        if tuple(t.placements) == want:
            return t
        self.redistributions += 1
        if communicates(t.placements, want):
            self.reshards += 1
        return redistribute(t, self.mesh, want)

    def _receive(self, t: Any, spec: tuple[int, ...] | None) -> Any:
        """An input as this device received it: whole, or its batch shard in ``spec``."""
        if spec is None or not isinstance(t, torch.Tensor):
            return self._wrap(t)
        return DTensor.from_local(t, self.mesh, to_placements(spec), run_check=False)

    def _send(self, t: Any, spec: tuple[int, ...] | None) -> Any:
        """An output as this device sends it: whole, or its batch shard in ``spec``
        (re-laid out first where the operator left it otherwise)."""
        if spec is None or not isinstance(t, torch.Tensor):
            return self._output(t)
        return self._to(self._wrap(t), spec).to_local().contiguous()

    def forward(self, *inputs: torch.Tensor) -> Any:
        """Run on whole (replicated) inputs, or batch shards where :attr:`input_specs`
        says; returns whole outputs (every rank the same), or batch shards where
        :attr:`output_specs` says."""
        self.redistributions = 0
        self.reshards = 0
        self.reductions = 0
        env: dict[fx.Node, Any] = {}
        specs = iter(self.input_specs) if self.input_specs is not None else None
        it = iter(inputs)
        result: Any = None
        for node in self.program.graph.nodes:
            if node.op == "placeholder":
                env[node] = self._receive(next(it), None if specs is None else next(specs))
            elif node.op == "get_attr":
                env[node] = self._wrap(_fetch(self.program, str(node.target)))
            elif node.op == "output":
                outs = fx.node.map_arg(node.args[0], env.__getitem__)
                if self.output_specs is None:
                    result = _map(outs, self._output)
                else:
                    many = isinstance(outs, (tuple, list))
                    sent = tuple(self._send(t, sp) for t, sp in
                                 zip(outs if many else (outs,), self.output_specs, strict=True))
                    result = sent if many else sent[0]
            else:
                try:
                    env[node] = self._run(node, env)
                except Exception as exc:
                    exc.add_note(f"shardplan: running operator {node.name} ({node.target}) "
                                 f"on DTensors")
                    raise
        return result

    def _run(self, node: fx.Node, env: dict[fx.Node, Any]) -> Any:
        args = fx.node.map_arg(node.args, env.__getitem__)
        kwargs = fx.node.map_arg(node.kwargs, env.__getitem__)
        if node.op == "call_method":
            return _map(getattr(args[0], str(node.target))(*args[1:], **kwargs), self._wrap)
        target = node.target
        if getattr(target, "__name__", "") == "_assign_buffer":
            buffer, value = args
            with torch.no_grad():
                local = buffer.to_local() if isinstance(buffer, DTensor) else buffer
                local.copy_(self._full(value))
            return None
        if node.name in self.shardings:
            args = tuple(_map_arg(a, lambda t, p: self._to(t, self._spec_for(node, p, t)), i)
                         for i, a in enumerate(args))
            kwargs = {k: _map_arg(v, lambda t, p: self._to(t, self._spec_for(node, p, t)), k)
                      for k, v in kwargs.items()}
        name = _op_name(target)
        target, name = _out_of_place(node, target, name)
        if name in ("dropout",) and target is aten.dropout.default:
            return self._dropout(*args, **kwargs)
        if name == "scaled_dot_product_attention":
            return self._attention(node, args, kwargs)
        if name in _RANDOM or name in _NO_BACKWARD_RULE:
            return self._local(node, target, args, kwargs)
        if not any(isinstance(t, DTensor) for t in _tensors((args, kwargs))):
            return _map(target(*args, **kwargs), self._wrap)
        if "batch_norm" in name:
            local = self._batch_norm_local(target, args, kwargs)
            if local is not None:
                return local
        if name in _VIEWS:
            local = self._view_local(args)
            if local is not None:
                return local
        try:
            out = target(*args, **kwargs)
        except NotImplementedError as exc:
            if "sharding strategy" not in str(exc):
                raise
            return self._local(node, target, args, kwargs)
        out = _map(out, self._wrap)
        sh = self.shardings.get(node.name)
        if sh is not None:
            out = _map(out, lambda t: self._reduce(t, sh))
        return out

    def _reduce(self, t: Any, sh: NodeSharding) -> Any:
        """A graph operator's partial sums (a split reduced dimension; a vocabulary-split
        embedding's masked lookups) reduced where they are made, into the layout the
        configuration gives its output on those axes: the all-reduce (or reduce-scatter) a
        layer's cost charges, once, however many operators read the result."""
        if not isinstance(t, DTensor) or not any(isinstance(p, Partial) for p in t.placements):
            return t
        planned = placements(sh, sh.output, self.mesh.ndim) \
            if len(sh.output) == t.ndim else (-1,) * self.mesh.ndim
        want = tuple(to_placements((j,))[0] if isinstance(p, Partial) else p
                     for p, j in zip(t.placements, planned, strict=True))
        self.reductions += 1
        return redistribute(t, self.mesh, want)

    def _local(self, node: fx.Node, target: Any, args: Any, kwargs: Any) -> Any:
        """Run on whole tensors on every device (the same random state everywhere)."""
        self.replicated.add(node.name)
        full_args = _map(args, self._full)
        full_kwargs = _map(kwargs, self._full)
        return _map(target(*full_args, **full_kwargs), self._wrap)

    def _view_local(self, args: Any) -> Any:
        """A view that merges or splits the leading dimensions of a tensor split by its batch
        alone (``(b, s, h)`` to ``(b s, h)`` and back, what the capture maps the batch
        through): each device views its own rows, which are one contiguous block on both
        sides, without moving data. DTensor refuses to reshape a sharded dimension; None when
        the view is another one (DTensor's rule runs then)."""
        x = args[0] if args else None
        if not batch_split(x) or len(args) < 2:
            return None
        shape = args[1]
        if isinstance(shape, int):
            shape = args[1:]
        try:
            want = [int(d) for d in shape]
        except (TypeError, ValueError):
            return None
        total = int(x.numel())
        if -1 in want:
            known = int(np.prod([d for d in want if d != -1])) or 1
            want[want.index(-1)] = total // known
        if not want or int(np.prod(want)) != total or want[0] == x.shape[0]:
            return None
        local = x.to_local()
        rows = local.shape[0] * (want[0] / x.shape[0])  # this device's share of want[0]
        if rows != int(rows) or int(np.prod(local.shape)) != int(rows) * int(np.prod(want[1:])):
            return None
        out = local.reshape(int(rows), *want[1:])
        full = torch.Size(want)
        return DTensor.from_local(out, self.mesh, tuple(x.placements), run_check=False,
                                  shape=full, stride=torch.empty(full, device="meta").stride())

    def _batch_norm_local(self, target: Any, args: Any, kwargs: Any) -> Any:
        """A batch normalisation whose input is split only by its batch: each device
        normalises its part of the batch with its own statistics, as data parallelism does
        (torch's DDP and FSDP; what :func:`shardplan.strategy._price.local_statistics`
        prices), instead of DTensor's rule, which gathers the whole activation on every
        device. The weight and bias gradients are partial sums over the batch split,
        reduced with the other gradients (:func:`sync_grads`); running statistics are each
        device's own, as under DDP without ``broadcast_buffers``. Not equal to one process
        (the statistics are of a part of the batch); None when the input is split otherwise
        (DTensor's rule runs then)."""
        x = args[0] if args else None
        if not isinstance(x, DTensor) or x.ndim < 2:
            return None
        pl = tuple(x.placements)
        batch = [isinstance(q, Shard) and q.dim == 0 for q in pl]
        if not any(batch) or not all(b or isinstance(q, Replicate)
                                     for b, q in zip(batch, pl, strict=True)):
            return None
        others = [t for t in _tensors((args[1:], kwargs)) if isinstance(t, DTensor)]
        if any(not all(isinstance(q, Replicate) for q in t.placements) for t in others):
            return None
        grad_pl = tuple(Partial() if b else Replicate() for b in batch)

        def local(t: Any) -> Any:
            if not isinstance(t, DTensor):
                return t
            if t is x:
                return t.to_local()
            return t.to_local(grad_placements=grad_pl) if t.requires_grad else t.to_local()

        out = target(*_map(args, local), **{k: _map(v, local) for k, v in kwargs.items()})

        def wrap(t: Any) -> Any:
            if not isinstance(t, torch.Tensor):
                return t
            if t.ndim == x.ndim:
                return DTensor.from_local(t, self.mesh, pl, run_check=False,
                                          shape=x.shape, stride=x.stride())
            return DTensor.from_local(t, self.mesh, [Replicate()] * self.mesh.ndim,
                                      run_check=False)

        return _map(out, wrap)

    def _dropout(self, x: DTensor, p: float, train: bool) -> Any:
        """Dropout with the mask one process draws: the whole tensor's (every rank draws the
        same), each rank keeping its shard; no communication."""
        if not train or p == 0.0:
            return x
        mask = aten.dropout.default(torch.ones(tuple(x.shape), dtype=x.dtype,
                                               device=x.device), p, train)
        want = tuple(Replicate() if isinstance(q, Partial) else q for q in x.placements)
        x = redistribute(x, self.mesh, want)
        m = redistribute(DTensor.from_local(mask, self.mesh, [Replicate()] * self.mesh.ndim,
                                             run_check=False), self.mesh, want)
        return x * m

    def _attention(self, node: fx.Node, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """``scaled_dot_product_attention`` on each rank's batch or head shard: q, k, v split
        alike over the batch or head dimension (anything else is gathered first), the mask
        split with them where it has those dimensions; with dropout, on whole tensors."""
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
        bound = dict(zip(names, args, strict=False))
        bound.update(kwargs)
        q, k, v = bound["query"], bound["key"], bound["value"]
        mask = bound.get("attn_mask")
        if float(bound.get("dropout_p", 0.0) or 0.0) > 0.0 or not all(
                isinstance(t, DTensor) for t in (q, k, v)) or q.ndim != 4:
            return self._local(node, node.target, args, kwargs)
        want = tuple(pl if isinstance(pl, Shard) and pl.dim in (0, 1) else Replicate()
                     for pl in q.placements)
        q, k, v = (redistribute(t, self.mesh, want) for t in (q, k, v))
        if isinstance(mask, DTensor):
            mwant = tuple(
                pl if isinstance(pl, Shard) and mask.ndim == 4
                and mask.shape[pl.dim] == q.shape[pl.dim] else Replicate() for pl in want)
            mask = redistribute(mask, self.mesh, mwant)
            bound["attn_mask"] = mask.to_local()
        bound.update(query=q.to_local(), key=k.to_local(), value=v.to_local())
        out = node.target(**bound).contiguous()  # CPU attention returns a permuted layout
        shape = (*q.shape[:-1], v.shape[-1])
        return DTensor.from_local(out, self.mesh, want, run_check=False,
                                  shape=torch.Size(shape),
                                  stride=torch.empty(shape, device="meta").stride())

    # ------------------------------------------------------------------ gradients
    def dtensor_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if isinstance(p, DTensor)]


def sync_grads(params: Iterable[nn.Parameter], bucket_bytes: int | None = None) -> None:
    """Bring every DTensor parameter's gradient to the parameter's own layout: a ``Partial``
    gradient (summed over batch shards, or over a split reduced dimension) is all-reduced or
    reduce-scattered; a parameter without gradient gets zeros.

    Gradients whose reduction is an all-reduce over some mesh dimensions (``Partial`` there,
    the parameter ``Replicate``; every other dimension alike) are reduced as data
    parallelism reduces them: flattened into buckets of ``bucket_bytes`` (default: all of
    them in one), one all-reduce per bucket and mesh dimension, which is what the simulator
    prices (one ring over the gradients' bytes, not one collective per tensor)."""
    buckets = GradBuckets(bucket_bytes)
    for p in params:
        buckets.add(p)
    buckets.finish()


def _flat_key(p: Any) -> tuple[Any, ...] | None:
    """What a gradient's all-reduce shares with others of one bucket: its mesh, the mesh
    dimensions reduced and the other placements; None when its reduction is not an
    all-reduce (a reduce-scatter into a split parameter goes alone)."""
    g = p.grad
    if not isinstance(g, DTensor) or g.device_mesh is not p.device_mesh:
        return None
    dims = []
    for i, (a, b) in enumerate(zip(g.placements, p.placements, strict=True)):
        if isinstance(a, Partial) and isinstance(b, Replicate) and a.reduce_op == "sum":
            dims.append(i)
        elif a != b:
            return None
    if not dims or g.to_local().dtype != p.to_local().dtype:
        return None
    return (id(p.device_mesh), tuple(dims), tuple(p.placements), g.to_local().dtype)


class GradBuckets:
    """Gradients reduced in buckets (see :func:`sync_grads`): :meth:`add` a parameter once
    its gradient is final (a backward hook may, to overlap the reduction with the rest of
    the backward), :meth:`finish` before the optimizer steps."""

    def __init__(self, bucket_bytes: int | None = None) -> None:
        self.cap = float("inf") if bucket_bytes is None else float(bucket_bytes)
        self.open: dict[tuple[Any, ...], list[Any]] = {}
        self.size: dict[tuple[Any, ...], float] = {}
        self.running: list[tuple[list[Any], torch.Tensor, list[Any]]] = []
        self.seen: set[int] = set()

    def add(self, p: Any) -> None:
        if not isinstance(p, DTensor) or id(p) in self.seen:
            return
        self.seen.add(id(p))
        g = p.grad
        if g is None:
            p.grad = torch.zeros_like(p)
            return
        if tuple(g.placements) == tuple(p.placements):
            return
        key = _flat_key(p)
        if key is None:
            p.grad = redistribute(g, p.device_mesh, p.placements)
            return
        self.open.setdefault(key, []).append(p)
        self.size[key] = self.size.get(key, 0.0) + g.to_local().numel() * \
            g.to_local().element_size()
        if self.size[key] >= self.cap:
            self._launch(key)

    def _launch(self, key: tuple[Any, ...]) -> None:
        import torch.distributed as dist

        bucket = self.open.pop(key)
        self.size.pop(key, None)
        mesh = bucket[0].device_mesh
        flat = torch.cat([p.grad.to_local().reshape(-1) for p in bucket])
        dims = key[1]
        for d in dims[:-1]:  # mesh dimensions reduce one after another
            dist.all_reduce(flat, group=mesh.get_group(d))
        work = dist.all_reduce(flat, group=mesh.get_group(dims[-1]), async_op=True)
        self.running.append((bucket, flat, [work]))

    def finish(self) -> None:
        for key in list(self.open):
            self._launch(key)
        for bucket, flat, works in self.running:
            for w in works:
                w.wait()
            at = 0
            for p in bucket:
                n = p.grad.to_local().numel()
                local = flat[at:at + n].view_as(p.grad.to_local())
                at += n
                p.grad = DTensor.from_local(local, p.device_mesh, p.placements,
                                            run_check=False, shape=p.shape, stride=p.stride())
        self.running = []
        self.seen = set()


#: View operators :meth:`ShardedProgram._view_local` runs on batch shards.
_VIEWS = {"view", "_unsafe_view", "reshape"}


def batch_split(t: Any) -> bool:
    """Whether ``t`` is a DTensor split by its first (batch) dimension and otherwise
    replicated."""
    if not isinstance(t, DTensor) or t.ndim < 1:
        return False
    pl = t.placements
    return any(isinstance(q, Shard) and q.dim == 0 for q in pl) and all(
        isinstance(q, Replicate) or (isinstance(q, Shard) and q.dim == 0) for q in pl)


def _fetch(root: nn.Module, target: str) -> Any:
    obj: Any = root
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _producer(arg: Any) -> fx.Node | None:
    """The operator whose output ``arg`` is (through ``getitem`` of a tuple output)."""
    while isinstance(arg, fx.Node):
        if arg.op == "call_function" and arg.target is operator.getitem:
            arg = arg.args[0]
            continue
        return arg if arg.op == "call_function" else None
    return None


def _positions(node: fx.Node) -> list[tuple[int | str, Any]]:
    out: list[tuple[int | str, Any]] = []
    for i, a in enumerate(node.args):
        for x in (a if isinstance(a, (list, tuple)) else [a]):
            out.append((i, x))
    for k, a in node.kwargs.items():
        for x in (a if isinstance(a, (list, tuple)) else [a]):
            out.append((k, x))
    return out


def _map_arg(value: Any, fn: Any, position: int | str) -> Any:
    if isinstance(value, (tuple, list)):
        return type(value)(_map_arg(v, fn, position) for v in value)
    return fn(value, position) if isinstance(value, DTensor) else value


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return [value] if isinstance(value, torch.Tensor) else []
