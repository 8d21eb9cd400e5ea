"""shardplan: plan and run the training of PyTorch models across many devices.

The Python API mirrors the command line. Torch is imported only by the functions that need it
(:func:`capture`), so planning code imports in milliseconds.
"""

from __future__ import annotations

from typing import Any

from shardplan.errors import InfeasibleError, InvalidFileError, ShardplanError
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

__version__ = "0.1.0"

__all__ = [
    "Device", "Graph", "InfeasibleError", "InvalidFileError", "Level", "Objective", "Plan",
    "ShardplanError", "Stage", "Topology", "__version__", "capture", "capture_model", "load",
    "load_graph", "load_plan", "load_topology", "partition", "save",
]


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
