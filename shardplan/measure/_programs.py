"""What running the runtime's programs adds, measured on a rank: a DTensor program's interpreter
and redistributions (per operator, per byte), a DTensor optimizer step, and a pipelining
schedule's per-action cost; on small transformer-like blocks exported and split as the runtime
splits a captured model."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from shardplan.measure._timing import (
    BLOCKS,
    COMM_SAMPLES,
    DT_SIZES,
    PIPE_MICROBATCHES,
    UNITS,
    typical_seconds,
)
from shardplan.measure._timing import median_seconds as _median_seconds

__all__ = ["dtensor_rates"]


def _dtensor_reshard(torch: Any, dist: Any, dev: Any, sync: Callable[[], None], world: int,
                     repeats: int, warmup: int) -> list[float]:
    """``[seconds, bytes]``: what one redistribution that communicates costs in the runtime's
    DTensor program, its forward and its backward together, and the bytes each device
    receives in it.

    The transformer blocks of :func:`_dtensor_program` at the larger of :data:`DT_SIZES`,
    exported and cut as a stage, run as a
    :class:`~shardplan.runtime._dtensor.ShardedProgram` on the runtime's mesh of all ranks
    (:func:`shardplan.runtime._sharding.mesh_shape`) twice: replicated, and with every 4-d
    view and transpose (the attention heads' ``(samples, positions, heads, features)`` and
    back) split over all ranks on its last dimension, laid out by the runtime's own
    :func:`~shardplan.runtime._sharding.node_shardings`. Those operators compute nothing,
    so the split program differs by its redistributions alone: every q, k and v is sliced
    from the replicated projection (free forward, gathered in the backward) and gathered
    for the attention, which runs whole, and the attention's output likewise. Each
    redistribution the program counts communicates in one direction: the forward's
    ``reshards`` gather, the other ``redistributions - reshards`` slice and gather in the
    backward. Per round, ``(split - replicated) / redistributions`` over the forward and
    the backward timed back to back; typical over at least :data:`COMM_SAMPLES` rounds
    (:func:`typical_seconds`). Each moves ``(N - 1) / N`` of a ``samples x positions x
    features`` tensor into every device.

    The cost is measured between computations, as a program pays it, not as collectives
    back to back: the other rank is still computing (the waits absorb the ranks' skew),
    DTensor's redistribution machinery runs per call, and a gather of the last dimension
    copies. Here one such redistribution of 128 KiB took about 1.7 ms where the bare
    all-gather of the same bytes takes 0.3 to 0.7 ms, and the old measurement (a partial
    sum's all-reduce between tiny matrix products) read 0.4 to 1.0 ms in all: a plan with
    30 of a transformer's 82 operators split ran 1.8 times its prediction on it."""
    from torch.distributed.device_mesh import init_device_mesh

    from shardplan.capture import capture
    from shardplan.runtime._dtensor import ShardedProgram
    from shardplan.runtime._sharding import mesh_shape, node_shardings
    from shardplan.strategy.tables import graph_spaces

    model, x0, _, _, program = _blocks_program(torch, dev, DT_SIZES[1])
    graph = capture(model, (x0,))
    strategy = {str(v): [world if (sp.kind in ("reshape", "transpose") and len(sp.dims) == 4
                                   and i == 3) else 1 for i in range(len(sp.dims))]
                for v, sp in enumerate(graph_spaces(graph))}
    layouts = node_shardings(graph, strategy, [(range(graph.num_nodes), world)])
    mesh = init_device_mesh(dev.type, mesh_shape(world))
    plain, split = (ShardedProgram(program(), {s.name: s for s in lay}, mesh)
                    for lay in ((), layouts))
    extra = []
    for it in range(warmup + max(repeats, COMM_SAMPLES)):
        p, q = sum(_timed_pass(dist, sync, plain, x0)), sum(_timed_pass(dist, sync, split, x0))
        if it >= warmup:
            extra.append((q - p) / max(split.redistributions, 1))
    received = x0.numel() * x0.element_size() * (world - 1) / world  # one q, k or v
    return [max(typical_seconds(extra), 0.0), float(received)]


def dtensor_rates(small: tuple[float, float, float], large: tuple[float, float, float]
                  ) -> tuple[float, float]:
    """``(per operator, per output byte)`` from two programs' ``(extra seconds, operators,
    output bytes)``: the pair of equations ``extra = operators x per operator + bytes x per
    byte``; where noise makes either rate negative, the small program alone prices the
    operators (per byte 0) -- or, with a negative per-operator rate, the large program's
    bytes alone carry it. O(1).

    Examples
    --------
    >>> op, byte = dtensor_rates((1e-3, 10, 1e3), (3e-3, 10, 1e6))
    >>> round(op * 1e6, 3), round(byte * 1e9, 3)
    (99.8, 2.002)
    >>> dtensor_rates((1e-3, 10, 1e3), (0.5e-3, 10, 1e6))  # less for more bytes: noise
    (0.0001, 0.0)
    >>> dtensor_rates((0.0, 10, 1e3), (2e-3, 10, 1e6))
    (0.0, 2e-09)
    """
    (es, ns, bs), (el, nl, bl) = small, large
    lhs = np.array([[ns, bs], [nl, bl]], dtype=np.float64)
    per_op, per_byte = (float(x) for x in np.linalg.solve(lhs, np.array([es, el])))
    if per_byte < 0:
        return max(es, 0.0) / ns, 0.0
    if per_op < 0:
        return 0.0, max(el, 0.0) / bl
    return per_op, per_byte


def _blocks(batch: int, seq: int, width: int) -> Any:
    """:data:`BLOCKS` pre-norm transformer blocks (layer norms, a linear layer to q, k, v
    split into two heads, causal attention, a projection, a GELU MLP of twice the width,
    residual adds) on inputs of ``(batch, seq, width)``: a training step's kind of work,
    for the fixed costs measured on it."""
    import torch.nn.functional as F
    from torch import nn

    class Blocks(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.ModuleList(nn.LayerNorm(width) for _ in range(2 * BLOCKS))
            self.qkv = nn.ModuleList(nn.Linear(width, 3 * width) for _ in range(BLOCKS))
            self.proj = nn.ModuleList(nn.Linear(width, width) for _ in range(BLOCKS))
            self.up = nn.ModuleList(nn.Linear(width, 2 * width) for _ in range(BLOCKS))
            self.down = nn.ModuleList(nn.Linear(2 * width, width) for _ in range(BLOCKS))

        def forward(self, x: Any) -> Any:
            for i in range(BLOCKS):
                q, k, v = (t.view(batch, seq, 2, width // 2).transpose(1, 2)
                           for t in self.qkv[i](self.norm[2 * i](x)).split(width, dim=-1))
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                x = x + self.proj[i](a.transpose(1, 2).reshape(batch, seq, width))
                x = x + self.down[i](F.gelu(self.up[i](self.norm[2 * i + 1](x))))
            return x

    return Blocks()


def _blocks_program(torch: Any, dev: Any, size: tuple[int, int, int]
                    ) -> tuple[Any, Any, Any, list[str], Callable[[], Any]]:
    """The blocks of :func:`_blocks` at ``size = (samples, positions, features)`` on
    ``dev``, exported: ``(model, input of ones, exported program, its graph operators'
    names, a maker of the whole program cut as one stage)`` (as the runtime cuts a stage:
    :func:`shardplan.runtime._split.split_program`; each call makes a fresh one)."""
    from shardplan.runtime._split import split_program
    from shardplan.workload.program import graph_ops

    torch.manual_seed(0)
    model = _blocks(*size).to(dev)
    x0 = torch.ones(*size, device=dev)
    ep = torch.export.export(model, (x0,), strict=False)
    names = [name for name, _, _ in graph_ops(ep)]
    return model, x0, ep, names, lambda: split_program(model, ep, [names], [0])[0].module


def _timed_pass(dist: Any, sync: Callable[[], None], mod: Any, x0: Any
                ) -> tuple[float, float]:
    """``(forward, backward)`` seconds of one pass of ``mod`` on ``x0`` (the sum of its
    output), every rank starting together; the gradients dropped after."""
    dist.barrier()
    t0 = time.perf_counter()
    y = mod(x0)
    y = y[0] if isinstance(y, (tuple, list)) else y
    sync()
    t1 = time.perf_counter()
    y.sum().backward()
    sync()
    t2 = time.perf_counter()
    mod.zero_grad(set_to_none=True)
    return t1 - t0, t2 - t1


def _dtensor_program(torch: Any, dist: Any, dev: Any, sync: Callable[[], None], mesh: Any,
                     repeats: int, warmup: int) -> dict[str, list[float]]:
    """What running a program on DTensors as the runtime does adds to its operators:
    ``{"per_op": [forward, backward], "per_byte": [forward, backward]}`` extra seconds per
    graph operator and per byte of the operators' outputs.

    Transformer blocks (:func:`_blocks`) exported and cut like a stage
    (:func:`shardplan.runtime._split.split_program`), run as a
    :class:`~shardplan.runtime._dtensor.ShardedProgram` replicated over the mesh of all
    ranks (no communication: no layout splits anything) against the same program run
    plainly; at two sizes (:data:`DT_SIZES`: tiny, and activations of a small
    transformer's, 128 KiB per operator). The extra seconds over the graph's operators
    (:func:`shardplan.workload.program.graph_ops`, the nodes the simulator charges) and
    their output bytes give both rates (:func:`dtensor_rates`); each extra is the median
    over rounds that time both programs back to back. The runtime's interpreter
    (layouts looked up per operator, tensors wrapped) and DTensor's dispatch and sharding
    propagation are per operator; what grows with the tensors (copies DTensor's operators
    make that the plain ones avoid) is per byte: on this machine the per-operator extra
    of a 4-layer transformer grew from 36 to 48 us (forward) and 46 to 66 us (backward)
    between 64 KB and 17.7 MB of outputs per micro-batch, 0.06 and 0.1 ns per byte. Bare
    DTensor operators of simple layers in a Python loop (the measurement before these)
    measured a third of what a transformer's program pays per operator."""
    from shardplan.runtime._dtensor import ShardedProgram
    from shardplan.workload.program import tensor_bytes

    found = []  # per size: (extra forward, extra backward, operators, output bytes)
    for size in DT_SIZES:
        _, x0, ep, names, program = _blocks_program(torch, dev, size)
        kept = set(names)
        nbytes = float(sum(tensor_bytes(n.meta.get("val")) for n in ep.graph.nodes
                           if n.name in kept))
        plain, sharded = program(), ShardedProgram(program(), {}, mesh)
        extra = []  # each round times both, back to back: load that comes and goes
        for it in range(warmup + max(repeats, 5)):  # falls on few rounds, outvoted
            p = _timed_pass(dist, sync, plain, x0)
            q = _timed_pass(dist, sync, sharded, x0)
            if it >= warmup:
                extra.append((q[0] - p[0], q[1] - p[1]))
        ef, eb = np.median(np.array(extra), axis=0)
        found.append((float(ef), float(eb), float(max(len(names), 1)), nbytes))
    (fs, bs, ns, bys), (fl, bl, nl, byl) = found
    per_f = dtensor_rates((fs, ns, bys), (fl, nl, byl))
    per_b = dtensor_rates((bs, ns, bys), (bl, nl, byl))
    return {"per_op": [per_f[0], per_b[0]], "per_byte": [per_f[1], per_b[1]]}


def _dtensor_step(torch: Any, dist: Any, dev: Any, sync: Callable[[], None], mesh: Any,
                  repeats: int, warmup: int) -> float:
    """Extra seconds per parameter-holding layer of an Adam step whose parameters are
    DTensors (strategy plans and FSDP run so), over the same step on plain tensors:
    :data:`UNITS` linear layers of 16 x 16 (a weight and a bias each) replicated over the
    mesh, both steps timed back to back in each round, the median over rounds of the
    difference per layer. Adam on DTensors dispatches every parameter's update through
    DTensor: the fixed cost dominates a small model's step on a CPU."""
    import statistics

    from torch import nn
    from torch.distributed.tensor import Replicate, distribute_tensor

    def adam(wrap: bool) -> Any:
        torch.manual_seed(0)
        layers = nn.Sequential(*(nn.Linear(16, 16) for _ in range(UNITS))).to(dev)
        params = [p.detach().clone() for p in layers.parameters()]
        if wrap:
            params = [distribute_tensor(p, mesh, [Replicate()]) for p in params]
        params = [nn.Parameter(p) for p in params]
        for p in params:
            p.grad = torch.ones_like(p)
        return torch.optim.Adam(params, lr=1e-3)

    plain, wrapped = adam(False), adam(True)
    per = []
    for it in range(warmup + max(repeats, 5)):
        t_plain = _median_seconds(plain.step, sync, 1, 0, dist)
        t_dt = _median_seconds(wrapped.step, sync, 1, 0, dist)
        if it >= warmup:
            per.append((t_dt - t_plain) / UNITS)
    return max(float(statistics.median(per)), 0.0)


def _pipeline_action(torch: Any, dist: Any, dev: Any, sync: Callable[[], None], world: int,
                     rank: int, repeats: int, warmup: int, model: Any) -> float:
    """Seconds torch's pipelining adds per forward or backward action: ``model`` (tiny
    layers) as a one-stage ``PipelineStage`` on a group of this rank alone, run by
    ``ScheduleGPipe`` over :data:`PIPE_MICROBATCHES` micro-batches, against the same
    forwards, losses and backwards in a loop; the difference over the ``2 M`` actions (the
    schedule's bookkeeping: stage inputs, outputs and gradients; no messages)."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    groups = [dist.new_group([r]) for r in range(world)]  # every rank creates every group
    m = PIPE_MICROBATCHES
    x = torch.ones(4 * m, 16, device=dev)
    y = torch.zeros(4 * m, 16, device=dev)

    def loss(o: Any, t: Any) -> Any:
        return ((o - t) ** 2).mean()

    stage = PipelineStage(model, 0, 1, dev, input_args=(torch.ones(4, 16, device=dev),),
                          output_args=(torch.ones(4, 16, device=dev),), group=groups[rank])
    sched = ScheduleGPipe(stage, n_microbatches=m, loss_fn=loss)

    def plain() -> None:
        for xs, ys in zip(x.chunk(m), y.chunk(m), strict=True):
            loss(model(xs), ys).backward()

    t_pipe = _median_seconds(lambda: sched.step(x, target=y), sync, repeats, warmup, dist)
    t_plain = _median_seconds(plain, sync, repeats, warmup, dist)
    return max(t_pipe - t_plain, 0.0) / (2 * m)
