"""Partitioners: each module registers one algorithm of the ``partition`` family.

Paper 000 (sharding cost, section 2): :mod:`.brute_force`, :mod:`.heuristic`,
:mod:`.hierarchical`. Parmesan (pipeline stages, section 4) and the baselines a user would
otherwise pick: :mod:`.parmesan`, :mod:`.pipedream` (PipeDream's optimizer),
:mod:`.pipedream_sequence` (its DP on one operator order, Parmesan's third start),
:mod:`.uniform`, :mod:`.params`, :mod:`.metis`.
"""

from shardplan.partition import (  # noqa: F401 - importing registers each algorithm
    brute_force,
    heuristic,
    hierarchical,
    metis,
    params,
    parmesan,
    pipedream,
    pipedream_sequence,
    uniform,
)
