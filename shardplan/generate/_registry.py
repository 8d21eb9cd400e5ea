"""Generators by name: the registry behind ``shardplan generate KIND``."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from shardplan.errors import NotImplementedYetError, ShardplanError
from shardplan.generate._chain import chain
from shardplan.generate._layered import layered
from shardplan.generate._random_dag import random_dag
from shardplan.ir import Graph

__all__ = ["GENERATORS", "PENDING", "generate", "generator_options"]

GENERATORS: Mapping[str, Callable[..., Graph]] = {
    "layered": layered,
    "chain": chain,
    "random-dag": random_dag,
}
"""Every generator, by the name the command line uses."""

PENDING: Mapping[str, str] = {
    "alexnet": "#7",
    "inception-v3": "#7",
    "rnnlm": "#7",
    "transformer": "#7",
}
"""Kinds the contract names whose issue has not landed yet (the PaSE benchmarks), to issue."""


def generator_options(kind: str) -> tuple[str, ...]:
    """The keyword options generator ``kind`` takes (``num_nodes`` first)."""
    params = inspect.signature(_lookup(kind)).parameters
    return tuple(params)


def _lookup(kind: str) -> Callable[..., Graph]:
    if kind in PENDING:
        raise NotImplementedYetError(f"generator {kind!r} is not implemented yet "
                                     f"(issue {PENDING[kind]})")
    fn = GENERATORS.get(kind)
    if fn is None:
        raise ShardplanError(f"unknown generator {kind!r} (choose from "
                             f"{', '.join([*GENERATORS, *PENDING])})")
    return fn


def generate(kind: str, **options: Any) -> Graph:
    """Build a graph with generator ``kind`` (``"layered"``, ``"chain"``, ``"random-dag"``).

    Parameters
    ----------
    kind : str
        A key of :data:`GENERATORS`.
    **options
        Keyword options of that generator (``num_nodes``, ``seed``, ...).

    Raises
    ------
    NotImplementedYetError
        For the PaSE benchmark kinds (``alexnet``, ``inception-v3``, ``rnnlm``,
        ``transformer``), which come with issue #7.
    ShardplanError
        Unknown kind, an option the generator does not take, or a value out of range.

    Examples
    --------
    >>> generate("chain", num_nodes=3, seed=0).num_edges
    2
    """
    fn = _lookup(kind)
    known = generator_options(kind)
    for key in options:
        if key not in known:
            raise ShardplanError(f"generator {kind!r} takes no option {key!r} (it takes "
                                 f"{', '.join(known)})")
    return fn(**options)
