"""Measured topologies: ping-pong between every ordered pair of N local processes."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from shardplan._ranks import read_rank_errors, run_ranks, settle
from shardplan.errors import ShardplanError
from shardplan.ir.topology import Device, Topology
from shardplan.measure._timing import typical_seconds
from shardplan.topology._devices import (
    DEVICE_PRESETS,
    check_count,
    check_positive,
    generator_meta,
    resolve_device,
)

__all__ = ["BACKENDS", "DEFAULT_SIZES", "fit_link", "measure", "reshard_overhead"]

BACKENDS = ("auto", "gloo", "nccl")
#: Message sizes (bytes): one tiny message for the latency, then 64 KiB to 16 MiB.
DEFAULT_SIZES: tuple[int, ...] = (4, 1 << 16, 1 << 20, 1 << 22, 1 << 24)
#: Collective sizes (bytes of the whole tensor): 64 KiB to 16 MiB.
DEFAULT_COLLECTIVE_SIZES: tuple[int, ...] = (1 << 16, 1 << 20, 1 << 22, 1 << 24)
#: Nominal peak of one CPU process (one core): about 3 GHz x two 8-wide fp32 FMA units x 2.
CPU_FLOPS = 1e11
_GRACE = 2.0  # seconds to let the other ranks report after one fails


def fit_link(sizes: Sequence[float], one_way: Sequence[float]) -> tuple[float, float]:
    """Bandwidth and latency of a link from one-way times at several message sizes.

    Parameters
    ----------
    sizes : sequence of float
        Message sizes in bytes (at least two distinct).
    one_way : sequence of float
        One-way seconds at each size (half the typical round trip).

    Returns
    -------
    (bandwidth, latency) : tuple of float
        ``latency`` = the one-way time of the smallest message; ``bandwidth`` = 1 / slope of
        the least-squares line ``t = a + s / B`` through all points. If noise makes the slope
        non-positive, ``B`` = largest size / its one-way time (a lower bound).

    Notes
    -----
    The least-squares fit is dominated by the large sizes, as a bandwidth estimate should be;
    its intercept is not used as the latency because it is noisy and can be negative.
    """
    s = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(one_way, dtype=np.float64)
    if s.size != t.size or s.size < 2 or np.unique(s).size < 2:
        raise ShardplanError("fitting a link needs one-way times at two or more sizes")
    latency = float(t[np.argmin(s)])
    slope = float(np.polyfit(s, t, 1)[0])
    big = int(np.argmax(s))
    bandwidth = 1.0 / slope if slope > 0 else float(s[big] / max(t[big], 1e-12))
    return bandwidth, max(latency, 0.0)


def reshard_overhead(measured: Sequence[float], bandwidth: np.ndarray,
                     latency: np.ndarray) -> float:
    """``dtensor_collective_overhead_seconds`` from a rank's ``dtensor_reshard_seconds``
    (``[seconds, bytes]``: one redistribution of the runtime's DTensor program, measured
    between computations, and the bytes each device received in it): what it cost beyond
    what a strategy's cost model charges for those bytes itself, the received bytes over
    the slowest link among the measured devices plus their largest latency (PaSE's
    ``default`` cost model prices a re-shard direction so; :mod:`shardplan.strategy.
    _cost_default`). At least 0; 0 for a malformed record. O(N^2).

    Examples
    --------
    >>> bw = np.array([[0.0, 2e9], [4e9, 0.0]])
    >>> lat = np.array([[0.0, 5e-5], [4e-5, 0.0]])
    >>> round(reshard_overhead([1.7e-3, 65536], bw, lat) * 1e6, 2)
    1617.23
    >>> reshard_overhead([1e-5, 65536], bw, lat), reshard_overhead("bad", bw, lat)
    (0.0, 0.0)
    """
    try:
        seconds, received = (float(x) for x in measured)
    except (TypeError, ValueError):
        return 0.0
    bw = np.asarray(bandwidth, dtype=np.float64)
    links = bw[~np.eye(bw.shape[0], dtype=bool) & (bw > 0)]
    slowest = float(links.min()) if links.size else float("inf")
    lat = float(np.max(latency)) if np.size(latency) else 0.0
    return max(seconds - received / slowest - lat, 0.0)


def _machine_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 16 * 2**30


def _read(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _run(nproc: int, cfg: dict[str, Any], timeout: float, tmp: str) -> list[dict[str, Any]]:
    """Start the ranks, wait for all of them (never longer than ``timeout``), read results."""
    from shardplan.measure import _worker

    run_ranks(_worker.run, lambda r: (r, nproc, cfg, tmp), nproc, timeout=timeout,
              what="topology measurement", name="shardplan-measure",
              failure=lambda procs, rank, deadline: _failure(procs, rank, tmp, deadline),
              hint="; allow more time or use fewer processes")
    results = []
    for r in range(nproc):
        res = _read(os.path.join(tmp, f"rank{r}.json"))
        if not isinstance(res, dict):
            raise ShardplanError(f"topology measurement: rank {r} finished without a result")
        results.append(res)
    return results


def _failure(procs: Sequence[Any], rank: int, tmp: str, deadline: float) -> str:
    """One line naming the rank that failed first and why."""
    settle(procs, tmp, deadline, _GRACE)
    errors = {r: (float(e.get("time", 0.0)), str(e.get("error", "")))
              for r, e in read_rank_errors(tmp, len(procs)).items()}
    # A rank that died without a word (killed, os._exit, crash) is the likely cause: its
    # peers only report the broken connection.
    silent = [r for r, p in enumerate(procs)
              if r not in errors and p.exitcode not in (0, None)]
    if silent:
        rank = rank if rank in silent else silent[0]
        text = (f"topology measurement failed: rank {rank} exited with code "
                f"{procs[rank].exitcode} without a message")
        if not os.path.exists(os.path.join(tmp, f"rank{rank}.log")):
            text += (" before it started (a script that calls measure() needs an "
                     "'if __name__ == \"__main__\":' guard: the ranks are spawned)")
        if errors:
            other = min(errors, key=lambda r: errors[r][0])
            text += f" (then rank {other}: {errors[other][1][:160]})"
        return text
    first = min(errors, key=lambda r: errors[r][0])
    return f"topology measurement failed on rank {first}: {errors[first][1]}"


def measure(nproc: int, *, backend: str = "auto", sizes: Sequence[int] = DEFAULT_SIZES,
            repeats: int = 10, warmup: int = 1, timeout: float = 120.0,
            device: str | None = None, memory_bytes: float | None = None,
            flops: float | None = None, name: str | None = None,
            collectives: bool = True,
            collective_sizes: Sequence[int] = DEFAULT_COLLECTIVE_SIZES,
            overheads: bool = True,
            _fault: Sequence[Any] | None = None) -> Topology:
    """Measure latency and bandwidth between N local processes with torch.distributed.

    Parameters
    ----------
    nproc : int
        N >= 2 processes (ranks), started with the ``spawn`` method; rank r is device r.
    backend : {"auto", "gloo", "nccl"}
        ``auto`` (default) is NCCL when there are N CUDA devices, else gloo on CPU.
    sizes : sequence of int
        Message sizes in bytes, at least two distinct (default 4 B, 64 KiB, 1, 4, 16 MiB).
    repeats, warmup : int
        Timed and untimed round trips per size and pair (defaults 10 and 1); messages and
        collectives are timed at least 10 times whatever ``repeats`` says (a trimmed mean
        of fewer keeps its outliers: one preempted round trip of three made a link's
        latency 1.3 ms instead of 0.05).
    timeout : float
        Hard limit in seconds on the whole run, process start included (default 120); also
        the process-group timeout of every blocking call.
    device : {"v100", "a100", "h100"}, optional
        Preset for the devices' memory and FLOP/s. Without it: CPU ranks get this machine's
        RAM split evenly across the N ranks and a nominal 1e11 FLOP/s (one core with two
        8-wide fp32 FMA units at about 3 GHz); CUDA ranks get their reported memory and the
        preset matching their name (V100/A100/H100), else 1e14 FLOP/s.
    memory_bytes, flops : float, optional
        Override the memory and FLOP/s of every device.
    name : str, optional
        Topology name (default ``measured-{backend}-{N}``).
    collectives : bool, default True
        Also time all-reduce, all-gather and reduce-scatter over the first g ranks, g = 2..N,
        at ``collective_sizes`` bytes (default 64 KiB, 1 MiB, 4 MiB, 16 MiB): the topology's
        ``collectives`` field, which the cost model and the simulator use instead of the
        ring over the point-to-point links (:mod:`shardplan.cost._collectives`).
    collective_sizes : sequence of int
    overheads : bool, default True
        Also measure the fixed costs a run pays beyond its operators' arithmetic and its
        messages' bytes, into every device's entry (without ``device``; see
        :mod:`shardplan.cost._overheads`, which charges them): ``op_overhead_seconds``
        (forward and backward seconds per operator of a tiny operator under autograd),
        ``dtensor_op_overhead_seconds`` and ``dtensor_op_seconds_per_byte`` (what running
        operators in the runtime's DTensor program adds, per operator and per byte of their
        outputs), ``dtensor_reshard_seconds`` (``[seconds, bytes]``: one redistribution
        of the runtime's DTensor program between computations, forward and backward, and
        the bytes each device received in it) and ``dtensor_collective_overhead_seconds``
        (what it cost beyond the bytes over the slowest link and a latency:
        :func:`reshard_overhead`),
        ``dtensor_step_overhead_seconds`` (what an optimizer step on DTensor
        parameters adds per layer), ``fsdp_gather_overhead_seconds`` (what an FSDP2
        unit's parameter all-gather costs beyond the bare all-gather; with
        ``fsdp_gather_seconds_per_byte``), ``fsdp_reduce_overhead_seconds`` and
        ``fsdp_reduce_seconds_per_byte`` (what its gradient reduction costs beyond the bare
        reduce-scatter),
        ``pipeline_action_overhead_seconds`` (what torch's pipelining schedule adds per
        forward or backward action),
        ``gradient_seconds_per_byte`` (the gradient handling
        around a step, per parameter byte), ``optimizer_seconds_per_byte`` and
        ``optimizer_seconds_per_tensor`` (one step of each optimizer, per parameter byte
        and per parameter tensor), ``comm_cpu_share`` (what a point-to-point transfer takes
        from the compute of its ends, per second in flight; CPU devices) and
        ``busy_slowdown`` (``{g: factor}``: how much slower a process computes while g
        ranks compute at once than alone; rank 0's measurement, given to every device of
        this host). A few seconds.

    Returns
    -------
    Topology
        Devices ``rank0..``; ``bandwidth[i][j]`` and ``latency[i][j]`` as measured with i
        initiating the ping-pong. ``meta["measurement"]`` keeps the backend, sizes, repeats,
        wall-clock seconds and the typical one-way time of every pair at every size.

    Raises
    ------
    ShardplanError
        Bad options; any rank failing (the other ranks are killed and the error of the first
        rank to fail is reported); the run exceeding ``timeout``.

    Notes
    -----
    Paper 000 section 3.1 provides "a script that measures GPU-to-GPU communication speed"
    with NCCL and feeds the measurements to the partitioners; it gives no protocol, so ours
    is: all ranks join a process group (``FileStore`` in a temporary directory, no ports),
    then for every ordered pair (i, j) in turn, the others waiting at a barrier so that pairs
    never overlap, i sends j a message of each size with a blocking ``send`` and j sends it
    back, ``warmup + repeats`` times. The one-way time of a size is half the typical round
    trip (:func:`~shardplan.measure._timing.typical_seconds`: a trimmed mean,
    because a step pays the mean of its messages); :func:`fit_link` turns the sizes' times
    into (bandwidth, latency). Both directions of a pair are measured (i initiating, then
    j), so the matrices need not be symmetric.
    O(N^2 x len(sizes) x repeats) messages. Only this function imports torch, in the ranks.

    The ranks are started with the ``spawn`` method, so a script calling this function must
    guard its top level with ``if __name__ == "__main__":`` (the error says so otherwise).
    """
    n = check_count("nproc", nproc, minimum=2)
    if backend not in BACKENDS:
        raise ShardplanError(f"unknown backend {backend!r} (choose from {', '.join(BACKENDS)})")
    try:
        size_list = sorted({check_count("message size", s) for s in sizes})
    except TypeError:
        raise ShardplanError(f"sizes must be a list of byte counts, got {sizes!r}") from None
    if len(size_list) < 2:
        raise ShardplanError("measure needs at least two distinct message sizes")
    reps = check_count("repeats", repeats)
    warm = check_count("warmup", warmup, minimum=0)
    limit = check_positive("timeout", timeout)
    if device is not None:
        resolve_device(device, memory_bytes, flops)  # validate early
    else:
        if memory_bytes is not None:
            check_positive("memory_bytes", memory_bytes)
        if flops is not None:
            check_positive("flops", flops)
    try:
        coll_sizes = sorted({check_count("collective size", s) for s in collective_sizes})
    except TypeError:
        raise ShardplanError(f"collective sizes must be byte counts, got "
                             f"{collective_sizes!r}") from None
    cfg = {"backend": backend, "sizes": size_list, "repeats": reps, "warmup": warm,
           "timeout": limit, "fault": list(_fault) if _fault else None,
           "collectives": bool(collectives), "collective_sizes": coll_sizes,
           "overheads": bool(overheads)}

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="shardplan-measure-") as tmp:
        results = _run(n, cfg, limit, tmp)
    wall = time.monotonic() - t0

    used = results[0]["backend"]
    one_way = np.zeros((len(size_list), n, n))
    bw = np.zeros((n, n))
    lat = np.zeros((n, n))
    for res in results:
        i = int(res["rank"])
        for key, per_size in res["rtt"].items():
            j = int(key)
            one_way[:, i, j] = [typical_seconds(ts) / 2 for ts in per_size]
            bw[i, j], lat[i, j] = fit_link(size_list, one_way[:, i, j].tolist())
    for res in results:  # a redistribution's cost beyond the bytes the model charges
        info = res.get("device", {})
        if "dtensor_reshard_seconds" in info:
            info["dtensor_collective_overhead_seconds"] = reshard_overhead(
                info["dtensor_reshard_seconds"], bw, lat)
    shared = results[0].get("device", {}).get("busy_slowdown")
    devices = tuple(_device(res, n, device, memory_bytes, flops, shared) for res in results)
    extra = {"collectives": results[0]["collectives"]} if collectives else {}
    return Topology(
        name=name or f"measured-{used}-{n}", devices=devices, bandwidth=bw, latency=lat,
        meta={**generator_meta("measure", nproc=n, backend=backend, sizes=size_list,
                               repeats=reps, warmup=warm),
              "measurement": {"backend": used, "host": results[0].get("host", ""),
                              "sizes": size_list, "repeats": reps,
                              "wall_seconds": round(wall, 3),
                              "one_way_seconds": one_way.tolist()}, **extra},
    )


#: Measured device fields copied into a topology's device entries (see ``overheads``).
OVERHEAD_FIELDS = ("op_overhead_seconds", "dtensor_op_overhead_seconds",
                   "dtensor_op_seconds_per_byte",
                   "dtensor_collective_overhead_seconds", "dtensor_reshard_seconds",
                   "dtensor_step_overhead_seconds", "fsdp_gather_overhead_seconds",
                   "fsdp_gather_seconds_per_byte", "fsdp_reduce_overhead_seconds",
                   "fsdp_reduce_seconds_per_byte",
                   "gradient_seconds_per_byte", "pipeline_action_overhead_seconds",
                   "optimizer_seconds_per_byte", "optimizer_seconds_per_tensor",
                   "comm_cpu_share", "host_sync_seconds")


def _device(res: dict[str, Any], n: int, preset: str | None, memory_bytes: float | None,
            flops: float | None, busy_slowdown: Any = None) -> Device:
    info = res.get("device", {})
    rank = int(res["rank"])
    extra = {"host": res.get("host") or socket.gethostname(), "backend": res["backend"],
             "device": info.get("name", "cpu")}
    if preset is not None:
        kind, mem, fl = resolve_device(preset, memory_bytes, flops)
        extra["type"] = kind
    elif info.get("kind") == "cuda":
        gpu = str(info.get("name", "")).lower()
        match = next((k for k in DEVICE_PRESETS if k in gpu), None)
        mem = memory_bytes if memory_bytes is not None else int(info["memory_bytes"])
        fl = flops if flops is not None else (DEVICE_PRESETS[match].flops if match else 1e14)
    else:
        mem = memory_bytes if memory_bytes is not None else _machine_memory() // n
        fl = flops if flops is not None else CPU_FLOPS
    if preset is None and info.get("memory_bandwidth"):  # measured, for the optimizer step
        extra["memory_bandwidth"] = float(info["memory_bandwidth"])  # and the roofline
    if preset is None:  # measured overheads (a preset's devices are not these processes)
        for key in OVERHEAD_FIELDS:
            if key in info:
                extra[key] = info[key]
        if busy_slowdown:
            extra["busy_slowdown"] = {str(g): float(v) for g, v in busy_slowdown.items()}
    return Device(name=f"rank{rank}", memory_bytes=mem, flops=fl, extra=extra)
