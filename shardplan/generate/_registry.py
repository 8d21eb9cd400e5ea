"""Generators by name: the registry behind ``shardplan generate KIND``."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from shardplan.errors import ShardplanError
from shardplan.generate._chain import chain
from shardplan.generate._layered import layered
from shardplan.generate._pase import alexnet, inception_v3, rnnlm, transformer
from shardplan.generate._random_dag import random_dag
from shardplan.ir import Graph

__all__ = ["BENCHMARKS", "GENERATORS", "generate", "generator_options"]

GENERATORS: Mapping[str, Callable[..., Graph]] = {
    "layered": layered,
    "chain": chain,
    "random-dag": random_dag,
}
"""Every generator, by the name the command line uses."""

BENCHMARKS: Mapping[str, Callable[..., Graph]] = {
    "alexnet": alexnet,
    "inception-v3": inception_v3,
    "rnnlm": rnnlm,
    "transformer": transformer,
}
"""The PaSE paper's benchmark graphs, with iteration spaces (fixed sizes: no ``num_nodes``)."""

def generator_options(kind: str) -> tuple[str, ...]:
    """The keyword options generator ``kind`` takes (``num_nodes`` first)."""
    params = inspect.signature(_lookup(kind)).parameters
    return tuple(params)


def _lookup(kind: str) -> Callable[..., Graph]:
    fn = GENERATORS.get(kind) or BENCHMARKS.get(kind)
    if fn is None:
        raise ShardplanError(f"unknown generator {kind!r} (choose from "
                             f"{', '.join([*GENERATORS, *BENCHMARKS])})")
    return fn


def generate(kind: str, **options: Any) -> Graph:
    """Build a graph with generator ``kind`` (``"layered"``, ``"chain"``, ``"random-dag"``, or
    a PaSE benchmark: ``"alexnet"``, ``"inception-v3"``, ``"rnnlm"``, ``"transformer"``).

    Parameters
    ----------
    kind : str
        A key of :data:`GENERATORS`.
    **options
        Keyword options of that generator (``num_nodes``, ``seed``, ...).

    Raises
    ------
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
