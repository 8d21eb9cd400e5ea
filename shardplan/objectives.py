"""Objectives by name: what ``shardplan cost --objective NAME`` evaluates, and what every
algorithm's reported ``objective.value`` must equal.

An objective is a function ``(plan, graph, topology, **options) -> (name, value, details)``
registered with :func:`objective` under the name the command line uses (``sharding``,
``max-stage``). ``name`` is the objective's name as plans record it (``sharding_cost``,
``max_stage_seconds``, ...); ``details`` is a JSON-able mapping (per-stage terms and the like).
The modules that define objectives register them on import; :data:`_MODULES` lists them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from shardplan.errors import ShardplanError
from shardplan.ir import Graph, Plan, Topology

__all__ = ["Evaluation", "available", "evaluate", "objective"]

Evaluation = tuple[str, float, Mapping[str, Any]]
ObjectiveFn = Callable[..., Evaluation]

_OBJECTIVES: dict[str, ObjectiveFn] = {}
# Modules that register objectives when imported (each package registers its own, so the
# registry depends on no planning package and no planning package on another).
_MODULES = ("shardplan.cost._sharding", "shardplan.cost._max_stage",
            "shardplan.strategy._objective", "shardplan.partition._pipedream_model")
_loaded = False


def objective(name: str) -> Callable[[ObjectiveFn], ObjectiveFn]:
    """Decorator: register ``fn`` as objective ``name``."""

    def deco(fn: ObjectiveFn) -> ObjectiveFn:
        if name in _OBJECTIVES:
            raise ValueError(f"objective {name!r} registered twice")
        _OBJECTIVES[name] = fn
        return fn

    return deco


def _load() -> None:
    global _loaded
    if not _loaded:
        for mod in _MODULES:
            importlib.import_module(mod)
        _loaded = True


def available() -> list[str]:
    """Registered objective names, sorted."""
    _load()
    return sorted(_OBJECTIVES)


def evaluate(plan: Plan, graph: Graph, topology: Topology, objective: str,
             **options: Any) -> Evaluation:
    """Evaluate ``objective`` on ``plan``: ``(recorded name, value, details)``.

    The plan is validated against the graph and topology first, so every objective sees a
    plan whose stages cover the graph and whose devices exist.
    """
    _load()
    if objective not in _OBJECTIVES:
        have = ", ".join(sorted(_OBJECTIVES)) or "none yet"
        raise ShardplanError(f"unknown objective {objective!r} (available: {have})")
    plan.validate(graph, topology)
    return _OBJECTIVES[objective](plan, graph, topology, **options)
