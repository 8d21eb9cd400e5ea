"""One contract for every planning algorithm: a registry by name and one result type.

An algorithm is a function ``(graph, topology, *, options, seed, time_limit, progress) ->
Result`` registered under a family (``"partition"``, ``"map"``, ``"strategy"``) and a name
(``"heuristic"``). ``options`` is a plain mapping (JSON-able, stored in the plan);
:func:`take_options` checks it against the algorithm's defaults. ``progress``, when not None,
is called as ``progress(label, done, total)`` while the search runs (the command line draws a
rich bar from it on a terminal). ``time_limit`` in seconds: a search that reaches it returns
its best plan so far with status ``timed_out``. Algorithms of the ``map`` family find the plan
to map in ``options["plan"]`` (a :class:`Plan`, left out of the options the new plan records).
The command line, the Python API (:func:`shardplan.partition`, ...) and the shared contract
test all find algorithms here, so a new one is one module and one decorator.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from shardplan.errors import InfeasibleError, ShardplanError, ShardplanWarning
from shardplan.ir import ExecutionSettings, Graph, Level, Link, Plan, Stage, Topology

__all__ = ["FAMILIES", "Algorithm", "Progress", "Result", "available", "check_reachable", "get",
           "register", "run", "take_options"]

Progress = Callable[[str, float, float], None]

_log = logging.getLogger(__name__)

FAMILIES = ("partition", "map", "strategy")


@dataclass(frozen=True)
class Result:
    """What every algorithm returns: the plan (with objective, lower bound and status inside)
    and search statistics (iterations, nodes explored, cost over time, ...)."""

    plan: Plan
    stats: Mapping[str, Any] = field(default_factory=dict)

    @property
    def objective(self) -> float:
        return self.plan.objective.value

    @property
    def status(self) -> str:
        return self.plan.status


class Algorithm(Protocol):
    def __call__(self, graph: Graph, topology: Topology, *, options: Mapping[str, Any],
                 seed: int, time_limit: float | None,
                 progress: Progress | None = None) -> Result: ...


def take_options(algorithm: str, options: Mapping[str, Any],
                 defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``defaults`` updated with ``options``; a one-line :class:`ShardplanError` naming the
    first option ``algorithm`` does not take. O(len(options))."""
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        takes = ", ".join(sorted(defaults)) or "no options"
        raise ShardplanError(f"{algorithm} does not take option {unknown[0]!r} "
                             f"(it takes: {takes})")
    out = dict(defaults)
    out.update(options)
    return out


_REGISTRY: dict[str, dict[str, Algorithm]] = {f: {} for f in FAMILIES}


def register(family: str, name: str) -> Callable[[Algorithm], Algorithm]:
    """Decorator: register ``fn`` as algorithm ``name`` of ``family``."""
    if family not in _REGISTRY:
        raise ValueError(f"unknown algorithm family {family!r}")

    def deco(fn: Algorithm) -> Algorithm:
        if name in _REGISTRY[family]:
            raise ValueError(f"{family} algorithm {name!r} registered twice")
        _REGISTRY[family][name] = fn
        return fn

    return deco


def available(family: str) -> list[str]:
    """Names registered in ``family``, sorted."""
    _load_builtin()
    return sorted(_REGISTRY.get(family, {}))


def get(family: str, name: str) -> Algorithm:
    """The algorithm ``name`` of ``family``; a one-line :class:`ShardplanError` if unknown."""
    _load_builtin()
    algos = _REGISTRY.get(family)
    if algos is None:
        raise ShardplanError(f"unknown algorithm family {family!r}")
    if name not in algos:
        have = ", ".join(sorted(algos)) or "none yet"
        raise ShardplanError(f"unknown {family} algorithm {name!r} (available: {have})")
    return algos[name]


def run(family: str, name: str, graph: Graph, topology: Topology, *,
        seed: int = 0, time_limit: float | None = None, progress: Progress | None = None,
        **options: Any) -> Result:
    """Look up and run an algorithm; validates the plan it returns against the inputs.

    Unreachable devices are handled here, for every algorithm alike:

    - when the topology falls into parts that cannot reach each other
      (:meth:`Topology.connected_parts`: zero bandwidth and no route between them), the
      algorithm plans on the largest part only (ties: the one with the lowest device id); a
      :class:`~shardplan.errors.ShardplanWarning` says so (the command line prints it as a
      note), the result's stats name the devices used, and an error raised on the smaller
      topology (too few devices, say) names the part it was given;
    - the plan returned must not send data between two devices that cannot reach each other
      (adjacent stages, a stage's replica ring, a strategy's devices); one that does is
      refused with an :class:`~shardplan.errors.InfeasibleError` naming the pair (a topology
      whose zero-bandwidth pairs lie inside one part, written by hand without ``links``).

    Every plan carries execution settings: one made by an algorithm that sets none gets
    the defaults (:class:`~shardplan.ir.ExecutionSettings`) at the graph's batch size.
    """
    if time_limit is not None and not time_limit > 0:
        raise ShardplanError(f"time limit must be positive, got {time_limit!r}")
    algorithm = get(family, name)
    _log.info("%s %s: graph %s (%d nodes), topology %s (%d devices), seed %d, time limit %s",
              family, name, graph.name, graph.num_nodes, topology.name, topology.num_devices,
              seed, time_limit)
    started = time.perf_counter()
    parts = topology.connected_parts()
    if len(parts) == 1:
        result = algorithm(graph, topology, options=options, seed=seed,
                           time_limit=time_limit, progress=progress)
    else:
        keep = parts[0]
        where = (f"the topology's {topology.num_devices} devices fall into {len(parts)} parts "
                 f"that cannot reach each other (bandwidth 0, no route); planning on the "
                 f"largest, devices {_ranges(keep)}")
        part = _restrict(topology, keep)
        local = {k: _plan_onto(v, keep) if isinstance(v, Plan) else v
                 for k, v in options.items()}
        try:
            result = algorithm(graph, part, options=local, seed=seed, time_limit=time_limit,
                               progress=progress)
        except ShardplanError as exc:
            raise _with_context(exc, where) from None
        stats = {**result.stats, "planned_on_devices": keep.tolist(),
                 "unreachable_devices": np.setdiff1d(np.arange(topology.num_devices),
                                                     keep).tolist()}
        result = Result(_plan_back(result.plan, keep), stats)
        warnings.warn(where, ShardplanWarning, stacklevel=2)
    result.plan.validate(graph, topology)
    check_reachable(result.plan, graph, topology)
    if result.plan.execution is None:
        result = Result(result.plan.with_settings(ExecutionSettings().resolve(graph)),
                        result.stats)
    _log.info("%s %s: %s = %.6g (%s) in %.2f s", family, name, result.plan.objective.name,
              result.plan.objective.value, result.plan.status, time.perf_counter() - started)
    return result


def check_reachable(plan: Plan, graph: Graph, topology: Topology) -> None:
    """Raise an :class:`InfeasibleError` when ``plan`` sends data between two devices that
    cannot reach each other (``bandwidth`` 0 that way): replica r of a stage to replica r of
    each adjacent stage and back (every pair of the two stages' devices when their replica
    counts differ), each replica to the next in the stage's list (its all-reduce ring), and
    every pair of a stage's devices when the plan carries a ``strategy`` (PaSE's layers
    exchange data among all of them). O(m + S^2 + S R) on top of the stage adjacency."""
    if topology.all_pairs_reachable:
        return
    bw = topology.bandwidth
    pairs: list[tuple[np.ndarray, np.ndarray]] = []
    for st in plan.stages:
        d = np.asarray(st.devices, dtype=np.int64)
        if d.size < 2:
            continue
        if plan.strategy is not None:
            ii, jj = np.meshgrid(d, d, indexing="ij")
            off = ii != jj
            pairs.append((ii[off], jj[off]))
        else:
            pairs.append((d, np.roll(d, -1)))
    if plan.num_stages > 1:
        adj = graph.stage_adjacency(plan.assignment(graph.num_nodes), plan.num_stages)
        for a, b in zip(*np.nonzero(adj | adj.T), strict=True):
            da = np.asarray(plan.stages[a].devices, dtype=np.int64)
            db = np.asarray(plan.stages[b].devices, dtype=np.int64)
            if da.size != db.size:
                da, db = np.repeat(da, db.size), np.tile(db, da.size)
            pairs.append((da, db))
    if not pairs:
        return
    src = np.concatenate([p[0] for p in pairs])
    dst = np.concatenate([p[1] for p in pairs])
    bad = np.flatnonzero((src != dst) & ~(bw[src, dst] > 0))
    if bad.size:
        i, j = int(src[bad[0]]), int(dst[bad[0]])
        names = topology.devices
        raise InfeasibleError(f"the plan sends data from device {i} ({names[i].name}) to "
                              f"device {j} ({names[j].name}), which it cannot reach "
                              f"(bandwidth 0, no route): give the topology the physical "
                              f"links to route over, or leave one of the two devices out")


def _ranges(ids: np.ndarray) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"``; long lists shortened."""
    runs: list[str] = []
    start = prev = int(ids[0])
    for x in [*ids[1:].tolist(), None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    text = ", ".join(runs[:8]) + (f", ... ({len(runs) - 8} more runs)" if len(runs) > 8 else "")
    return f"{text} ({ids.size} of them)"


def _restrict(topology: Topology, keep: np.ndarray) -> Topology:
    """The topology of the devices ``keep`` only, renumbered ``0..len(keep)-1``: matrices,
    levels (empty groups dropped) and links restricted. Builder metadata (a grid's shape)
    no longer describes it and is dropped."""
    pos = {int(d): i for i, d in enumerate(keep.tolist())}
    ix = np.ix_(keep, keep)
    levels = []
    for lv in topology.levels:
        groups = tuple(g for g in (tuple(pos[d] for d in grp if d in pos) for grp in lv.groups)
                       if g)
        levels.append(Level(lv.name, groups))
    links = tuple(Link(pos[lk.src], pos[lk.dst], lk.bandwidth, lk.latency, lk.kind)
                  for lk in topology.links if lk.src in pos and lk.dst in pos)
    return topology.replace(devices=tuple(topology.devices[d] for d in keep.tolist()),
                            bandwidth=topology.bandwidth[ix], latency=topology.latency[ix],
                            cost=None if topology.cost is None else topology.cost[ix],
                            levels=tuple(levels), links=links, meta={})


def _plan_onto(plan: Plan, keep: np.ndarray) -> Plan:
    """An input plan (``map``'s) in the ids of the restricted topology; devices outside it
    are left as they are (the mappers only read the replica counts)."""
    pos = {int(d): i for i, d in enumerate(keep.tolist())}
    if not all(d in pos for st in plan.stages for d in st.devices):
        return plan
    return dataclasses.replace(plan, stages=tuple(
        Stage(st.nodes, tuple(pos[d] for d in st.devices)) for st in plan.stages))


def _plan_back(plan: Plan, keep: np.ndarray) -> Plan:
    """A plan made on the restricted topology, in the full topology's device ids."""
    ids = keep.tolist()
    return dataclasses.replace(plan, stages=tuple(
        Stage(st.nodes, tuple(ids[d] for d in st.devices)) for st in plan.stages))


def _with_context(exc: ShardplanError, where: str) -> ShardplanError:
    message = f"{exc} ({where})"
    try:
        return type(exc)(message)
    except TypeError:  # a subclass with another constructor
        return ShardplanError(message)


# Packages whose ``__init__`` imports (and so registers) their algorithms, on first lookup.
_BUILTIN_MODULES: tuple[str, ...] = ("shardplan.partition", "shardplan.mapping",
                                     "shardplan.strategy")
_loaded = False


#: The entry-point group third-party packages register algorithms in (pyproject.toml)::
#:
#:     [project.entry-points."shardplan.algorithms"]
#:     "partition.my-algo" = "my_package.module:my_algo"   # registered as partition/my-algo
#:     my_package = "my_package.algorithms"                # a module whose import registers
ENTRY_POINT_GROUP = "shardplan.algorithms"


def _load_entry_points() -> None:
    """Load every ``shardplan.algorithms`` entry point. A name ``FAMILY.NAME`` registers the
    loaded function under that family and name (unless loading it registered it); any
    other name is a module whose import registers its algorithms. One that fails to load is
    skipped with a one-line warning."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            family, _, name = ep.name.partition(".")
            if name and family in _REGISTRY and name not in _REGISTRY[family]:
                if not callable(obj):
                    raise TypeError(f"{ep.value} is not a function")
                register(family, name)(obj)
        except Exception as exc:  # a broken plug-in must not break shardplan
            warnings.warn(f"algorithm plug-in {ep.name!r} ({ep.value}) not loaded: "
                          f"{type(exc).__name__}: {exc}", ShardplanWarning, stacklevel=2)


def _load_builtin() -> None:
    global _loaded
    if _loaded:
        return
    import importlib

    for mod in _BUILTIN_MODULES:
        importlib.import_module(mod)
    _loaded = True
    _load_entry_points()
