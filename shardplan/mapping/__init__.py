"""Device mapping (Parmesan section 5): place every replica of every stage of a plan on its
own device.

``optimal`` (:mod:`.optimal`): Algorithm 1, binary search on the target max stage time with
an exact backtracking inner search; ``consecutive`` (:mod:`.consecutive`): consecutive stages
on consecutive devices, the common heuristic the paper compares with. Both evaluate the
views of the one stage-time model (:mod:`._stage_time`: ``overlap``, the simulator's;
equation 6, ``p2p``; equation 7, ``allreduce``), which ``shardplan cost --objective
max-stage`` evaluates too.
"""

from shardplan.mapping import consecutive, optimal  # noqa: F401  (register the algorithms)
from shardplan.mapping._stage_time import (
    MappingProblem,
    allreduce_times,
    build_problem,
    choose_model,
    p2p_times,
    stage_times,
)

__all__ = ["MappingProblem", "allreduce_times", "build_problem", "choose_model", "p2p_times",
           "stage_times"]
