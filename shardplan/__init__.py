"""shardplan: plan and run the training of PyTorch models across many devices.

The Python API mirrors the command line. Torch is imported only by the functions that need it
(:func:`capture`), so planning code imports in milliseconds.

Importing the package itself loads nothing heavy: the names below (and the subpackages, such
as ``shardplan.ir``) are resolved on first use (PEP 562). The command line relies on this to
limit the BLAS and OpenMP thread pools before NumPy starts them (see
:mod:`shardplan.cli.main`); a library user's ``import shardplan`` never touches the
environment.
"""

from __future__ import annotations

import importlib
import logging
import sys
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shardplan.errors import InfeasibleError, InvalidFileError, ShardplanError

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from shardplan.ir import (
        Device,
        Graph,
        Level,
        Objective,
        Plan,
        Stage,
        Topology,
        load,
        load_graph,
        load_plan,
        load_topology,
        save,
    )

from shardplan._version import __version__

# A library logs under "shardplan" and leaves handlers to the application (the command line
# adds one with -v / -q).
logging.getLogger("shardplan").addHandler(logging.NullHandler())

__all__ = [
    "Device", "Graph", "InfeasibleError", "InvalidFileError", "Level", "Objective", "Plan",
    "ShardplanError", "Stage", "Topology", "__version__", "capture", "capture_model", "load",
    "load_graph", "load_plan", "load_topology", "partition", "save",
]

# Names re-exported from shardplan.ir, imported (with NumPy) on first access.
_FROM_IR = frozenset({"Device", "Graph", "Level", "Objective", "Plan", "Stage", "Topology",
                      "load", "load_graph", "load_plan", "load_topology", "save"})
_SUBPACKAGES = frozenset({"cli", "cost", "generate", "importers", "ir", "mapping", "objectives",
                          "registry", "report", "runtime", "simulate", "strategy", "topology"})



def __getattr__(name: str) -> Any:
    """PEP 562: the ``shardplan.ir`` names and the subpackages, imported on first access."""
    if name in _FROM_IR:
        value = getattr(importlib.import_module("shardplan.ir"), name)
        globals()[name] = value
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f"shardplan.{name}")
    raise AttributeError(f"module 'shardplan' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | _SUBPACKAGES)


def capture(model: Any, example_inputs: Any, **options: Any) -> Graph:
    """Capture a PyTorch model's computation graph (see :func:`shardplan.capture.capture`)."""
    from shardplan.capture import capture as _capture

    return _capture(model, example_inputs, **options)


def capture_model(spec: str, **options: Any) -> Graph:
    """Build a model by name and capture it (see :func:`shardplan.capture.capture_spec`)."""
    from shardplan.capture import capture_spec

    return capture_spec(spec, **options)


def partition(graph: Graph, topology: Topology, *, algorithm: str, seed: int = 0,
              time_limit: float | None = None, **options: Any) -> Plan:
    """Partition ``graph`` onto ``topology`` with a registered algorithm; returns the plan.

    See :mod:`shardplan.registry` for the algorithm contract; an unknown name raises a
    :class:`ShardplanError` listing the available ones.
    """
    from shardplan.registry import run

    return run("partition", algorithm, graph, topology, seed=seed, time_limit=time_limit,
               **options).plan


class _CallablePackage(types.ModuleType):
    """The subpackage ``shardplan.partition`` (``shardplan.capture``) once imported: still
    the package for every import form, and callable as the API function of the same name,
    which importing it would otherwise have replaced on ``shardplan``."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _API[self.__name__.rpartition(".")[2]](*args, **kwargs)


_API: dict[str, Callable[..., Any]] = {"capture": capture, "partition": partition}


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value: Any) -> None:
        if name in _API and isinstance(value, types.ModuleType):
            value.__class__ = _CallablePackage  # the import system binding the subpackage
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
