"""Fixed costs a run pays beyond its operators' arithmetic and its messages' bytes.

``topology measure`` records them in every device's entry (measured on the machine, with
every rank busy at once, see :mod:`shardplan.measure._worker`); topologies without
them (the builders, GPU presets, files written before) price every overhead at 0 and every
slowdown at 1, exactly as before. Fields of a device entry:

- ``op_overhead_seconds``: ``[forward, backward]`` seconds of dispatch and autograd
  bookkeeping per operator (a tiny operator's time). Charged to every node whose time is
  not measured (a FLOP or roofline time has no dispatch in it; a profiled time has).
- ``dtensor_op_overhead_seconds``: ``[forward, backward]`` seconds per operator that
  running it on DTensors adds: charged per node of plans that run as DTensor programs
  (PaSE strategies and hybrids).
- ``dtensor_op_seconds_per_byte``: ``[forward, backward]`` seconds per byte of an
  operator's output (the part a device holds) that running it on DTensors adds beyond the
  per-operator figure: charged with it.
- ``dtensor_reshard_seconds``: ``[seconds, bytes]``: one redistribution of the runtime's
  DTensor program measured between computations (forward and backward together), and the
  bytes each device received in it; ``topology measure`` turns it into
- ``dtensor_collective_overhead_seconds``: what such a redistribution costs beyond the
  bytes over the slowest link and a latency (what a strategy's cost model charges for a
  re-shard direction itself): charged per collective of a strategy stage (each direction of
  a re-shard, each reduction of a split layer, each gather of an output), by PaSE's
  ``default`` cost model and the simulator alike.
- ``dtensor_step_overhead_seconds``: extra seconds per parameter-holding layer of an
  optimizer step on DTensor parameters: charged per node holding parameters to the
  optimizer step of plans whose parameters are DTensors (strategies, hybrids, FSDP).
- ``fsdp_gather_overhead_seconds``: seconds an FSDP unit's parameter all-gather costs beyond
  the bare all-gather: charged per unit and micro-batch, forward and backward, under
  ``gradient_sync: sharded``.
- ``fsdp_gather_seconds_per_byte``: what an FSDP unit's all-gather costs beyond the bare
  collective per byte of the unit's parameters (copying the shards in and the gathered
  parameters out): charged with ``fsdp_gather_overhead_seconds``, per unit gathered.
- ``fsdp_reduce_overhead_seconds``, ``fsdp_reduce_seconds_per_byte``: what an FSDP unit's
  gradient reduction costs beyond the bare reduce-scatter (FSDP's copies in and out, the
  scaling, the sharded gradients' accumulation), fixed and per byte of the unit's
  parameters: charged once per unit and iteration (the runtime syncs gradients in the last
  micro-batch only), before the optimizer step.
- ``gradient_seconds_per_byte``: ``[one replica, replicas]`` seconds per parameter byte of
  the runtime's gradient handling before the optimizer step (scaling; with replicas also
  flattening for the all-reduce and copying back), charged once per iteration.
- ``optimizer_seconds_per_byte``, ``optimizer_seconds_per_tensor``: ``{optimizer:
  seconds}`` per parameter byte and per parameter tensor of one step of each optimizer as
  the runtime builds it; where the byte rate is present for the settings' optimizer, the
  two replace the roofline's :func:`~shardplan.cost._formulas.optimizer_seconds` (torch's
  per-tensor Adam on a CPU launches several kernels per tensor and makes several passes
  over the state).
- ``comm_cpu_share``: the part of a message's time in flight that its two ends' computation
  loses while they compute (gloo on a CPU host: the transfers run on the computing cores);
  the simulator charges it (:mod:`shardplan.simulate._messages`), the static
  stage-time views leave it out.
- ``pipeline_action_overhead_seconds``: seconds torch's pipelining schedule adds per forward
  or backward action: charged per micro-batch to plans the pipeline runtime runs (not DDP,
  FSDP or one-stage strategies).
- ``busy_slowdown``: ``{g: factor}``: how much longer a process computes while g ranks of
  the host compute at once than alone (the profile of ``capture --profile`` is taken
  alone); every compute time of a plan using g devices is multiplied by it. The fixed costs
  above were measured with all N ranks of the measurement busy: their readers divide the
  factor of N out (an overhead measured on 4 ranks sharing 2 cores already ran 2-3x
  slower, and was charged that again).

Everything here is O(n) or O(devices).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from shardplan.ir import Graph, Topology

__all__ = ["busy_slowdown", "charge_run_overheads", "comm_cpu_share",
           "dtensor_collective_overhead", "dtensor_op_overhead", "dtensor_op_seconds_per_byte",
           "dtensor_step_overhead", "fsdp_gather_overhead", "fsdp_unit_chunks", "fsdp_unit_keys",
           "host_collectives", "host_sync_wait",
           "gradient_seconds_per_byte", "op_overhead", "optimizer_seconds_per_byte",
           "optimizer_seconds_per_tensor", "pipeline_action_overhead"]


def _pair(device: Any, key: str) -> tuple[float, float]:
    value = device.extra.get(key)
    if value is None:
        return 0.0, 0.0
    try:
        f, b = (float(v) for v in value)
    except (TypeError, ValueError):
        return 0.0, 0.0
    return max(f, 0.0), max(b, 0.0)


def _measured_busy(topology: Topology) -> float:
    """The busy slowdown the fixed costs were measured under: ``topology measure`` times
    them with all of its ranks computing at once, so each already holds
    :func:`busy_slowdown` of all the topology's devices; readers divide it out, as every
    charge is multiplied by the slowdown of the plan's own devices
    (:func:`charge_run_overheads`). 1 without the measurement."""
    return busy_slowdown(topology, range(topology.num_devices))


def _largest(topology: Topology | None, key: str, devices: Sequence[int]) -> float:
    """The largest of ``devices``' scalar ``key`` (every rank waits for the slowest), alone
    (:func:`_measured_busy`); 0 where absent."""
    if topology is None:
        return 0.0
    return max([0.0, *(float(topology.devices[int(d)].extra.get(key) or 0.0)
                       for d in devices)]) / _measured_busy(topology)


def _median_pair(topology: Topology | None, key: str,
                 devices: Sequence[int] | None = None) -> tuple[float, float]:
    if topology is None or topology.num_devices == 0:
        return 0.0, 0.0
    ids = range(topology.num_devices) if devices is None else devices
    pairs = np.array([_pair(topology.devices[int(d)], key) for d in ids], dtype=np.float64)
    if pairs.size == 0:
        return 0.0, 0.0
    f, b = np.median(pairs, axis=0) / _measured_busy(topology)
    return float(f), float(b)


def op_overhead(topology: Topology | None,
                devices: Sequence[int] | None = None) -> tuple[float, float]:
    """``(forward, backward)`` seconds of per-operator overhead: the median over
    ``devices`` (default all) of their ``op_overhead_seconds``; ``(0, 0)`` where absent.

    Examples
    --------
    >>> from shardplan.ir import Device
    >>> t = Topology(name="t", devices=(Device("a", 1e9, 1e12,
    ...              {"op_overhead_seconds": [1e-5, 2e-5]}),), bandwidth=[[0]], latency=[[0]])
    >>> op_overhead(t), op_overhead(None)
    ((1e-05, 2e-05), (0.0, 0.0))
    """
    return _median_pair(topology, "op_overhead_seconds", devices)


def dtensor_op_overhead(topology: Topology | None,
                        devices: Sequence[int] | None = None) -> tuple[float, float]:
    """``(forward, backward)`` extra seconds per operator run on DTensors over ``devices``
    (the median of their ``dtensor_op_overhead_seconds``); ``(0, 0)`` where absent."""
    return _median_pair(topology, "dtensor_op_overhead_seconds", devices)


def dtensor_op_seconds_per_byte(topology: Topology | None,
                                devices: Sequence[int] | None = None) -> tuple[float, float]:
    """``(forward, backward)`` extra seconds per byte of an operator's output run on
    DTensors over ``devices`` (the median of their ``dtensor_op_seconds_per_byte``);
    ``(0, 0)`` where absent."""
    return _median_pair(topology, "dtensor_op_seconds_per_byte", devices)


def dtensor_collective_overhead(topology: Topology | None, devices: Sequence[int]) -> float:
    """Extra seconds per collective of a DTensor program over ``devices`` beyond what the
    cost model charges for its bytes (the link or the curve, and a latency): the largest of
    their ``dtensor_collective_overhead_seconds`` (measured on a redistribution of the
    runtime's program between computations:
    :func:`shardplan.measure._measure.reshard_overhead`); 0 where absent (a GPU preset).
    Charged per all-reduce, re-shard direction and output gather of a strategy stage by
    PaSE's ``default`` cost model and the simulator alike."""
    return _largest(topology, "dtensor_collective_overhead_seconds", devices)


def dtensor_step_overhead(topology: Topology | None, devices: Sequence[int]) -> float:
    """Extra optimizer-step seconds per parameter-holding layer on DTensor parameters over
    ``devices``: the largest of their ``dtensor_step_overhead_seconds``; 0 where absent."""
    return _largest(topology, "dtensor_step_overhead_seconds", devices)


def fsdp_gather_overhead(topology: Topology | None, devices: Sequence[int]) -> float:
    """Extra seconds per FSDP unit all-gather over ``devices``: the largest of their
    ``fsdp_gather_overhead_seconds`` (every rank waits for the slowest); 0 where absent."""
    return _largest(topology, "fsdp_gather_overhead_seconds", devices)


def busy_slowdown(topology: Topology | None, devices: Sequence[int]) -> float:
    """How much longer compute takes while the ``g = len(set(devices))`` devices of a plan
    compute at once than alone: the largest ``busy_slowdown[g]`` of those devices, at least
    1 (a measured ratio below 1 is noise: running more processes does not speed one up);
    1 where not measured or for one device.

    Examples
    --------
    >>> from shardplan.ir import Device
    >>> slow = {"busy_slowdown": {"1": 1.0, "2": 1.9}}
    >>> devs = (Device("a", 1e9, 1e12, slow), Device("b", 1e9, 1e12, slow))
    >>> t = Topology(name="t", devices=devs, bandwidth=[[0, 1], [1, 0]],
    ...              latency=[[0, 0], [0, 0]])
    >>> busy_slowdown(t, [0, 1]), busy_slowdown(t, [0])
    (1.9, 1.0)
    """
    used = sorted({int(d) for d in devices})
    if topology is None or len(used) < 2:
        return 1.0
    key = str(len(used))
    factor = 1.0
    for d in used:
        table = topology.devices[d].extra.get("busy_slowdown")
        if isinstance(table, dict) and key in table:
            try:
                factor = max(factor, float(table[key]))
            except (TypeError, ValueError):
                continue
    return factor


_INDEXED = re.compile(r"^(.*?)(?:^|\.)(\d+)(?:\.|$)")


def fsdp_unit_keys(graph: Graph) -> list[str] | None:
    """The FSDP unit of every node, as the runtime wraps a model: the items of its first
    module list of more than one item (a transformer's blocks: module paths
    ``prefix.<i>.*``), else every top-level child module holding parameters; the root
    (key ``""``) holds the rest. None when the graph's nodes carry no module names with
    parameters in two or more units (a generated graph): then units are cut by size.

    A graph names modules but not their types, so which indexed family is a module list is
    our guess: the only one; with several (ResNet's ``layer1.0`` ... ``layer4.2``, which
    are ``Sequential`` containers) the top-level children are the units, as the runtime
    wraps them.

    Examples
    --------
    >>> g = Graph.from_arrays(name="g", fwd_flops=[1.0] * 4, src=[0, 1, 2], dst=[1, 2, 3],
    ...                       param_bytes=[4, 4, 4, 4],
    ...                       modules=["emb", "blocks.0.fc", "blocks.1.fc", "head"])
    >>> fsdp_unit_keys(g)
    ['', 'blocks.0', 'blocks.1', '']
    """
    mods = list(graph.modules)
    params = np.asarray(graph.param_bytes) > 0
    items: dict[str, set[str]] = {}
    for m in mods:
        hit = _INDEXED.match(m or "")
        if hit:
            items.setdefault(hit.group(1), set()).add(hit.group(2))
    lists = [p for p, idx in items.items() if len(idx) > 1]
    keys: list[str] = []
    if len(lists) == 1:  # one family of indexed blocks: a module list
        head = f"{lists[0]}." if lists[0] else ""
        for m in mods:
            m = m or ""
            rest = m[len(head):] if m.startswith(head) else None
            num = rest.split(".", 1)[0] if rest else ""
            keys.append(f"{head}{num}" if num.isdigit() else "")
    else:
        keys = [(m or "").split(".", 1)[0] for m in mods]
    if len({k for k, p in zip(keys, params, strict=True) if p and k}) < 2:
        return None
    return keys


def fsdp_unit_chunks(keys: Sequence[str], nodes: np.ndarray, fwd: np.ndarray,
                     bwd: np.ndarray, params: np.ndarray
                     ) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """One stage's FSDP all-gathers as the runtime issues them, as ``(bytes, end fraction)``
    segments of its forward and of its backward (what :mod:`shardplan.simulate` waits on).

    ``nodes`` are the stage's nodes in topological order and ``keys`` every node's unit
    (:func:`fsdp_unit_keys`). Forward: the root's parameters first (FSDP2 gathers them in
    the root's pre-forward), ending where the first other unit's first node starts; then
    each unit in order of its first node, ending at its last node; the last segment ends
    with the action. Backward: the units in reverse, each ending at its first node in
    reverse order, the root's not gathered again (FSDP2 keeps the root's parameters after
    the forward). O(n).
    """
    order = [int(v) for v in nodes]
    tf = float(np.sum(fwd[order])) or 1.0
    tb = float(np.sum(bwd[order])) or 1.0
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    size: dict[str, float] = {}
    for pos, v in enumerate(order):
        k = keys[v]
        if params[v] <= 0:
            continue
        size[k] = size.get(k, 0.0) + float(params[v])
        first.setdefault(k, pos)
        last[k] = pos
    cum_f = np.cumsum(fwd[order]) / tf if order else np.zeros(0)
    cum_b = np.cumsum(bwd[order[::-1]]) / tb if order else np.zeros(0)
    units = sorted((k for k in size if k), key=lambda k: first[k])
    ufwd: list[tuple[float, float]] = []
    if "" in size:
        start = first[units[0]] if units else len(order)
        ufwd.append((size[""], float(cum_f[start - 1]) if start > 0 else 0.0))
    ufwd += [(size[k], float(cum_f[last[k]])) for k in units]
    ubwd = [(size[k], float(cum_b[len(order) - 1 - first[k]])) for k in units[::-1]]
    if ufwd and not ubwd:  # the root alone: gathered again for the backward
        ubwd = [(ufwd[0][0], 1.0)]
    for seg in (ufwd, ubwd):
        if seg:
            seg[-1] = (seg[-1][0], 1.0)
    return ufwd, ubwd


def gradient_seconds_per_byte(topology: Topology | None, devices: Sequence[int],
                              replicated: bool) -> float:
    """Seconds per parameter byte of the runtime's gradient handling each iteration on
    ``devices`` (the largest of their ``gradient_seconds_per_byte``, the replicated or the
    one-replica figure); 0 where absent."""
    if topology is None:
        return 0.0
    which = 1 if replicated else 0
    return max([0.0, *(_pair(topology.devices[int(d)], "gradient_seconds_per_byte")[which]
                       for d in devices)]) / _measured_busy(topology)


def _device_values(topology: Topology | None, read: Any) -> np.ndarray:
    """``read(device.extra)`` of every device as a float, shape (D,): 0 where absent,
    negative or unreadable. O(D)."""
    if topology is None:
        return np.zeros(0)
    out = np.zeros(topology.num_devices)
    for d, dev in enumerate(topology.devices):
        try:
            out[d] = max(float(read(dev.extra) or 0.0), 0.0)
        except (TypeError, ValueError):
            out[d] = 0.0
    return out


def _optimizer_table(topology: Topology | None, key: str, optimizer: str) -> np.ndarray:
    out = _device_values(topology, lambda x: x[key].get(optimizer)
                         if isinstance(x.get(key), dict) else None)
    if topology is None or not out.any():
        return out
    return out / _measured_busy(topology)


def optimizer_seconds_per_byte(topology: Topology | None, optimizer: str) -> np.ndarray:
    """Every device's measured seconds per parameter byte of a step of ``optimizer``
    (``optimizer_seconds_per_byte``, alone: :func:`_measured_busy` divided out), shape (D,);
    0 where not measured (the roofline prices it then). O(D)."""
    return _optimizer_table(topology, "optimizer_seconds_per_byte", optimizer)


def optimizer_seconds_per_tensor(topology: Topology | None, optimizer: str) -> np.ndarray:
    """Every device's measured seconds per parameter tensor of a step of ``optimizer``
    (``optimizer_seconds_per_tensor``, alone), shape (D,); 0 where not measured. Charged
    beside :func:`optimizer_seconds_per_byte`, never instead of the roofline. O(D)."""
    return _optimizer_table(topology, "optimizer_seconds_per_tensor", optimizer)


def comm_cpu_share(topology: Topology | None) -> np.ndarray:
    """Every device's ``comm_cpu_share``, shape (D,): the part of a transfer's time in
    flight that its computation loses while it computes (0 where absent: a GPU's copy
    engines leave the compute alone); negative or unreadable entries read as 0. A ratio of
    two times taken under the same load, so the busy slowdown is not divided out. Read by
    the simulator's engine. O(D)."""
    return _device_values(topology, lambda x: x.get("comm_cpu_share"))


def host_collectives(topology: Topology | None) -> np.ndarray:
    """Per device, whether its collectives run on the cores that compute, shape (D,) of
    bool: a device entry saying it is a CPU (``"device": "cpu"``, as ``topology measure``
    writes for CPU ranks, or ``"type": "cpu"``). FSDP2 (torch 2.14) calls its parameter
    all-gathers and gradient reduce-scatters synchronously (``unshard_async_op`` off, the
    reduce-scatter without ``async_op``): a GPU returns once the collective is queued on
    its own stream and goes on computing (the next unit's gather overlaps this unit's
    compute), a CPU returns when it is done (nothing overlaps: a profile of two gloo ranks
    shows every unit's gather waited in full in its pre-forward). False where absent (the
    builders' and GPU presets' devices). Read by the simulator's engine. O(D).

    Examples
    --------
    >>> from shardplan.ir import Device
    >>> t = Topology(name="t", devices=(Device("a", 1e9, 1e12, {"device": "cpu"}),
    ...              Device("b", 1e9, 1e12, {"type": "v100"})),
    ...              bandwidth=[[0, 1], [1, 0]], latency=[[0, 0], [0, 0]])
    >>> host_collectives(t).tolist(), host_collectives(None).tolist()
    ([True, False], [])
    """
    if topology is None:
        return np.zeros(0, dtype=bool)
    return np.array([str(dev.extra.get("device", "")).lower() == "cpu"
                     or str(dev.extra.get("type", "")).lower() == "cpu"
                     for dev in topology.devices], dtype=bool)


def host_sync_wait(topology: Topology | None, devices: Sequence[int],
                   compute: Any) -> np.ndarray:
    """Seconds a collective every rank waits for costs beyond its own time on
    ``devices`` after ``compute`` seconds of computing (an array): ``host_sync_seconds``'s
    ``[compute, extra]`` points, linear between them from ``(0, 0)`` and flat beyond the
    last, the largest over the devices (every rank waits for the slowest), alone
    (:func:`_measured_busy`); 0 where absent. ``topology measure`` measures the points on
    CPU ranks: a rank that waits for its partner is woken when the partner arrives, 0.7 ms
    after 1.5 ms of computing and 1.0-1.5 ms after 5 ms or more on this machine's virtual
    CPUs, whatever the bytes. O(D (P log P + len(compute))) for P points.

    Examples
    --------
    >>> from shardplan.ir import Device
    >>> t = Topology(name="t", devices=(Device("a", 1e9, 1e12,
    ...              {"host_sync_seconds": [[1e-3, 4e-4], [4e-3, 1e-3]]}),),
    ...              bandwidth=[[0]], latency=[[0]])
    >>> (host_sync_wait(t, [0], [5e-4, 2.5e-3, 9e-3]) * 1e3).round(2).tolist()
    [0.2, 0.7, 1.0]
    """
    x = np.asarray(compute, dtype=np.float64)
    out = np.zeros_like(x)
    if topology is None:
        return out
    for d in devices:
        points = topology.devices[int(d)].extra.get("host_sync_seconds")
        if not points:
            continue
        pts = np.array(sorted((float(c), float(e)) for c, e in points), dtype=np.float64)
        xs = np.concatenate(([0.0], pts[:, 0]))
        ys = np.concatenate(([0.0], np.maximum(pts[:, 1], 0.0)))
        out = np.maximum(out, np.interp(x, xs, ys))
    return out / _measured_busy(topology)


def pipeline_action_overhead(topology: Topology | None, devices: Sequence[int]) -> float:
    """Seconds the pipelining schedule adds per action on ``devices`` (the largest of their
    ``pipeline_action_overhead_seconds``); 0 where absent."""
    return _largest(topology, "pipeline_action_overhead_seconds", devices)


def charge_run_overheads(st: Any, topology: Topology, gradient_sync: str,
                         used: Sequence[int], units: tuple[list, ...] | None = None, *,
                         pipelined: bool = False, dtensor_layers: Any = None,
                         dtensor_stages: Any = None) -> Any:
    """A :class:`~shardplan.cost._pipeline.StageTimes` with the run's fixed costs charged.

    - Under ``gradient_sync == "sharded"``, a stage with replicas pays
      :func:`fsdp_gather_overhead`, plus ``fsdp_gather_seconds_per_byte`` times the unit's
      parameter bytes, per all-gather of its ``units`` (forward and backward segment lists
      per stage, :func:`fsdp_unit_chunks`) in every micro-batch's forward and backward;
      and ``fsdp_reduce_overhead_seconds`` plus ``fsdp_reduce_seconds_per_byte`` times the
      unit's bytes per unit once, with its optimizer step (the units of the backward, and
      the root's parameter bytes of ``units[2][s]`` where given: FSDP2 reduces the root's
      gradients when the backward ends without gathering its parameters again). Where
      the collectives block the computing (:func:`host_collectives`: a CPU), each unit's
      computing also ends in a collective every rank waits for (the next unit's
      all-gather, or its reduce-scatter): each pays :func:`host_sync_wait` of its length
      (its share of the action, slowed by the plan's busy slowdown).
    - Otherwise every replica's optimizer step is preceded by the runtime's gradient
      handling, :func:`gradient_seconds_per_byte` per parameter byte of its stage (with
      replicas: the gradients flattened for the all-reduce or copied into DDP's buckets,
      copied back and scaled; one replica: scaled).
    - With ``pipelined`` (the pipeline runtime runs the plan), every forward and backward
      of a micro-batch pays :func:`pipeline_action_overhead`.
    - A stage whose parameters are DTensors (``dtensor_stages[s]`` true: a strategy's
      stage; or, under ``sharded`` sync, a stage with replicas: FSDP) pays
      :func:`dtensor_step_overhead` per parameter-holding layer (``dtensor_layers[s]``
      of them) in its optimizer step.
    - Every forward, backward and optimizer time is then multiplied by
      :func:`busy_slowdown` of the ``used`` devices (all of the plan's, every rank
      computing at once).

    Unchanged (the same object) when the topology measured none of it. O(S R).
    """
    import dataclasses

    factor = busy_slowdown(topology, used)
    host = host_collectives(topology)
    fwd, bwd, opt = st.forward.copy(), st.backward.copy(), st.optimizer.copy()
    changed = factor != 1.0
    for s in range(fwd.shape[0]):
        r = int(st.replicas[s])
        devs = [int(d) for d in st.devices[s, :r]]
        act = pipeline_action_overhead(topology, devs) if pipelined else 0.0
        if act > 0:
            fwd[s, :r] += act
            bwd[s, :r] += act
            changed = True
        on_dtensors = (dtensor_stages is not None and bool(dtensor_stages[s])) or \
            (gradient_sync == "sharded" and r > 1)
        if on_dtensors and dtensor_layers is not None and float(dtensor_layers[s]) > 0:
            c = dtensor_step_overhead(topology, devs)
            if c > 0:
                opt[s, :r] += c * float(dtensor_layers[s])
                changed = True
        if gradient_sync == "sharded" and r > 1:
            if units is not None and units[0][s]:
                c = fsdp_gather_overhead(topology, devs)
                per_byte = _largest(topology, "fsdp_gather_seconds_per_byte", devs)
                hosts = bool(host[devs].any())
                for t, segs, raw in ((fwd, units[0][s], st.forward),
                                     (bwd, units[1][s], st.backward)):
                    extra = c * len(segs) + per_byte * sum(float(b) for b, _ in segs)
                    if extra > 0:
                        t[s, :r] += extra
                        changed = True
                    if hosts:  # every unit's computing ends in a collective waited for
                        ends = np.array([f for _, f in segs], dtype=np.float64)
                        parts = np.diff(ends, prepend=0.0).clip(min=0.0)
                        waits = host_sync_wait(topology, devs, np.outer(
                            raw[s, :r], parts) * factor).sum(axis=1)  # per replica
                        if waits.any():
                            t[s, :r] += waits
                            changed = True
                segs = units[1][s]
                root = float(units[2][s]) if len(units) > 2 else 0.0  # reduced at the end
                extra = _largest(topology, "fsdp_reduce_overhead_seconds", devs) \
                    * (len(segs) + (root > 0)) \
                    + _largest(topology, "fsdp_reduce_seconds_per_byte", devs) \
                    * (sum(float(b) for b, _ in segs) + root)
                if extra > 0:
                    opt[s, :r] += extra
                    changed = True
            continue
        per_byte = gradient_seconds_per_byte(topology, devs, r > 1)
        if per_byte > 0 and float(st.param_bytes[s]) > 0:
            opt[s, :r] += per_byte * float(st.param_bytes[s])
            changed = True
    if not changed:
        return st
    return dataclasses.replace(st, forward=fwd * factor, backward=bwd * factor,
                               optimizer=opt * factor)
