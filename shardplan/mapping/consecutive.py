"""``consecutive``: the CS mapping baseline (Parmesan section 7): consecutive stages on
consecutive devices."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from shardplan.errors import ShardplanError
from shardplan.ir import Graph, Topology
from shardplan.mapping._common import SETTING_KEYS, mapped_plan, prepare
from shardplan.mapping._search import consecutive_devices
from shardplan.mapping._stage_time import stage_times
from shardplan.registry import Progress, Result, register, take_options

__all__ = ["consecutive"]

DEFAULTS: dict[str, Any] = {"plan": None, "model": "auto", "contention": "auto",
                            "order": "stage-major",
                            **SETTING_KEYS}


@register("map", "consecutive")
def consecutive(graph: Graph, topology: Topology, *, options: Mapping[str, Any], seed: int = 0,
                time_limit: float | None = None, progress: Progress | None = None) -> Result:
    """Place ``options["plan"]``'s stages on consecutive device ids (CS map).

    Parameters
    ----------
    options : mapping
        ``plan`` (required), ``model`` (``auto``/``overlap``/``p2p``/``allreduce``: only
        names the objective evaluated), ``contention`` (``auto``/True/False: price link
        sharing, as ``optimal`` does), ``order``: ``stage-major`` (default; stage s's R
        replicas on devices ``sR .. sR + R - 1``) or ``replica-major`` (replica r's pipeline
        on ``rS .. rS + S - 1``), and execution settings overriding the plan's.

    Notes
    -----
    The paper calls CS map "the most commonly used heuristic ... which aims to alleviate the
    allreduce time" without a precise layout; keeping a stage's replicas side by side is the
    layout that serves the all-reduce, hence our default. Devices are taken in the
    topology's id order (row-major on meshes and tori); the first S R devices are used.
    Status ``feasible`` (a heuristic); no lower bound. O(n + m + S^2 R).
    """
    opts = take_options("consecutive", options, DEFAULTS)
    if opts["order"] not in ("stage-major", "replica-major"):
        raise ShardplanError(f"order must be stage-major or replica-major, got "
                             f"{opts['order']!r}")
    t0 = time.perf_counter()
    plan, problem, model = prepare("consecutive", graph, topology, opts)
    dev = consecutive_devices(problem.num_stages, problem.num_replicas, opts["order"])
    value = float(np.max(stage_times(problem, dev, model)))
    out = mapped_plan("consecutive", plan, graph, topology, dev, model, value, None,
                      "feasible", seed, opts, time.perf_counter() - t0,
                      contention=problem.contention)
    return Result(out, {"model": model, "contention": problem.contention})
