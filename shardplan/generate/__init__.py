"""Synthetic computation graphs: layered random DAGs (paper 000's experiments), chains and
uniform random DAGs, all seeded.

Every generator returns a :class:`~shardplan.ir.Graph` whose ids are in topological order and
whose FLOPs and bytes follow from random integer node weights (a dense layer per node, see
:func:`layered`). Same seed, same graph.
"""

from shardplan.generate._chain import chain
from shardplan.generate._layered import layered
from shardplan.generate._random_dag import random_dag
from shardplan.generate._registry import GENERATORS, PENDING, generate, generator_options

__all__ = ["GENERATORS", "PENDING", "chain", "generate", "generator_options", "layered",
           "random_dag"]
