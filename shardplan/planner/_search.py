"""The search of ``shardplan plan``: every family's candidates, judged by the simulator."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass, field, replace
from typing import Any

from shardplan.errors import InfeasibleError, ShardplanError
from shardplan.ir import ExecutionSettings, Graph, Plan, Topology
from shardplan.planner._families import (
    FAMILIES,
    Context,
    Evaluated,
    Task,
    run_task,
    tasks_for,
)

__all__ = ["LLM_ONLY_DEVICES", "MAX_LLM_PLAN_DEVICES", "MAX_PLAN_DEVICES", "PlanSearch",
           "default_families", "search"]

#: Most devices ``plan`` searches (4096: 64 x 64). Its families price candidates from dense
#: per-pair views of the devices a plan uses (Parmesan's median pair latency and bandwidth,
#: the mapper's matrices): O(D^2) memory, 128 MiB per float64 matrix at this size, 7 TiB at
#: a million devices. Larger clusters are refused in one line instead of running out of
#: memory.
MAX_PLAN_DEVICES = 4096

#: Most devices a search by the LLM family alone takes (32768: Llama 3 405B's 16,384 H100s
#: and twice that). It prices a candidate per pipeline rank from the cluster preset's
#: compact pair model, never from a dense per-pair matrix: Llama 3 405B on 8,192 H100s
#: imports, captures and simulates in 7 s and 0.7 GB here.
MAX_LLM_PLAN_DEVICES = 32768

#: The share of the time limit kept for collecting and writing the result.
_SLACK = 0.05
#: The share of the time limit a task keeps, after its deadline, to hand back its rows.
_GRACE = 0.02
#: Seconds a task's searches (a partition, a mapping) may take at most.
TASK_SECONDS = 10.0


@dataclass(frozen=True)
class PlanSearch:
    """What :func:`search` found.

    Attributes
    ----------
    ranked : tuple of Evaluated
        Every candidate evaluated, best first (memory-infeasible ones last).
    winner : Plan or None
        The fastest candidate that fits in memory.
    seconds : float
        Wall time of the search.
    timed_out : bool
        The time limit stopped it before every task ran.
    errors : tuple of str
        One line per task that could not produce a plan (and why).
    global_batch : int
    """

    ranked: tuple[Evaluated, ...]
    winner: Plan | None
    seconds: float
    timed_out: bool
    errors: tuple[str, ...] = ()
    global_batch: int = 0
    tasks: int = 0
    done: int = 0
    comparisons: dict[str, Any] = field(default_factory=dict)

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        rows = self.ranked if top is None else self.ranked[:top]
        return {"global_batch": self.global_batch, "seconds": self.seconds,
                "timed_out": self.timed_out, "tasks": self.tasks, "tasks_done": self.done,
                "candidates": len(self.ranked), "ranked": [r.row() for r in rows],
                "comparisons": self.comparisons, "errors": list(self.errors),
                "winner": self.winner.to_dict() if self.winner is not None else None}


_CTX: dict[str, Context] = {}


def _worker_task(task: Task) -> tuple[list[Evaluated], str, bool]:
    return run_task(_CTX["ctx"], task)


def _comparisons(ranked: Sequence[Evaluated]) -> dict[str, Any]:
    """How much the winner beats plain data parallelism and each family's best plan."""
    fit = [r for r in ranked if r.fits and math.isfinite(r.iteration_seconds)]
    if not fit:
        return {}
    best = fit[0]
    out: dict[str, Any] = {"winner": best.row()}
    per_family: dict[str, Evaluated] = {}
    for r in fit:
        per_family.setdefault(r.family, r)
    out["best_per_family"] = {f: {"iteration_seconds": r.iteration_seconds,
                                  "speedup_of_winner": r.iteration_seconds
                                  / best.iteration_seconds}
                              for f, r in per_family.items()}
    plain = [r for r in fit if r.family == "data-parallel" and r.gradient_sync == "bucketed"]
    if plain:
        out["speedup_over_data_parallel"] = plain[0].iteration_seconds / best.iteration_seconds
    others = [r for f, r in per_family.items() if f != best.family]
    if others:
        out["speedup_over_best_other_family"] = min(
            r.iteration_seconds for r in others) / best.iteration_seconds
    return out


def search(graph: Graph, topology: Topology, *, global_batch: int | None = None,
           settings: ExecutionSettings | None = None, families: Sequence[str] | None = None,
           time_limit: float | None = None, seed: int = 0, workers: int | None = None,
           fixed: dict[str, Any] | None = None, ray: str | None = None,
           progress: Callable[[str, float, float], None] | None = None,
           include: Sequence[Any] = ()) -> PlanSearch:
    """Every family's candidate plans for ``graph`` on ``topology``, simulated and ranked.

    Parameters
    ----------
    graph, topology
    global_batch : int, optional
        Samples per iteration every candidate trains (default: the graph's batch size per
        device, ``batch_size x devices``): the same work, so simulated times compare.
    settings : ExecutionSettings, optional
        What the candidates share (optimizer, precision, efficiency, recomputation, ...);
        the search chooses the schedule, micro-batches and gradient synchronisation.
    families : sequence of str, optional
        Default: :func:`default_families` (all that apply to the graph and cluster).
    time_limit : float, optional
        Seconds for the whole search; the best plan so far is returned when it runs out.
    workers : int, optional
        Processes evaluating tasks at once (default: the CPUs, at most 4).
    fixed : dict, optional
        Settings the user fixed (``microbatches``, ``schedule``): the search keeps them.
    ray : str, optional
        Evaluate the tasks on the Ray cluster at this address (``local``, ``auto``,
        ``HOST:PORT``) instead of local processes; the same ranking either way.
    include : sequence of (ParallelConfig, ExecutionSettings)
        The LLM family also simulates these layouts (a user's own configuration, ``plan
        --baseline``), so the winner is never slower than them.

    Returns
    -------
    PlanSearch

    Notes
    -----
    The simulator decides (:func:`shardplan.simulate.simulate`, the same model every
    command uses): a candidate that does not fit in memory never wins, and the winner is
    never slower than any candidate the search evaluated, baselines included, by
    construction. Each task's searches (a partition, an optimal mapping) get an equal share
    of the time limit, and at most :data:`TASK_SECONDS`.
    """
    t0 = time.monotonic()
    if graph.num_nodes == 0:
        raise ShardplanError(f"graph {graph.name!r} has no nodes: nothing to plan")
    chosen = list(families or default_families(graph, topology))
    if topology.num_devices > (MAX_LLM_PLAN_DEVICES if chosen == ["llm"] else MAX_PLAN_DEVICES):
        raise ShardplanError(
            f"topology {topology.name!r} has {topology.num_devices} devices; plan searches "
            f"at most {MAX_LLM_PLAN_DEVICES} by the LLM family alone (a transformer) and "
            f"{MAX_PLAN_DEVICES} by the others (their candidates are priced from per-pair "
            f"matrices, O(devices^2) memory)")
    deadline = None if time_limit is None else t0 + time_limit * (1 - _SLACK)
    base = (settings or ExecutionSettings()).resolve(graph)
    batch = int(global_batch or graph.batch_size * topology.num_devices)
    if batch < 1:
        raise ShardplanError(f"the global batch must be a positive integer, got {batch}")
    fixed = dict(fixed or {})
    schedules = (fixed["schedule"],) if fixed.get("schedule") else \
        ("gpipe", "1f1b", "interleaved-1f1b")
    ctx = Context(graph, topology, batch, base, seed, schedules, fixed, tuple(include))
    tasks = tasks_for(ctx, chosen)
    n_workers = max(1, min(workers or min(os.cpu_count() or 1, 4), len(tasks)))
    share = TASK_SECONDS
    if time_limit is not None:  # every task's searches get an equal share of the limit
        share = min(share, time_limit * (1 - _SLACK) / max(1, math.ceil(len(tasks)
                                                                        / n_workers)))
    tasks = [replace(t, budget=max(share, 0.5)) for t in tasks]
    rows: list[Evaluated] = []
    errors: list[str] = []
    done = 0
    timed_out = False
    best = math.inf

    def report() -> None:
        if progress is not None:
            label = "candidates" if not math.isfinite(best) else \
                f"candidates (best {best * 1e3:.4g} ms/iteration)"
            progress(label, done, len(tasks))

    def take(out: tuple[list[Evaluated], str, bool]) -> None:
        nonlocal done, best, timed_out
        evaluated, err, cut = out
        timed_out = timed_out or cut
        rows.extend(evaluated)
        if err:
            errors.append(err)
        done += 1
        for r in evaluated:
            if r.fits:
                best = min(best, r.iteration_seconds)
        report()

    report()

    def handed_out(task: Task) -> Task:
        """The task with the seconds the search has left now (minus a grace to return)."""
        if deadline is None:
            return task
        left = deadline - time.monotonic() - _GRACE * (time_limit or 0.0)
        return replace(task, left=max(left, 0.0))

    if n_workers == 1 and ray is None:
        for task in tasks:
            if deadline is not None and time.monotonic() > deadline:
                timed_out = True
                break
            take(run_task(ctx, handed_out(task)))
    else:
        from shardplan._workers import executor

        _CTX["ctx"] = ctx  # inherited by forked workers (spawn, Ray: sent once instead)
        try:
            with executor(n_workers, ray=ray, initializer=_set_ctx, initargs=(ctx,)) as pool:
                queue = list(tasks)
                pending: set[Any] = set()
                # handed out as workers free up, so each task's seconds left are true
                while queue or pending:
                    while queue and len(pending) < n_workers:
                        pending.add(pool.submit(_worker_task, handed_out(queue.pop(0))))
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        timed_out = True
                        for f in pending:
                            f.cancel()
                        break
                    finished, pending = wait(pending, timeout=left,
                                             return_when=FIRST_COMPLETED)
                    for f in finished:
                        take(f.result())
                if timed_out:
                    raise _Stop
        except _Stop:
            pass
        finally:
            _CTX.clear()
    # ties broken by what the row is, not by when its task finished
    ranked = tuple(sorted(rows, key=lambda r: (*r.key, r.family, r.stages, r.replicas,
                                               r.schedule, r.microbatches, r.mapping,
                                               r.gradient_sync)))
    winner = None
    if ranked and ranked[0].fits and math.isfinite(ranked[0].iteration_seconds):
        winner = Plan.from_dict(ranked[0].plan)
    elif not timed_out:
        why = errors[0] if errors else "no candidate fits in device memory"
        raise InfeasibleError(f"no plan fits: {why}")
    return PlanSearch(ranked=ranked, winner=winner, seconds=time.monotonic() - t0,
                      timed_out=timed_out, errors=tuple(errors), global_batch=batch,
                      tasks=len(tasks), done=done, comparisons=_comparisons(ranked))


#: A transformer on more devices than this is searched by the LLM family alone by default
#: (the operator-graph families price every device pair, and their searches grow with it).
LLM_ONLY_DEVICES = 64


def default_families(graph: Graph, topology: Topology) -> tuple[str, ...]:
    """The families searched when none are named: all of them for a transformer (a graph
    with ``layers.N`` blocks) on at most :data:`LLM_ONLY_DEVICES` devices, the LLM family
    first (the one made for it: a time limit that stops the search leaves the operator-graph
    families unfinished, not it), the LLM family alone on more, and all but the LLM family
    for other graphs."""
    from shardplan.planner._llm import has_blocks

    others = tuple(f for f in FAMILIES if f != "llm")
    if not has_blocks(graph):
        return others
    if topology.num_devices > LLM_ONLY_DEVICES:
        return ("llm",)
    return ("llm", *others)


class _Stop(Exception):
    """Leave the pool's block by an exception, so its workers are terminated, not waited."""


def _set_ctx(ctx: Context) -> None:
    _CTX["ctx"] = ctx
