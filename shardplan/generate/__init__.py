"""Synthetic computation graphs: layered random DAGs (paper 000's experiments), chains and
uniform random DAGs, all seeded; and the PaSE paper's four benchmarks (AlexNet, InceptionV3,
RNNLM, Transformer) with iteration spaces.

Every generator returns a :class:`~shardplan.ir.Graph` whose ids are in topological order and
whose FLOPs and bytes follow from random integer node weights (a dense layer per node, see
:func:`layered`). Same seed, same graph.
"""

from shardplan.generate._chain import chain
from shardplan.generate._layered import layered
from shardplan.generate._pase import alexnet, inception_v3, rnnlm, transformer
from shardplan.generate._random_dag import random_dag
from shardplan.generate._registry import (
    BENCHMARKS,
    GENERATORS,
    generate,
    generator_options,
)

__all__ = ["BENCHMARKS", "GENERATORS", "alexnet", "chain", "generate",
           "generator_options", "inception_v3", "layered", "random_dag", "rnnlm",
           "transformer"]
