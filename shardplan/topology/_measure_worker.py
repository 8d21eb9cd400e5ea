"""One rank of ``shardplan topology measure`` (runs in a spawned process; imports torch).

The parent (:mod:`shardplan.topology._measure`) starts one process per rank with
:func:`run`. Everything a rank has to say goes to files in the run's temporary directory:
``rank{r}.json`` (its round-trip times, written atomically), ``rank{r}.err`` (one JSON line:
when and why it failed) and ``rank{r}.log`` (its redirected stdout/stderr, so that torch's
warnings never reach the user's terminal).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import numpy as np

__all__ = ["dtensor_rates", "fsdp_gather_overhead", "host_sync_point", "run", "slowdown_ratios",
           "typical_seconds"]

#: Tiny layer blocks per timed run, and graph operators per block (the per-operator
#: overheads).
BLOCKS = 4
BLOCK_OPS = 7
#: FSDP units of the per-gather overhead's model.
UNITS = 4
#: Features of the wide FSDP units (1 MiB of parameters each), for the per-byte cost (at
#: 256 KiB the cost per byte was lost in the noise: 0 to 1.9 ns across four measurements).
FSDP_WIDE = 512
#: Micro-batches of the pipelining per-action overhead's schedule.
PIPE_MICROBATCHES = 8
#: Collective calls timed one after another per measurement (see :func:`_collectives`).
BACK_TO_BACK = 4
#: Timed measurements of a message or collective at least (whatever ``repeats`` says):
#: enough for :func:`typical_seconds` to drop the slowest and the fastest.
COMM_SAMPLES = 10
#: Share of the timings :func:`typical_seconds` drops at each end.
TRIM = 0.1
#: Forward and backward passes of the larger blocks per busy-slowdown kernel, and rounds.
BUSY_STEPS = 2
BUSY_ROUNDS = 15
#: ``(samples, positions, features)`` of the two programs of :func:`_dtensor_program`.
DT_SIZES = ((4, 4, 16), (8, 32, 128))
#: Messages per round, and their bytes, of the CPU share of transfers.
CPU_GROUPS = 8
CPU_MESSAGE = 1 << 20
#: Computations per run, rounds and the all-gather's bytes of :func:`_host_sync`.
SYNC_PIECES = 4
SYNC_ROUNDS = 10
SYNC_BYTES = 1 << 16


def typical_seconds(times: Any) -> float:
    """What a transfer or collective typically costs inside a training step: the mean of
    ``times`` without the :data:`TRIM` share of the slowest and of the fastest
    (``scipy.stats.trim_mean``; all of them below 10). A step adds up many of them, so the
    mean is what it pays, not the median: gloo's all-reduce of 64 KiB takes 0.3 ms in
    most calls here and about 1.8 ms in a quarter of them (the median of five read 0.34 ms
    in one measurement and 1.9 ms in the next), and the median hides the slow quarter;
    trimming keeps one preempted call from setting the figure. O(n log n).

    Examples
    --------
    >>> round(typical_seconds([0.3, 0.3, 0.3, 1.8]), 3)  # the median would say 0.3
    0.675
    >>> round(typical_seconds([1.0] * 9 + [50.0]), 3)  # one preempted call of ten dropped
    1.0
    """
    from scipy.stats import trim_mean

    values = np.asarray(times, dtype=np.float64).reshape(-1)
    if values.size == 0:
        raise ValueError("no timings")
    return float(trim_mean(values, TRIM))


def _write_json(path: str, data: Any) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _redirect_output(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _fault(cfg: dict[str, Any], rank: int, where: str) -> None:
    """Test hook: ``cfg["fault"] = [action, rank, where]`` misbehaves on purpose."""
    fault = cfg.get("fault")
    if not fault or int(fault[1]) != rank or fault[2] != where:
        return
    action = fault[0]
    if action == "raise":
        raise RuntimeError(f"injected failure on rank {rank}")
    if action == "exit":
        os._exit(3)
    if action == "hang":
        while True:
            time.sleep(3600)


def _measure(rank: int, world: int, cfg: dict[str, Any], tmpdir: str) -> dict[str, Any]:
    os.environ["OMP_NUM_THREADS"] = "1"
    # Every rank is on this host: talk over loopback (gloo otherwise resolves the host name).
    if sys.platform.startswith("linux") and os.path.exists("/sys/class/net/lo"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    _fault(cfg, rank, "start")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    backend = cfg["backend"]
    cuda_ok = torch.cuda.is_available() and torch.cuda.device_count() >= world
    if backend == "auto":
        backend = "nccl" if cuda_ok and dist.is_nccl_available() else "gloo"
    if backend == "nccl" and not cuda_ok:
        raise RuntimeError(f"the nccl backend needs {world} CUDA devices, found "
                           f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}")
    if backend == "nccl":
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
        props = torch.cuda.get_device_properties(rank)
        device = {"kind": "cuda", "name": props.name, "memory_bytes": int(props.total_memory)}

        def sync() -> None:
            torch.cuda.synchronize(dev)
    else:
        dev = torch.device("cpu")
        device = {"kind": "cpu", "name": "cpu"}

        def sync() -> None:
            pass

    store = dist.FileStore(os.path.join(tmpdir, "store"), world)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=float(cfg["timeout"])))
    _fault(cfg, rank, "measure")
    device["memory_bandwidth"] = _memory_bandwidth(torch, dist, dev, sync)
    sizes = [int(s) for s in cfg["sizes"]]
    repeats, warmup = max(int(cfg["repeats"]), COMM_SAMPLES), int(cfg["warmup"])
    buffers = {s: torch.zeros(s, dtype=torch.uint8, device=dev) for s in sizes}
    rtt: dict[str, list[list[float]]] = {}
    for i in range(world):
        for j in range(world):
            if i == j:
                continue
            dist.barrier()  # one pair at a time: the others wait here
            if rank not in (i, j):
                continue
            peer = j if rank == i else i
            per_size = []
            for s in sizes:
                buf = buffers[s]
                times = []
                for it in range(warmup + repeats):
                    t0 = time.perf_counter()
                    if rank == i:  # ping, then wait for the pong
                        dist.send(buf, peer)
                        dist.recv(buf, peer)
                    else:
                        dist.recv(buf, peer)
                        dist.send(buf, peer)
                    sync()
                    if it >= warmup:
                        times.append(time.perf_counter() - t0)
                per_size.append(times)
            if rank == i:
                rtt[str(j)] = per_size
    dist.barrier()
    collectives = _collectives(rank, world, cfg, dev, sync) if cfg.get("collectives") else {}
    if cfg.get("overheads"):
        device.update(_overheads(rank, world, cfg, dev, sync))
    return {"rank": rank, "backend": backend, "device": device, "host": os.uname().nodename,
            "rtt": rtt, "collectives": collectives}


def _memory_bandwidth(torch: Any, dist: Any, dev: Any, sync: Callable[[], None],
                      nbytes: int = 1 << 26, repeats: int = 5) -> float:
    """Bytes per second this process streams through memory: the median of ``repeats``
    copies of ``nbytes`` (each reads and writes them), every rank copying at once, as
    they share the memory bus in training."""
    import statistics

    src = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync()
    times = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        dst.copy_(src)
        sync()
        times.append(time.perf_counter() - t0)
    return 2.0 * nbytes / statistics.median(times)


def _collectives(rank: int, world: int, cfg: dict[str, Any], dev: Any,
                 sync: Any) -> dict[str, dict[str, list[list[float]]]]:
    """Typical seconds (:func:`typical_seconds`) of all-reduce, all-gather and
    reduce-scatter of each size (the whole tensor: the all-gather's output, the
    reduce-scatter's input) over the first g ranks, for g = 2..world, over ``repeats`` timed
    measurements (at least :data:`COMM_SAMPLES`); every rank takes part in creating
    the groups, ranks outside one wait at the barriers. A barrier starts the ranks
    together, then each runs :data:`BACK_TO_BACK` calls one after another, as training
    issues its collectives (no barrier between them); rank 0's time until the last
    returns, per call, is one measurement. Here gloo's all-reduce of 1 MiB takes 0.7 ms
    with a barrier before every call and 2 ms per call back to back (4 MiB: 3.1 and
    3.6-4.1 ms; 64 and 128 KiB about equal): ``benchmarks/collective_back_to_back.py``."""
    import torch
    import torch.distributed as dist

    sizes = [int(s) for s in cfg["collective_sizes"]]
    repeats, warmup = max(int(cfg["repeats"]), COMM_SAMPLES), int(cfg["warmup"])
    out: dict[str, dict[str, list[list[float]]]] = {"allreduce": {}, "allgather": {},
                                                     "reducescatter": {}}
    for g in range(2, world + 1):
        group = dist.new_group(list(range(g)))
        rows: dict[str, list[list[float]]] = {k: [] for k in out}
        for nbytes in sizes:
            n = max(g, nbytes // 4 // g * g)  # float32 elements, a multiple of g
            full = torch.ones(n, dtype=torch.float32, device=dev)
            part = torch.ones(n // g, dtype=torch.float32, device=dev)
            ops: dict[str, Callable[..., Any]] = {
                "allreduce": lambda full=full, grp=group: dist.all_reduce(full, group=grp),
                "allgather": lambda full=full, part=part, grp=group:
                    dist.all_gather_into_tensor(full, part, group=grp),
                "reducescatter": lambda full=full, part=part, grp=group:
                    dist.reduce_scatter_tensor(part, full, group=grp)}
            for kind, op in ops.items():
                times = []
                for it in range(warmup + repeats):
                    dist.barrier()
                    if rank >= g:
                        continue
                    t0 = time.perf_counter()
                    for _ in range(BACK_TO_BACK):
                        op()
                    sync()
                    if it >= warmup:
                        times.append((time.perf_counter() - t0) / BACK_TO_BACK)
                if rank == 0:
                    rows[kind].append([float(n * 4), typical_seconds(times)])
        for kind in out:
            out[kind][str(g)] = rows[kind]
    dist.barrier()
    return out


def _median_seconds(fn: Callable[[], Any], sync: Callable[[], None], repeats: int,
                    warmup: int, dist: Any, active: bool = True) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls after ``warmup``, every rank
    starting each call together (a barrier first); ranks with ``active`` False only join
    the barriers (0.0)."""
    import statistics

    times = []
    for it in range(warmup + repeats):
        dist.barrier()
        if not active:
            continue
        t0 = time.perf_counter()
        fn()
        sync()
        if it >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) if times else 0.0


def _overheads(rank: int, world: int, cfg: dict[str, Any], dev: Any,
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
      (:func:`_dtensor_reshard`; :func:`shardplan.topology._measure.measure` turns it into
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
    from shardplan.capture._export import graph_ops
    from shardplan.runtime._split import split_program

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
    (:func:`shardplan.capture._export.graph_ops`, the nodes the simulator charges) and
    their output bytes give both rates (:func:`dtensor_rates`); each extra is the median
    over rounds that time both programs back to back. The runtime's interpreter
    (layouts looked up per operator, tensors wrapped) and DTensor's dispatch and sharding
    propagation are per operator; what grows with the tensors (copies DTensor's operators
    make that the plain ones avoid) is per byte: on this machine the per-operator extra
    of a 4-layer transformer grew from 36 to 48 us (forward) and 46 to 66 us (backward)
    between 64 KB and 17.7 MB of outputs per micro-batch, 0.06 and 0.1 ns per byte. Bare
    DTensor operators of simple layers in a Python loop (the measurement before these)
    measured a third of what a transformer's program pays per operator."""
    from shardplan.capture._export import tensor_bytes
    from shardplan.runtime._dtensor import ShardedProgram

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


def _optimizer_steps(torch: Any, dist: Any, dev: Any, sync: Callable[[], None],
                     repeats: int, warmup: int) -> tuple[dict[str, float], dict[str, float]]:
    """``({optimizer: seconds per parameter byte}, {optimizer: seconds per parameter
    tensor})`` of one step of each optimizer the settings name
    (:data:`shardplan.cost._formulas.OPTIMIZER_BYTES`' keys), built as the runtime builds it
    (:func:`shardplan.runtime._worker.make_optimizer`: torch's default implementation for
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
    from shardplan.runtime._worker import make_optimizer

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


def run(rank: int, world: int, cfg: dict[str, Any], tmpdir: str) -> None:
    """Entry point of one spawned rank: measure, write ``rank{r}.json``, exit.

    Exits through ``os._exit`` so that no interpreter teardown (process-group destructors,
    atexit hooks) can hang the rank after its result is written.
    """
    _redirect_output(os.path.join(tmpdir, f"rank{rank}.log"))
    try:
        result = _measure(rank, world, cfg, tmpdir)
        _write_json(os.path.join(tmpdir, f"rank{rank}.json"), result)
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the parent
        traceback.print_exc()
        msg = " ".join(f"{type(exc).__name__}: {exc}".split())
        try:
            _write_json(os.path.join(tmpdir, f"rank{rank}.err"),
                        {"time": time.time(), "error": msg[:500]})
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
