"""One rank of ``shardplan topology measure`` (runs in a spawned process; imports torch).

The parent (:mod:`shardplan.measure._measure`) starts one process per rank with
:func:`run`. Everything a rank has to say goes to files in the run's temporary directory:
``rank{r}.json`` (its round-trip times, written atomically), ``rank{r}.err`` (one JSON line:
when and why it failed) and ``rank{r}.log`` (its redirected stdout/stderr, so that torch's
warnings never reach the user's terminal).

Its measurements: messages and collectives here; the fixed costs of a training run in
:mod:`shardplan.measure._overheads`, those of the runtime's programs (DTensor, pipelining) in
:mod:`shardplan.measure._programs`; shared sizes and timing in :mod:`shardplan.measure._timing`.
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

from shardplan.measure._overheads import overheads as _overheads
from shardplan.measure._timing import BACK_TO_BACK, COMM_SAMPLES, typical_seconds

__all__ = ["run"]


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
