"""``shardplan plan``: find, rank and run the best plan for a model on a cluster.

Every family of plan the papers describe, and the hybrid none of them has, is a source of
candidates (:mod:`._families`): data parallelism (an all-reduce at the end, DDP's buckets,
FSDP's sharding), Parmesan's pipelines over every stages x replicas shape, schedule and
micro-batch count, each mapped optimally and consecutively, the PipeDream, params and uniform
baselines, paper 000's sharding partitions, PaSE's per-layer strategies, and Parmesan's
stages each run by a PaSE strategy. The simulator judges every candidate with the plan's own
execution settings (:func:`search`); the winner is an ordinary plan file.
"""

from shardplan.planner._families import (
    FAMILIES,
    Evaluated,
    Task,
    microbatch_choices,
    shape_label,
)
from shardplan.planner._search import MAX_LLM_PLAN_DEVICES, MAX_PLAN_DEVICES, PlanSearch, search

__all__ = ["FAMILIES", "MAX_LLM_PLAN_DEVICES", "MAX_PLAN_DEVICES", "Evaluated", "PlanSearch",
           "Task", "microbatch_choices", "search", "shape_label"]
