"""What ``shardplan plan`` assumes when the user does not say, and the choices that narrow
its answer (issue 45, item 2).

- :func:`bf16_tensor_cores`: whether a cluster's GPUs train an LLM in bf16 by default;
- :func:`use_gpus`: ``--gpus N`` (or a cluster spec's ``gpus=N``), N of the cluster's GPUs;
- :func:`keep_target`: ``--target STACK``, the ranked plans that stack can run and export;
- :class:`Assumptions`: every default the planner took, said in one line under the table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from shardplan.errors import ShardplanError
from shardplan.ir import Graph, Level, Plan, Topology
from shardplan.ir.hardware import NO_BF16

__all__ = ["ASSUMPTION_ORDER", "DEFAULT_TIME_LIMIT", "TARGETS", "TARGET_STACKS", "Assumptions",
           "bf16_tensor_cores", "keep_target", "use_gpus"]

#: Seconds ``plan`` searches when no ``--time-limit`` is given: an answer within a minute.
DEFAULT_TIME_LIMIT = 60.0

#: The stacks ``plan --target`` keeps plans for: the ``shardplan export`` formats that start a
#: training run.
TARGETS = ("megatron", "torchtitan", "deepspeed", "torch")

#: The stack (``ExecutionSettings.stack``, how the LLM plan kind prices a run) each target
#: runs its plans on, when ``--stack`` is not given: torchtitan's own, DeepSpeed's pipeline
#: engine and ZeRO (Megatron-DeepSpeed), Megatron-Core with Transformer Engine (what
#: Megatron-LM runs by default today); ``torch`` keeps the default.
TARGET_STACKS = {"torchtitan": "torchtitan", "deepspeed": "megatron-deepspeed",
                 "megatron": "megatron-core"}

#: Custom-GPU architectures without bf16 arithmetic (:mod:`shardplan.topology._custom`).
_NO_BF16_ARCHS = frozenset({"volta"})


def bf16_tensor_cores(topology: Topology) -> bool:
    """Whether every device of ``topology`` declares a bf16 tensor-core rate: a tensor-core
    ``flops`` above its CUDA-core ``fp32_flops`` (the cluster and device presets: A100,
    H100, H200, B200, GB200) on a type with bf16 units (not V100, whose tensor cores do fp16
    only). A device given only a FLOP rate (``flat``, a topology file without
    ``fp32_flops``) declares none. O(devices).

    Examples
    --------
    >>> from shardplan.topology import build_spec, flat
    >>> bf16_tensor_cores(build_spec("dgx-h100")), bf16_tensor_cores(build_spec("dgx2-v100"))
    (True, False)
    >>> bf16_tensor_cores(flat(2))
    False
    """
    for d in topology.devices:
        kind = str(d.extra.get("type", "")).lower()
        fp32 = float(d.extra.get("fp32_flops") or 0.0)
        if kind in NO_BF16 or not 0 < fp32 < float(d.flops):
            return False
        if kind == "custom" and str(d.extra.get("arch", "")).lower() in _NO_BF16_ARCHS:
            return False
    return True


def _node_size(topology: Topology) -> int:
    if topology.levels:
        return min(len(g) for g in topology.levels[0].groups)
    return topology.num_devices


def use_gpus(topology: Topology, gpus: int, *, flag: str = "--gpus") -> Topology:
    """The first ``gpus`` devices of ``topology`` (node-major: a node's GPUs first), as a
    topology of their own: 2 of a DGX's 8 GPUs, or 4 of 16 nodes. Their pair bandwidths and
    latencies, levels and links are the cluster's; a cluster preset keeps its compact pair
    model (the NCCL rule of :func:`~shardplan.cost._gpu.cluster_collective_seconds` reads
    the same kind), its generator meta recording ``nodes`` and ``gpus_of``, the cluster's
    count. The topology itself when ``gpus`` is all of it. O(gpus) for a pair model,
    O(gpus^2) for dense matrices.

    Raises
    ------
    ShardplanError
        ``gpus`` above the cluster's, or not whole nodes when it needs more than one node
        (a run on 12 GPUs of 8-GPU nodes): one line.

    Examples
    --------
    >>> from shardplan.topology import build_spec
    >>> two = use_gpus(build_spec("dgx-h100"), 2)
    >>> two.num_devices, two.name, [d.name for d in two.devices]
    (2, 'dgx-h100-2gpu', ['node0/gpu0', 'node0/gpu1'])
    >>> use_gpus(build_spec("dgx-h100,nodes=4"), 16).levels[0].groups
    ((0, 1, 2, 3, 4, 5, 6, 7), (8, 9, 10, 11, 12, 13, 14, 15))
    """
    from shardplan.ir._pairs import LevelPairs

    total = topology.num_devices
    n = int(gpus)
    if n < 1:
        raise ShardplanError(f"{flag} {n}: a run needs at least one GPU")
    if n > total:
        raise ShardplanError(f"{flag} {n} is more than the {total} GPUs of cluster "
                             f"{topology.name!r}")
    if n == total:
        return topology
    node = _node_size(topology)
    if n > node and n % node:
        raise ShardplanError(f"{flag} {n} does not fill whole nodes of {node} GPUs (a run on "
                             f"more than one node takes whole nodes: "
                             f"{n // node * node} or {(n // node + 1) * node})")
    keep = np.arange(n)
    model = topology.pair_model
    bandwidth: Any
    latency: Any
    if isinstance(model, LevelPairs) and len(model.shape) == 2:
        g = model.shape[1]
        shape = (n // g, g) if n >= g else (1, n)
        vals = {}
        for which in ("bandwidth", "latency"):
            per_level, inner = model.tables[which]
            last: Any = float(per_level[1]) if inner is None else inner[:shape[1], :shape[1]]
            vals[which] = [float(per_level[0]), last]
        sub = LevelPairs(shape, vals["bandwidth"], vals["latency"])
        bandwidth, latency = sub.matrix("bandwidth"), sub.matrix("latency")
    else:
        ix = np.ix_(keep, keep)
        bandwidth = np.array(topology.bandwidth[ix])
        latency = np.array(topology.latency[ix])
    levels = []
    for lv in topology.levels:
        groups = tuple(g2 for g2 in (tuple(d for d in grp if d < n) for grp in lv.groups) if g2)
        levels.append(Level(name=lv.name, groups=groups))
    meta = dict(topology.meta)
    gen = meta.get("generator")
    if isinstance(gen, dict):
        options = dict(gen.get("options") or {})
        if "nodes" in options:
            options["nodes"] = max(1, n // node)
        options["gpus_of"] = total
        meta["generator"] = {**gen, "options": options}
    cost = None if topology.cost is None else np.array(topology.cost[np.ix_(keep, keep)])
    links = tuple(lk for lk in topology.links if lk.src < n and lk.dst < n)
    return Topology(name=f"{topology.name}-{n}gpu", devices=topology.devices[:n],
                    bandwidth=bandwidth, latency=latency, cost=cost, levels=tuple(levels),
                    links=links, meta=meta)


def _first_line(exc: BaseException, limit: int = 110) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= limit else text[:limit - 3].rstrip() + "..."


@dataclass(frozen=True)
class TargetFilter:
    """What :func:`keep_target` dropped: per family, the count and the first refusal."""

    target: str
    checked: int = 0
    dropped: dict[str, tuple[int, str]] = field(default_factory=dict)

    @property
    def num_dropped(self) -> int:
        return sum(n for n, _ in self.dropped.values())

    def summary(self) -> str:
        """``--target torchtitan: dropped 3 plans it cannot run (pase 2: ...; ...)``."""
        if not self.dropped:
            return f"--target {self.target}: every plan shown runs on it"
        why = "; ".join(f"{fam} {n}: {reason}" for fam, (n, reason) in self.dropped.items())
        return (f"--target {self.target}: dropped {self.num_dropped} of the first "
                f"{self.checked} plans, which {self.target} cannot run or export ({why})")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.target, "checked": self.checked, "dropped": self.num_dropped,
                "dropped_by_family": {f: {"count": n, "reason": r}
                                      for f, (n, r) in self.dropped.items()}}


def keep_target(result: Any, graph: Graph, topology: Topology, target: str, *,
                keep: int) -> tuple[Any, TargetFilter]:
    """The :class:`~shardplan.planner.PlanSearch` ``result`` with only the plans ``target``
    can run: each ranked plan, best first, is exported to ``target`` in memory
    (:func:`shardplan.export.export`) and dropped when the export refuses it (a
    :class:`ShardplanError`: torchtitan and PaSE strategies or DeepSpeed's module-by-module
    sharding, Megatron and HSDP, ...), until ``keep`` plans are kept; the rows after them are
    not checked, nor shown. The winner is the first kept plan that fits; the comparisons are
    recomputed over the kept rows. O(checked x one export).

    Raises
    ------
    ShardplanError
        When no plan evaluated is one ``target`` can run: one line with the first refusals.
    """
    from shardplan.export import export
    from shardplan.planner._search import _comparisons

    kept: list[Any] = []
    dropped: dict[str, tuple[int, str]] = {}
    checked = 0
    for row in result.ranked:
        if len(kept) >= keep:
            break
        checked += 1
        try:
            export(Plan.from_dict(row.plan), graph, topology, target)
        except ShardplanError as exc:
            n, first = dropped.get(row.family, (0, _first_line(exc)))
            dropped[row.family] = (n + 1, first)
            continue
        kept.append(row)
    report = TargetFilter(target, checked, dropped)
    fits = [r for r in kept if r.fits and math.isfinite(r.iteration_seconds)]
    if not fits:
        raise ShardplanError(f"no plan found runs on {target}: "
                             + (report.summary().split(": ", 1)[1] if dropped
                                else "none fits in device memory"))
    winner = Plan.from_dict(fits[0].plan)
    return replace(result, ranked=tuple(kept), winner=winner,
                   comparisons=_comparisons(kept)), report


#: The order of the ``assumed:`` line (other keys after them, as added).
ASSUMPTION_ORDER = ("precision", "sequence", "global_batch", "gpus", "stack", "time_limit",
                    "target")


@dataclass
class Assumptions:
    """Every default the planner took where the user said nothing, in
    :data:`ASSUMPTION_ORDER`: ``assumed: bf16 (tensor cores; --precision to change),
    sequence 8192 (...), ...``."""

    items: list[tuple[str, str]] = field(default_factory=list)

    def add(self, key: str, text: str) -> None:
        self.items.append((key, text))
        rank = {k: i for i, k in enumerate(ASSUMPTION_ORDER)}
        self.items.sort(key=lambda kv: rank.get(kv[0], len(rank)))  # stable

    def line(self) -> str:
        return "assumed: " + ", ".join(text for _, text in self.items)

    def to_dict(self) -> dict[str, str]:
        return dict(self.items)

    def extend(self, pairs: Sequence[tuple[str, str]]) -> None:
        self.items.extend(pairs)
