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

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from shardplan.errors import ShardplanError
from shardplan.ir import ExecutionSettings, Graph, Plan, Topology

__all__ = ["FAMILIES", "Algorithm", "Progress", "Result", "available", "get", "register", "run",
           "take_options"]

Progress = Callable[[str, float, float], None]

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
    """Look up and run an algorithm; validates the plan it returns against the inputs. Every
    plan carries execution settings: one made by an algorithm that sets none gets the
    defaults (:class:`~shardplan.ir.ExecutionSettings`) at the graph's batch size."""
    if time_limit is not None and not time_limit > 0:
        raise ShardplanError(f"time limit must be positive, got {time_limit!r}")
    result = get(family, name)(graph, topology, options=options, seed=seed,
                               time_limit=time_limit, progress=progress)
    result.plan.validate(graph, topology)
    if result.plan.execution is None:
        result = Result(result.plan.with_settings(ExecutionSettings().resolve(graph)),
                        result.stats)
    return result


# Packages whose ``__init__`` imports (and so registers) their algorithms, on first lookup.
_BUILTIN_MODULES: tuple[str, ...] = ("shardplan.partition", "shardplan.mapping",
                                     "shardplan.strategy")
_loaded = False


def _load_builtin() -> None:
    global _loaded
    if _loaded:
        return
    import importlib

    for mod in _BUILTIN_MODULES:
        importlib.import_module(mod)
    _loaded = True
