"""PaSE: per-layer data and parameter parallel strategies (paper 004).

Iteration spaces and configurations (:mod:`~shardplan.strategy.spaces`), the ``pase`` and
``default`` cost models, the tables every solver works on (:mod:`~shardplan.strategy.tables`),
the dynamic program with GenerateSeq and breadth-first orderings (``pase``), and the baselines
``data-parallel`` and ``expert``. Importing this package registers the three ``strategy``
algorithms. numpy only.
"""

from shardplan.strategy import data_parallel, expert, pase  # noqa: F401 - registers
from shardplan.strategy._dp import TableTooLargeError, bfs_sequence, generate_seq, solve
from shardplan.strategy.hybrid import hybrid_plan
from shardplan.strategy.spaces import Space, batch_only, configurations
from shardplan.strategy.tables import Tables, build_tables, graph_spaces

__all__ = ["Space", "TableTooLargeError", "Tables", "batch_only", "bfs_sequence",
           "build_tables", "configurations", "generate_seq", "graph_spaces", "hybrid_plan",
           "solve"]
