"""The families of candidate plans ``shardplan plan`` weighs, and how each is built.

A :class:`Task` is one piece of search a worker runs: one family at one shape (stages x
replicas), giving one or more plans, each simulated under several execution variants
(schedule x micro-batches, or gradient synchronisation for data parallelism). Every
evaluated variant is an :class:`Evaluated` row; the search ranks them by simulated time.
"""

from __future__ import annotations

import contextvars
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardplan.errors import ShardplanError, TimeLimitError
from shardplan.ir import ExecutionSettings, Graph, Objective, Plan, Stage, Topology

__all__ = ["FAMILIES", "Evaluated", "Task", "microbatch_choices", "run_task", "tasks_for"]

#: Families in the order the search lists them.
FAMILIES = ("data-parallel", "parmesan", "pipedream", "pipedream-sequence", "params",
            "uniform", "sharding", "pase", "hybrid")


@dataclass(frozen=True)
class Task:
    """One family at one shape; ``budget``: seconds its searches may take; ``left``: seconds
    the whole search had left when the task was handed out (its variants stop being
    simulated once they have passed; seconds, not a clock reading, so it travels to other
    machines)."""

    family: str
    stages: int = 1
    replicas: int = 1
    budget: float | None = None
    left: float | None = None

    @property
    def label(self) -> str:
        return f"{self.family} {self.stages}x{self.replicas}"


@dataclass(frozen=True)
class Evaluated:
    """One candidate plan under one execution variant, as the simulator saw it."""

    family: str
    algorithm: str
    stages: int
    replicas: int
    schedule: str
    microbatches: int
    mapping: str
    gradient_sync: str
    iteration_seconds: float
    throughput: float
    peak_memory_bytes: float
    fits: bool
    search_seconds: float
    plan: dict[str, Any]
    runnable: bool = True
    note: str = ""

    @property
    def key(self) -> tuple[float, float]:
        """Ranking key: infeasible last, then the simulated iteration, then memory."""
        return (self.iteration_seconds if self.fits else math.inf, self.peak_memory_bytes)

    def row(self) -> dict[str, Any]:
        """The JSON row (without the plan)."""
        return {k: getattr(self, k) for k in (
            "family", "algorithm", "stages", "replicas", "schedule", "microbatches", "mapping",
            "gradient_sync", "iteration_seconds", "throughput", "peak_memory_bytes", "fits",
            "search_seconds", "runnable", "note")}


@dataclass
class Context:
    """What every task needs: the inputs and the search's fixed settings."""

    graph: Graph
    topology: Topology
    global_batch: int
    base: ExecutionSettings
    seed: int = 0
    schedules: Sequence[str] = ("gpipe", "1f1b", "interleaved-1f1b")
    fixed: dict[str, Any] = field(default_factory=dict)


def microbatch_choices(global_batch: int, stages: int, replicas: int,
                       fixed: int | None = None) -> list[int]:
    """Micro-batch counts worth trying: ``M`` that divides the global batch into micro-batches
    the ``replicas`` can share evenly (what the runtime needs), among 1, 2, 4 for one stage
    and S, 2S, 4S, 8S for a pipeline (fewer micro-batches than stages leaves stages idle);
    the user's ``fixed`` count alone when given. O(1)."""
    if fixed is not None:
        return [fixed] if global_batch % fixed == 0 else []
    wanted = [1, 2, 4] if stages == 1 else [stages * f for f in (1, 2, 4, 8)]
    ok = [m for m in wanted if m <= global_batch and global_batch % m == 0
          and (global_batch // m) % replicas == 0]
    if not ok:  # any count that divides evenly, the fewest first
        ok = [m for m in range(1, global_batch + 1) if global_batch % m == 0
              and (global_batch // m) % replicas == 0][:1]
    return ok


def _settings(ctx: Context, m: int, **kw: Any) -> ExecutionSettings:
    s, _ = ctx.base.override(microbatches=m, microbatch_size=ctx.global_batch // m, **kw)
    return s


def tasks_for(ctx: Context, families: Sequence[str]) -> list[Task]:
    """Every (family, shape) to search: every ``S x R = D`` for the pipeline families,
    ``1 x D`` for data parallelism, one task for PipeDream's own optimizer, paper 000's
    partitioners and PaSE (which choose their own shapes). O(divisors of D)."""
    d = ctx.topology.num_devices
    n = ctx.graph.num_nodes
    shapes = [(s, d // s) for s in range(1, d + 1) if d % s == 0 and s <= n]
    out: list[Task] = []
    for fam in families:
        if fam == "data-parallel":
            out.append(Task(fam, 1, d))
        elif fam in ("parmesan", "pipedream-sequence", "params", "uniform"):
            out += [Task(fam, s, r) for s, r in shapes if s > 1]
        elif fam == "hybrid":  # one stage is PaSE's, one device per stage a plain pipeline
            out += [Task(fam, s, r) for s, r in shapes if s > 1 and r > 1]
        elif fam in ("pipedream", "pase", "sharding"):
            out.append(Task(fam, 0, 0))
        else:
            raise ShardplanError(f"unknown plan family {fam!r} (choose from "
                                 f"{', '.join(FAMILIES)})")
    return out


# ------------------------------------------------------------------------ evaluation
def _simulate(plan: Plan, ctx: Context) -> tuple[float, float, bool]:
    from shardplan.simulate import simulate

    res = simulate(plan, ctx.graph, ctx.topology, timeline=False,
                   deadline=_deadline())
    peak = max(res.peak_memory_bytes)
    return res.iteration_seconds, peak, bool(res.fits_memory)


@dataclass
class _TaskClock:
    """The deadline of the task running in this process (``time.monotonic()``, None: no
    limit), set by :func:`run_task` from :attr:`Task.left`, and whether it left variants
    out."""

    end: float | None
    cut: bool = False


_TASK: contextvars.ContextVar[_TaskClock | None] = contextvars.ContextVar(
    "shardplan_task", default=None)


def _deadline() -> float | None:
    clock = _TASK.get()
    return None if clock is None else clock.end


def _mark_cut() -> None:
    clock = _TASK.get()
    if clock is not None:
        clock.cut = True


def _past_deadline() -> bool:
    end = _deadline()
    return end is not None and time.monotonic() > end


def _variants(ctx: Context, plan: Plan, *, family: str, mapping: str, searched: float,
              schedules: Sequence[str] | None = None, syncs: Sequence[str] = ("end",),
              runnable: bool = True, note: str = "") -> list[Evaluated]:
    """``plan`` simulated under every schedule x micro-batch count x gradient sync that
    fits it; one row each. Once the task's deadline has passed, the variants not yet
    simulated are left out, and a simulation still running at it stops (its row too)."""
    s, r = plan.num_stages, plan.num_replicas
    out: list[Evaluated] = []
    scheds = list(schedules if schedules is not None else ctx.schedules)
    if s == 1:
        scheds = ["gpipe"]  # one stage: every schedule is the same
    for sched in scheds:
        if sched == "interleaved-1f1b" and (s < 4 or s % 2):
            continue
        for m in microbatch_choices(ctx.global_batch, s, max(r, 1) if runnable else 1,
                                    ctx.fixed.get("microbatches")):
            if sched == "interleaved-1f1b" and m % max(1, m // (s // 2)):
                continue  # torch's interleaved 1F1B runs M in whole rounds of S / 2
            for sync in syncs:
                if _past_deadline():
                    _mark_cut()
                    return out
                try:
                    settings = _settings(ctx, m, schedule=sched, gradient_sync=sync)
                    p = plan.with_settings(settings)
                    secs, peak, fits = _simulate(p, ctx)
                except TimeLimitError:
                    _mark_cut()
                    return out
                except ShardplanError as exc:
                    out.append(Evaluated(family, plan.algorithm, s, r, sched, m, mapping, sync,
                                         math.inf, 0.0, math.inf, False, searched, {},
                                         runnable, note=str(exc)))
                    continue
                out.append(Evaluated(family, plan.algorithm, s, r, sched, m, mapping, sync,
                                     secs, ctx.global_batch / secs if secs > 0 else math.inf,
                                     peak, fits, searched, p.to_dict(), runnable, note))
    return out


def _partition(ctx: Context, algorithm: str, task: Task, **options: Any) -> Plan:
    from shardplan import registry

    m = microbatch_choices(ctx.global_batch, max(task.stages, 1), max(task.replicas, 1),
                           ctx.fixed.get("microbatches"))
    m0 = m[len(m) // 2] if m else 1
    settings = _settings(ctx, m0, schedule="1f1b" if task.stages > 1 else "gpipe")
    opts = {k: v for k, v in settings.to_dict().items() if k != "global_batch"}
    if task.stages:
        opts.update(stages=task.stages, replicas=task.replicas)
    opts.update(options)
    return registry.run("partition", algorithm, ctx.graph, ctx.topology, seed=ctx.seed,
                        time_limit=task.budget, **opts).plan


def _mapped(ctx: Context, plan: Plan, budget: float | None) -> Plan | None:
    """The optimal mapping of ``plan`` (the simulator judging it against consecutive), or
    None when it cannot be mapped."""
    from shardplan import registry

    try:
        return registry.run("map", "optimal", ctx.graph, ctx.topology, plan=plan,
                            time_limit=budget, seed=ctx.seed).plan
    except ShardplanError:
        return None


def _data_parallel(ctx: Context, task: Task) -> list[Evaluated]:
    g, d = ctx.graph, ctx.topology.num_devices
    plan = Plan(graph=g.name, topology=ctx.topology.name, algorithm="data-parallel",
                stages=(Stage(tuple(range(g.num_nodes)), tuple(range(d))),),
                objective=Objective("max_stage_seconds_overlap", 0.0), status="feasible")
    syncs = ["end", "bucketed", "sharded"] if d > 1 else ["end"]
    return _variants(ctx, plan, family="data-parallel", mapping="consecutive",
                     searched=0.0, syncs=syncs)


def _pipeline(ctx: Context, task: Task, algorithm: str, *, optimal_map: bool) -> list[Evaluated]:
    t0 = time.perf_counter()
    plan = _partition(ctx, algorithm, task)
    searched = time.perf_counter() - t0
    out = _variants(ctx, plan, family=task.family, mapping="consecutive", searched=searched)
    if optimal_map and plan.num_stages * plan.num_replicas > 1 and not _past_deadline():
        mapped = _mapped(ctx, plan, None if task.budget is None else task.budget / 2)
        if mapped is not None:
            searched = time.perf_counter() - t0
            kept = mapped.meta.get("judge", {}).get("kept", "optimal")
            out += _variants(ctx, mapped, family=task.family,
                             mapping="optimal" if kept == "optimal" else "consecutive*",
                             searched=searched)
    return out


def _pipedream(ctx: Context, task: Task) -> list[Evaluated]:
    t0 = time.perf_counter()
    plan = _partition(ctx, "pipedream", task)
    reps = {len(st.devices) for st in plan.stages}
    return _variants(ctx, plan, family="pipedream", mapping="pipedream",
                     searched=time.perf_counter() - t0, runnable=len(reps) == 1,
                     note="" if len(reps) == 1 else
                     "stages differ in replica count: the runtime cannot run it")


def _sharding(ctx: Context, task: Task) -> list[Evaluated]:
    """Paper 000's local search under the acyclicity constraint (its components in an order
    data flows forward through), run as a GPipe pipeline of one device per component."""
    from shardplan import registry

    t0 = time.perf_counter()
    plan = registry.run("partition", "heuristic", ctx.graph, ctx.topology, seed=ctx.seed,
                        time_limit=task.budget or 10.0, acyclic=True).plan
    return _variants(ctx, plan, family="sharding", mapping="sharding",
                     searched=time.perf_counter() - t0, schedules=("gpipe",))


def _pase(ctx: Context, task: Task) -> list[Evaluated]:
    from shardplan import registry

    t0 = time.perf_counter()
    plan = registry.run("strategy", "pase", ctx.graph, ctx.topology, seed=ctx.seed,
                        time_limit=task.budget, cost_model="default").plan
    return _variants(ctx, plan, family="pase", mapping="pase",
                     searched=time.perf_counter() - t0, schedules=("gpipe",))


def _hybrid(ctx: Context, task: Task) -> list[Evaluated]:
    """Parmesan's S stages over R devices each, every stage's layers split over its devices
    by PaSE's best configurations (pipeline x tensor/data parallelism) instead of R
    data-parallel replicas."""
    from shardplan.strategy import hybrid_plan

    t0 = time.perf_counter()
    budget = None if task.budget is None else task.budget / 2
    pipeline = _partition(ctx, "parmesan", Task("parmesan", task.stages, task.replicas, budget))
    plan = hybrid_plan(pipeline, ctx.graph, ctx.topology, time_limit=budget,
                       options={"cost_model": "default"})
    return _variants(ctx, plan, family="hybrid", mapping="consecutive",
                     searched=time.perf_counter() - t0)


_RUNNERS: dict[str, Callable[[Context, Task], list[Evaluated]]] = {
    "data-parallel": _data_parallel,
    "parmesan": lambda c, t: _pipeline(c, t, "parmesan", optimal_map=True),
    "pipedream-sequence": lambda c, t: _pipeline(c, t, "pipedream-sequence", optimal_map=True),
    "params": lambda c, t: _pipeline(c, t, "params", optimal_map=False),
    "uniform": lambda c, t: _pipeline(c, t, "uniform", optimal_map=False),
    "pipedream": _pipedream,
    "sharding": _sharding,
    "pase": _pase,
    "hybrid": _hybrid,
}


def run_task(ctx: Context, task: Task) -> tuple[list[Evaluated], str, bool]:
    """Build and simulate the task's plans; an error becomes the second value (one line);
    the third is True when the task's deadline (:attr:`Task.left`) left variants out."""
    clock = _TaskClock(None if task.left is None else time.monotonic() + task.left)
    token = _TASK.set(clock)
    try:
        return _RUNNERS[task.family](ctx, task), "", clock.cut
    except ShardplanError as exc:
        return [], f"{task.label}: {exc}", clock.cut
    finally:
        _TASK.reset(token)

