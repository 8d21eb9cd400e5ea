"""A rank's fixed costs of a training run beyond its operators' arithmetic (operator dispatch
and autograd, FSDP gathers, optimizer steps, the CPU share of transfers, host syncs, the
slowdown of busy cores), measured with every rank doing the same at once."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from shardplan.measure._programs import (
    _blocks,
    _dtensor_program,
    _dtensor_reshard,
    _dtensor_step,
    _pipeline_action,
)
from shardplan.measure._timing import (
    BLOCK_OPS,
    BLOCKS,
    BUSY_ROUNDS,
    BUSY_STEPS,
    CPU_GROUPS,
    CPU_MESSAGE,
    DT_SIZES,
    FSDP_WIDE,
    SYNC_BYTES,
    SYNC_PIECES,
    SYNC_ROUNDS,
    UNITS,
    typical_seconds,
)
from shardplan.measure._timing import median_seconds as _median_seconds

__all__ = ["fsdp_gather_overhead", "host_sync_point", "overheads", "slowdown_ratios"]


def overheads(rank: int, world: int, cfg: dict[str, Any], dev: Any,
               sync: Callable[[], None]) -> dict[str, Any]:
    """The fixed costs a training run pays beyond its operators' arithmetic, measured on
    this device with every rank doing the same at once (as in training):

    - ``op_overhead_seconds``: ``[forward, backward]`` seconds per operator of
      :data:`BLOCKS` tiny layer blocks (16 features, 4 samples; per block a linear layer,
      GELU, layer norm, view, transpose, reshape and a residual add: :data:`BLOCK_OPS`
      operators, the kinds a captured graph's nodes are) under autograd, the forward
      recording the graph and one backward through it: dispatch and autograd
      bookkeeping, what an operator costs however little it computes;
    - ``dtensor_op_overhead_seconds``, ``dtensor_op_seconds_per_byte``: ``[forward,
      backward]`` extra seconds per operator, and per byte of the operators' outputs, when
      transformer blocks run as the runtime runs a DTensor program, replicated over all
      ranks (its interpreter, sharding propagation, wrapping and DTensor's copies; no
      communication: :func:`_dtensor_program`);
    - ``dtensor_reshard_seconds``: ``[seconds, bytes]``, what one redistribution that
      communicates costs in the runtime's DTensor program between computations, forward
      and backward together, and the bytes each device receives in it
      (:func:`_dtensor_reshard`; :func:`shardplan.measure.measure` turns it into
      ``dtensor_collective_overhead_seconds``);
    - ``dtensor_step_overhead_seconds``: extra seconds per parameter-holding layer of an
      Adam step on DTensor parameters (:func:`_dtensor_step`);
    - ``pipeline_action_overhead_seconds``: seconds torch's pipelining schedule adds per
      forward or backward action (:func:`_pipeline_action`);
    - ``fsdp_gather_overhead_seconds``: extra seconds per parameter all-gather of an FSDP2
      unit (``fully_shard``, gradient sync off) beyond a bare all-gather of the same bytes:
      :data:`UNITS` tiny linear units, ``(t_fsdp - t_plain) / (2 units) - t_allgather``,
      the three timed back to back in each round, the median over the rounds (medians of
      three separate series ranged from 18 us to 4.4 ms on this shared machine);
    - ``fsdp_gather_seconds_per_byte``: the same overhead measured on units of
      :data:`FSDP_WIDE` features, less the tiny units', per byte of a unit's parameters
      (copying shards in and gathered parameters out);
    - ``fsdp_reduce_overhead_seconds``, ``fsdp_reduce_seconds_per_byte``: the same for a
      unit's gradient reduction (FSDP's copies into and out of the reduce-scatter, the
      scaling, the sharded gradients' accumulation): the FSDP step with gradient sync
      against the one without, per unit, less a bare reduce-scatter; gloo's reduce-scatter
      itself costs 1.7 times its all-gather here, and FSDP's reduction of a transformer's
      5 units took 23 ms where the bare reduce-scatters take about 6;
    - ``gradient_seconds_per_byte``: ``[one replica, replicas]`` seconds per byte of 16 MiB
      of gradients in 16 tensors: scaled in place (what a one-replica step does), and
      flattened into one tensor, copied back out and scaled (the runtime's flat all-reduce
      around the collective itself);
    - ``comm_cpu_share``: what a point-to-point transfer takes from its ends' compute, as
      a share of its time in flight (:func:`_comm_cpu_share`; absent on a rank without a
      partner);
    - ``host_sync_seconds``: ``[[compute seconds, extra seconds], ...]``, what a
      collective every rank waits for costs beyond its own time after a computation of
      that length (:func:`_host_sync`; CPU ranks);
    - ``optimizer_seconds_per_byte``, ``optimizer_seconds_per_tensor``: ``{optimizer:
      seconds}`` per parameter byte and per parameter tensor of one step of each optimizer
      the runtime builds (:func:`_optimizer_steps`);
    - ``busy_slowdown``: ``{g: t_g / t_1}``, g = 1..N: the seconds until the last of g
      ranks running a fixed kernel at once is done, over one rank alone, the median of
      ratios taken within rounds that time every g in turn (:func:`slowdown_ratios`). The
      kernel is a training step's kind of work: :data:`BUSY_STEPS` forward and backward
      passes of the larger transformer blocks of :data:`DT_SIZES` (about 20 ms here,
      longer than a scheduler's time slice). Above 1 when the ranks share cores or memory
      (more processes than cores: about g / cores), and when their speeds vary (each
      waits for the last). Two ranks on this machine's two cores: 1.08-1.13 on such
      steps, where a kernel of matrix products and elementwise passes (the kernel
      before) read 1.00-1.02: its median missed what a Python-dispatched step pays.
    """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh

    # 3 to 7 timed runs each: medians steady enough, a few seconds in all
    repeats, warmup = min(max(int(cfg["repeats"]), 3), 7), max(int(cfg["warmup"]), 1)
    out: dict[str, Any] = {}
    mesh = init_device_mesh(dev.type, (world,))

    def blocks_per_op() -> tuple[float, float]:
        params = [torch.full((16, 16), 0.01, device=dev), torch.zeros(16, device=dev),
                  torch.ones(16, device=dev), torch.zeros(16, device=dev)]
        x0 = torch.ones(4, 16, device=dev)
        for p in params:
            p.requires_grad_(True)
        w, b, lw, lb = params
        fs, bs = [], []
        for it in range(warmup + repeats):
            dist.barrier()
            t0 = time.perf_counter()
            x = x0
            for _ in range(BLOCKS):
                y = F.layer_norm(F.gelu(F.linear(x, w, b)), (16,), lw, lb)
                x = y.view(4, 2, 8).transpose(1, 2).reshape(4, 16) + x
            sync()
            t1 = time.perf_counter()
            x.sum().backward()
            sync()
            t2 = time.perf_counter()
            for p in params:
                p.grad = None
            if it >= warmup:
                fs.append(t1 - t0)
                bs.append(t2 - t1)
        fs.sort()
        bs.sort()
        ops = BLOCKS * BLOCK_OPS
        return fs[len(fs) // 2] / ops, bs[len(bs) // 2] / ops

    plain = blocks_per_op()
    out["op_overhead_seconds"] = [plain[0], plain[1]]
    out["dtensor_reshard_seconds"] = _dtensor_reshard(torch, dist, dev, sync, world,
                                                      repeats, warmup)
    rates = _dtensor_program(torch, dist, dev, sync, mesh, repeats, warmup)
    out["dtensor_op_overhead_seconds"] = rates["per_op"]
    out["dtensor_op_seconds_per_byte"] = rates["per_byte"]

    from torch import nn
    from torch.distributed.fsdp import fully_shard

    def fsdp_rounds(width: int) -> tuple[list[tuple[float, ...]], Any, float]:
        """Rounds of (plain step, FSDP step without gradient sync, bare all-gather, FSDP
        step with it, bare reduce-scatter) for UNITS linear units of ``width`` features
        (the five timed back to back in every round: load that comes and goes between
        rounds is outvoted by the median), the plain model, and a unit's parameter
        bytes."""
        torch.manual_seed(0)
        model = nn.Sequential(*(nn.Linear(width, width) for _ in range(UNITS))).to(dev)
        synced = nn.Sequential(*(nn.Linear(width, width) for _ in range(UNITS))).to(dev)
        plain = nn.Sequential(*(nn.Linear(width, width) for _ in range(UNITS))).to(dev)
        inp = torch.ones(4, width, device=dev)

        def step(m: Any) -> Callable[[], None]:
            def run() -> None:
                m(inp).sum().backward()
            return run

        for m in (model, synced):
            for unit in m:
                fully_shard(unit, mesh=mesh)
            fully_shard(m, mesh=mesh)
        model.set_requires_gradient_sync(False)
        numel = width * width + width
        full = torch.ones(-(-numel // world) * world, device=dev)
        part = torch.ones(full.numel() // world, device=dev)
        rounds: list[tuple[float, ...]] = []
        for it in range(warmup + max(repeats, 9)):
            t_plain = _median_seconds(step(plain), sync, 1, 0, dist)
            t_fsdp = _median_seconds(step(model), sync, 1, 0, dist)
            t_ag = _median_seconds(lambda: dist.all_gather_into_tensor(full, part), sync, 1,
                                   0, dist)
            t_sync = _median_seconds(step(synced), sync, 1, 0, dist)
            t_rs = _median_seconds(lambda: dist.reduce_scatter_tensor(part, full), sync, 1,
                                   0, dist)
            if it >= warmup:
                rounds.append((t_plain, t_fsdp, t_ag, t_sync, t_rs))
        return rounds, plain, 4.0 * numel

    small, ref, small_bytes = fsdp_rounds(16)
    large, _, large_bytes = fsdp_rounds(FSDP_WIDE)
    for what, pick, calls in (("gather", (0, 1, 2), 2 * UNITS), ("reduce", (1, 3, 4), UNITS)):
        fixed, wide = (fsdp_gather_overhead([tuple(r[i] for i in pick) for r in rounds], calls)
                       for rounds in (small, large))
        out[f"fsdp_{what}_overhead_seconds"] = fixed
        out[f"fsdp_{what}_seconds_per_byte"] = \
            max(wide - fixed, 0.0) / (large_bytes - small_bytes)

    out["dtensor_step_overhead_seconds"] = _dtensor_step(torch, dist, dev, sync, mesh,
                                                         repeats, warmup)
    out["pipeline_action_overhead_seconds"] = _pipeline_action(torch, dist, dev, sync, world,
                                                                rank, repeats, warmup, ref)
    grads = [torch.rand(1 << 18, device=dev) for _ in range(16)]  # 16 MiB, 16 tensors
    nbytes = float(sum(g.numel() * g.element_size() for g in grads))

    def scale() -> None:  # one replica: the gradients scaled in place
        for g in grads:
            g.mul_(0.5)

    def flat() -> None:  # replicas: flattened for one all-reduce, copied back, scaled
        f = torch.cat([g.reshape(-1) for g in grads])
        offset = 0
        for g in grads:
            n = g.numel()
            f[offset:offset + n].view_as(g).clone().mul_(0.5)
            offset += n

    out["gradient_seconds_per_byte"] = [
        _median_seconds(scale, sync, repeats, warmup, dist) / nbytes,
        _median_seconds(flat, sync, repeats, warmup, dist) / nbytes]

    out["optimizer_seconds_per_byte"], out["optimizer_seconds_per_tensor"] = \
        _optimizer_steps(torch, dist, dev, sync, repeats, warmup)
    if dev.type == "cpu":  # every rank of a host: the same device type, the same barriers
        share = _comm_cpu_share(torch, dist, dev, sync, world, rank, repeats, warmup)
        if share is not None:
            out["comm_cpu_share"] = share
        out["host_sync_seconds"] = _host_sync(torch, dist, dev, sync, world, repeats,
                                              warmup)

    torch.manual_seed(0)
    blocks = _blocks(*DT_SIZES[1]).to(dev)
    x_busy = torch.ones(*DT_SIZES[1], device=dev)

    def kernel() -> None:  # about 20 ms on one core here: longer than a scheduler slice
        for _ in range(BUSY_STEPS):
            blocks(x_busy).sum().backward()
        blocks.zero_grad(set_to_none=True)

    rounds: list[dict[int, float]] = []
    # every round times each g once (see slowdown_ratios); at least BUSY_ROUNDS rounds: the
    # ratio of two ranks ranged 1.00-1.18 across 5-round measurements here
    for it in range(warmup + max(repeats, BUSY_ROUNDS)):
        times: dict[int, float] = {}
        for g in range(1, world + 1):
            dist.barrier()
            t0 = time.perf_counter()
            if rank < g:
                kernel()
                sync()
            dist.barrier()  # until the last of the g ranks is done: their common rate
            times[g] = time.perf_counter() - t0
        if it >= warmup:
            rounds.append(times)
    if rank == 0:
        out["busy_slowdown"] = slowdown_ratios(rounds)
    dist.barrier()
    return out


def fsdp_gather_overhead(rounds: list[tuple[float, ...]], gathers: int) -> float:
    """Seconds an FSDP unit's all-gather costs beyond a bare all-gather: from rounds of
    ``(plain step, FSDP step, bare all-gather)`` seconds timed back to back, the median over
    rounds of ``(fsdp - plain) / gathers - all-gather``, at least 0 (the reduction's
    overhead likewise, from ``(step without sync, step with it, bare reduce-scatter)``).
    O(rounds log rounds).

    Examples
    --------
    >>> fsdp_gather_overhead([(1.0, 3.0, 0.1), (2.0, 6.0, 0.2), (1.0, 3.4, 0.1)], 4)
    0.5
    """
    import statistics

    if not rounds:
        return 0.0
    per = [(f - p) / gathers - a for p, f, a in rounds]
    return max(float(statistics.median(per)), 0.0)


def slowdown_ratios(rounds: list[dict[int, float]]) -> dict[str, float]:
    """``{g: median over rounds of t_g / t_1}`` from rounds of timings ``{g: t_g}`` taken one
    right after another (g = 1 alone first).

    Each ratio compares timings of the same round, seconds apart, so load from other
    processes that comes and goes between rounds (a shared machine) cancels out, where
    medians of whole series taken one g after another compare different moments. O(rounds
    x world).

    Examples
    --------
    >>> slowdown_ratios([{1: 1.0, 2: 1.2}, {1: 2.0, 2: 2.4}, {1: 1.0, 2: 1.3}])
    {'1': 1.0, '2': 1.2}
    """
    import statistics

    out: dict[str, float] = {}
    for g in sorted({g for r in rounds for g in r}):
        ratios = [r[g] / r[1] for r in rounds if g in r and r.get(1, 0.0) > 0]
        out[str(g)] = statistics.median(ratios) if ratios else 1.0
    return out


def _optimizer_steps(torch: Any, dist: Any, dev: Any, sync: Callable[[], None],
                     repeats: int, warmup: int) -> tuple[dict[str, float], dict[str, float]]:
    """``({optimizer: seconds per parameter byte}, {optimizer: seconds per parameter
    tensor})`` of one step of each optimizer the settings name
    (:data:`shardplan.cost._formulas.OPTIMIZER_BYTES`' keys), built as the runtime builds it
    (:func:`shardplan.runtime._rank.make_optimizer`: torch's default implementation for
    the device), every rank stepping at once.

    Two steps are timed (medians over ``repeats`` after ``warmup``): over 16 MiB of
    parameters in 4 tensors of 4 MiB (larger than a core's cache here, as most layers'
    weights are) and over 256 tensors of 256 bytes; the pair of equations ``seconds =
    tensors x per tensor + bytes x per byte`` gives both rates (negative solutions, from
    noise, clipped to 0). torch's per-tensor implementation on a CPU launches several
    kernels per tensor and makes several passes over each: Adam here costs about 18 us
    per tensor and 0.77 ns per byte (1.6 times the roofline's one pass at the copy
    bandwidth), every rank stepping; the small transformer's 50 tensors then cost as much
    as 1.2 MB of weights."""
    from torch import nn

    from shardplan.cost._formulas import OPTIMIZER_BYTES
    from shardplan.runtime._rank import make_optimizer

    def params(count: int, numel: int) -> list[Any]:
        out = [nn.Parameter(torch.rand(numel, device=dev)) for _ in range(count)]
        for p in out:
            p.grad = torch.rand_like(p)
        return out

    shapes = ((4, 1 << 20), (256, 64))  # (tensors, float32 elements each)
    sets = [params(c, e) for c, e in shapes]
    lhs = np.array([[float(c), float(c * e * 4)] for c, e in shapes])
    per_byte, per_tensor = {}, {}
    for name in OPTIMIZER_BYTES:
        rhs = np.array([_median_seconds(make_optimizer(name, ps, 1e-3).step, sync, repeats,
                                        warmup, dist) for ps in sets])
        tensor, byte = np.linalg.solve(lhs, rhs)
        if byte <= 0 or tensor < 0:  # noise: the large step alone prices the bytes
            tensor, byte = 0.0, rhs[0] / lhs[0, 1]
        per_byte[name], per_tensor[name] = float(byte), float(tensor)
    return per_byte, per_tensor


def _comm_cpu_share(torch: Any, dist: Any, dev: Any, sync: Callable[[], None], world: int,
                    rank: int, repeats: int, warmup: int) -> float | None:
    """The CPU a point-to-point transfer takes on each end, per second it is in flight:
    the process's CPU seconds (every thread: gloo's transfer threads and the kernel's
    copies on their behalf) over the wall seconds of :data:`CPU_GROUPS` messages of
    :data:`CPU_MESSAGE` bytes, each waited for before the next is posted (the time in
    flight the simulator gives each), the median over ``warmup + repeats`` rounds; or
    ``None`` for a rank without a partner (the last of an odd number). Ranks pair up
    (``2j`` sends to ``2j + 1``).

    While the ranks compute on every core, that CPU is taken from their computation. A
    direct count: timing products with and without messages beside them (as
    ``benchmarks/p2p_cpu_cost.py`` does) measures the same loss, but as a small difference
    of two noisy times (0.2 to 4.8 across measurements here). On a GPU the transfers run
    on the copy engines and NCCL's kernels: the host CPU a process spends is no loss of
    the device's compute, so :func:`_overheads` measures it on CPU devices alone."""
    import statistics

    partner = rank + 1 if rank % 2 == 0 else rank - 1
    paired = partner < world
    buf = torch.zeros(CPU_MESSAGE // 4, device=dev)

    def post() -> Any:
        return dist.isend(buf, partner) if rank % 2 == 0 else dist.irecv(buf, partner)

    shares = []
    for it in range(warmup + max(repeats, 5)):
        dist.barrier()
        if not paired:
            continue
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(CPU_GROUPS):
            post().wait()
        sync()
        wall = time.perf_counter() - t0
        if it >= warmup:
            shares.append((time.process_time() - c0) / max(wall, 1e-9))
    return float(statistics.median(shares)) if paired else None


def host_sync_point(rounds: list[tuple[float, float, float, float]], pieces: int
                    ) -> list[float]:
    """``[compute seconds, extra seconds]`` from rounds of ``(one sync, a sync after each
    piece, the syncs back to back, the computation alone)`` seconds (:func:`_host_sync`):
    a piece's computing time, and what each sync after one costs beyond its own time,
    ``(each - one) / (pieces - 1) - back_to_back / pieces``, both as
    :func:`typical_seconds` over the rounds (the extra at least 0). O(rounds log rounds).

    Examples
    --------
    >>> host_sync_point([(10.0, 16.0, 2.0, 8.0)] * 3, 4)
    [2.0, 1.5]
    """
    extra = [(each - one) / (pieces - 1) - b2b / pieces for one, each, b2b, _ in rounds]
    return [typical_seconds([r[3] / pieces for r in rounds]),
            max(typical_seconds(extra), 0.0)]


def _host_sync(torch: Any, dist: Any, dev: Any, sync: Callable[[], None], world: int,
               repeats: int, warmup: int) -> list[list[float]]:
    """What a collective that every rank waits for costs beyond its own time when it
    follows a computation, by the computation's length: ``[[compute seconds, extra
    seconds], ...]`` for three computations (the forward of the smaller blocks of
    :data:`DT_SIZES`, their forward and backward, and the larger blocks' forward and
    backward: about 0.5, 1.5 and 10 ms here).

    Each round times :data:`SYNC_PIECES` pieces of the computation with one
    all-gather of :data:`SYNC_BYTES` at the end, the same with an all-gather after every
    piece, the all-gathers back to back, and the computation alone
    (:func:`host_sync_point`). The first includes the wait for the slower rank once; the
    second once per piece, and each rank that waits for its partner is woken when the
    partner arrives: on this machine's virtual CPUs 0.1-0.2 ms beyond the all-gather's
    own 0.3-0.6 ms after 0.1-0.4 ms of computing, 0.7 ms after 1.5-3 ms, and 1.4-1.5 ms
    after 5-18 ms, whatever the bytes (64 KiB or 1 MiB). The sum of a computation's
    times and the collective's (with the busy slowdown, itself measured with one wait at
    the end) misses it. O(rounds) runs of the computations."""
    torch.manual_seed(0)
    small, large = _blocks(*DT_SIZES[0]).to(dev), _blocks(*DT_SIZES[1]).to(dev)
    x_small = torch.ones(*DT_SIZES[0], device=dev)
    x_large = torch.ones(*DT_SIZES[1], device=dev)
    full = torch.ones(SYNC_BYTES // 4, device=dev)
    part = torch.ones(full.numel() // world, device=dev)

    def forward() -> None:
        with torch.no_grad():
            small(x_small)

    def step(blocks: Any, x: Any) -> Callable[[], None]:
        def run() -> None:
            blocks(x).sum().backward()
            blocks.zero_grad(set_to_none=True)
        return run

    def gather() -> None:
        dist.all_gather_into_tensor(full, part)

    def pieces(piece: Callable[[], None] | None, after_each: bool, at_end: bool
               ) -> float:
        """Seconds of SYNC_PIECES pieces, an all-gather after each and/or at the end."""
        def run() -> None:
            for _ in range(SYNC_PIECES):
                if piece is not None:
                    piece()
                if after_each:
                    gather()
            if at_end:
                gather()
        return _median_seconds(run, sync, 1, 0, dist)

    points = []
    for piece in (forward, step(small, x_small), step(large, x_large)):
        rounds = []
        for it in range(warmup + max(repeats, SYNC_ROUNDS)):
            row = (pieces(piece, False, True), pieces(piece, True, False),
                   pieces(None, True, False), pieces(piece, False, False))
            if it >= warmup:
                rounds.append(row)
        points.append(host_sync_point(rounds, SYNC_PIECES))
    dist.barrier()
    return sorted(points)
