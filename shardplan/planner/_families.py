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
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from shardplan.errors import ShardplanError, TimeLimitError
from shardplan.ir import ExecutionSettings, Graph, Objective, Plan, Stage, Topology

__all__ = ["FAMILIES", "Evaluated", "Task", "microbatch_choices", "run_task", "shape_label",
           "tasks_for"]

#: Families in the order the search lists them.
FAMILIES = ("data-parallel", "parmesan", "pipedream", "pipedream-sequence", "params",
            "uniform", "sharding", "pase", "hybrid", "llm")


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
    #: One execution variant of a strategy search (PaSE: a search per micro-batch count
    #: and gradient sync); 0 and "": every variant in one task.
    microbatches: int = 0
    gradient_sync: str = ""

    @property
    def label(self) -> str:
        variant = f" M={self.microbatches} {self.gradient_sync}" if self.microbatches else ""
        return f"{self.family} {self.stages}x{self.replicas}{variant}"


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
    objective: str = ""
    objective_value: float = math.nan

    @property
    def key(self) -> tuple[float, float]:
        """Ranking key: infeasible last, then the simulated iteration, then memory."""
        return (self.iteration_seconds if self.fits else math.inf, self.peak_memory_bytes)

    @property
    def objective_over_simulated(self) -> float | None:
        """The planner's own estimate of the iteration over the simulated one, for plans
        whose objective is an iteration time (PaSE and the hybrid in the simulator's price,
        :mod:`shardplan.strategy._price`); None for objectives of another quantity (a
        pipeline stage's seconds, paper 000's sharding cost)."""
        if self.objective not in _ITERATION_OBJECTIVES or not self.iteration_seconds > 0 \
                or not math.isfinite(self.iteration_seconds):
            return None
        return float(self.objective_value) / self.iteration_seconds

    def row(self) -> dict[str, Any]:
        """The JSON row (without the plan)."""
        out = {k: getattr(self, k) for k in (
            "family", "algorithm", "stages", "replicas", "schedule", "microbatches", "mapping",
            "gradient_sync", "iteration_seconds", "throughput", "peak_memory_bytes", "fits",
            "search_seconds", "runnable", "note")}
        out["replicas_per_stage"] = _replicas_per_stage(self.plan)
        out["objective"] = {"name": self.objective, "value": self.objective_value,
                            "over_simulated": self.objective_over_simulated}
        return out


def shape_label(row: Evaluated) -> str:
    """``S x R``, or ``S x [r0, r1, ...]`` when the stages differ in replica count (a
    PipeDream plan: ``4 x [10, 2, 2, 2]``, which ``4 x 10`` misread as 40 devices)."""
    reps = _replicas_per_stage(row.plan)
    if reps and len(set(reps)) > 1:
        return f"{row.stages} x [{', '.join(map(str, reps))}]"
    return f"{row.stages} x {row.replicas}"


#: Objectives that estimate one iteration's seconds (comparable to the simulated time).
_ITERATION_OBJECTIVES = ("iteration_seconds",)


def _replicas_per_stage(plan: dict[str, Any]) -> list[int]:
    """Devices of every stage of a plan's JSON form (empty without one)."""
    return [len(st.get("devices", ())) for st in plan.get("stages", ())]


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
    #: The LLM family: the user's own configurations (``plan --baseline``), searched too.
    include: tuple[Any, ...] = ()


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
    ``1 x D`` for data parallelism, one task for PipeDream's own optimizer and paper 000's
    partitioners (which choose their own shapes), and one per execution variant for PaSE
    (its search prices the micro-batch count and gradient sync it runs with).
    O(divisors of D)."""
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
        elif fam == "pase":  # one search per execution variant, each its own budget
            out += [Task(fam, 0, 0, microbatches=v.microbatches,
                         gradient_sync=v.gradient_sync) for v in _strategy_runs(ctx, 1)]
        elif fam in ("pipedream", "sharding", "llm"):
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
              runnable: bool = True, note: str = "",
              microbatches: Sequence[int] | None = None) -> list[Evaluated]:
    """``plan`` simulated under every schedule x micro-batch count x gradient sync that
    fits it (``microbatches``: only these counts: a plan searched for one; a gradient sync
    the user fixed replaces ``syncs``); one row each.
    Once the task's deadline has passed, the variants not yet simulated are left out, and a
    simulation still running at it stops (its row too)."""
    s, r = plan.num_stages, plan.num_replicas
    out: list[Evaluated] = []
    if ctx.fixed.get("gradient_sync"):  # the user's --gradient-sync: that one alone
        syncs = (str(ctx.fixed["gradient_sync"]),)
    scheds = list(schedules if schedules is not None else ctx.schedules)
    if s == 1:
        scheds = ["gpipe"]  # one stage: every schedule is the same
    for sched in scheds:
        if sched == "interleaved-1f1b" and (s < 4 or s % 2):
            continue
        counts = microbatch_choices(ctx.global_batch, s, max(r, 1) if runnable else 1,
                                    ctx.fixed.get("microbatches")) \
            if microbatches is None else list(microbatches)
        for m in counts:
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
                                     peak, fits, searched, p.to_dict(), runnable, note,
                                     plan.objective.name, float(plan.objective.value)))
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


def sharding_inputs(ctx: Context, settings: ExecutionSettings) -> tuple[Graph, Topology]:
    """Paper 000's objective in the simulator's quantities: each node weighs its forward and
    backward seconds under the cost model the simulator uses (at the micro-batch size and
    precision the plan runs), divided by ``sqrt(T / k)`` for ``T`` the graph's total and
    ``k`` the components, so that the weight term, ``sum_i (W_i - mean W)^2``, reads
    ``sum_i (t_i - T / k)^2 / (T / k)`` in seconds; the cost matrix charges a cut edge the
    seconds its pair of devices takes to move one micro-batch's mean edge tensor (latency
    plus bytes over bandwidth), both ways. The paper's own inputs (parameter counts,
    latencies) balance parameters, which is right for reproducing its figures and wrong for
    a fast pipeline: the simulator ranked its partitions in reverse (issue 33). O(n + m +
    D^2)."""
    import dataclasses

    from shardplan.cost import CostModel

    cm = CostModel.from_settings(ctx.graph, ctx.topology, settings)
    fwd, bwd = cm.node_seconds(0)
    work = np.asarray(fwd + bwd, dtype=np.float64)
    k = max(1, min(ctx.topology.num_devices, ctx.graph.num_nodes))
    scale = math.sqrt(max(float(work.sum()) / k, 1e-30))
    graph = ctx.graph.replace(weight=work / scale)
    mean_bytes = float(np.mean(cm.graph.edge_bytes)) if cm.graph.num_edges else 0.0
    lat = np.asarray(ctx.topology.latency, dtype=np.float64)
    cost = 2.0 * (lat + mean_bytes * cm.inverse_bandwidth)
    np.fill_diagonal(cost, 0.0)
    cost = np.where(np.isfinite(cost), cost, 1e9)  # an unusable pair: never cut across it
    return graph, dataclasses.replace(ctx.topology, cost=cost)


def _sharding(ctx: Context, task: Task) -> list[Evaluated]:
    """Paper 000's local search under the acyclicity constraint (its components in an order
    data flows forward through), run as a GPipe pipeline of one device per component; its
    objective in the simulator's quantities (:func:`sharding_inputs`)."""
    from shardplan import registry

    t0 = time.perf_counter()
    counts = microbatch_choices(ctx.global_batch, max(1, min(ctx.topology.num_devices,
                                                            ctx.graph.num_nodes)), 1,
                                ctx.fixed.get("microbatches"))
    m0 = counts[len(counts) // 2] if counts else 1
    graph, topo = sharding_inputs(ctx, _settings(ctx, m0, schedule="gpipe"))
    plan = registry.run("partition", "heuristic", graph, topo, seed=ctx.seed,
                        time_limit=task.budget or 10.0, acyclic=True).plan
    return _variants(ctx, plan, family="sharding", mapping="sharding",
                     searched=time.perf_counter() - t0, schedules=("gpipe",))


def _strategy_runs(ctx: Context, stages: int) -> list[ExecutionSettings]:
    """The execution variants a strategy search is priced at, one search each: every
    micro-batch count worth trying (:func:`microbatch_choices`; a stage's devices run each
    micro-batch together) under the gradient syncs a strategy run has (``end``, and DDP's
    overlapped ``bucketed`` on more than one device); the user's fixed settings alone when
    given. O(1)."""
    d = ctx.topology.num_devices
    syncs = ["end", "bucketed"] if d > 1 and stages == 1 else ["end"]
    if ctx.fixed.get("gradient_sync") in ("end", "bucketed"):
        syncs = [str(ctx.fixed["gradient_sync"])]
    schedule = "gpipe" if stages == 1 else "1f1b"
    return [_settings(ctx, m, schedule=schedule, gradient_sync=sync)
            for m in microbatch_choices(ctx.global_batch, stages, 1,
                                        ctx.fixed.get("microbatches"))
            for sync in syncs]


def _pase(ctx: Context, task: Task) -> list[Evaluated]:
    """PaSE's search on every device, priced as the simulator judges the plan
    (:mod:`shardplan.strategy._price`: at the micro-batch size, precision and gradient sync
    the plan runs with); one search per execution variant, each simulated under its own
    settings."""
    from shardplan import registry

    runs = _strategy_runs(ctx, 1)
    if task.microbatches:
        runs = [r for r in runs if (r.microbatches, r.gradient_sync)
                == (task.microbatches, task.gradient_sync)]
    out: list[Evaluated] = []
    for settings in runs:
        if _past_deadline():
            _mark_cut()
            break
        t0 = time.perf_counter()
        budget = None if task.budget is None else task.budget / len(runs)
        plan = registry.run("strategy", "pase", ctx.graph, ctx.topology, seed=ctx.seed,
                            time_limit=budget, cost_model="default",
                            execution=settings.to_dict()).plan
        out += _variants(ctx, plan, family="pase", mapping="pase",
                         searched=time.perf_counter() - t0, schedules=("gpipe",),
                         syncs=(settings.gradient_sync,),
                         microbatches=(settings.microbatches,))
    return out


def _hybrid(ctx: Context, task: Task) -> list[Evaluated]:
    """Parmesan's S stages over R devices each (in the order of the optimal mapping, where
    the simulator keeps it), every stage's layers split over its devices by PaSE's best
    configurations (pipeline x tensor/data parallelism; a batch split over all R is the
    replicated stage), searched in the simulator's price at each micro-batch count the
    variants run; per stage, PaSE's or the all-batch configurations, whichever the
    simulator finds faster (:func:`_stage_choice`)."""
    from shardplan.strategy import hybrid_plan

    t0 = time.perf_counter()
    budget = None if task.budget is None else task.budget / 2
    pipeline = _partition(ctx, "parmesan", Task("parmesan", task.stages, task.replicas, budget))
    mapping = "consecutive"
    if pipeline.num_stages * pipeline.num_replicas > 1 and not _past_deadline():
        # the stages' devices in the order the optimal mapping gives Parmesan's replicas
        # (a box's ring order): the same devices its replicated rows run on
        mapped = _mapped(ctx, pipeline, None if budget is None else budget / 4)
        if mapped is not None and mapped.meta.get("judge", {}).get("kept",
                                                                     "optimal") == "optimal":
            pipeline, mapping = replace(pipeline, stages=mapped.stages), "optimal"
    runs = _strategy_runs(ctx, task.stages)
    out: list[Evaluated] = []
    for settings in runs:
        if _past_deadline():
            _mark_cut()
            break
        options = {"cost_model": "default", "execution": settings.to_dict()}
        plan = hybrid_plan(pipeline.with_settings(settings), ctx.graph, ctx.topology,
                           time_limit=None if budget is None else budget / len(runs),
                           options=options)
        # every layer split by the batch over all R devices, however few samples each
        # gets (PaSE's cutoff keeps 4 per device): the stage's replicas
        replicated = hybrid_plan(pipeline.with_settings(settings), ctx.graph, ctx.topology,
                                 algorithm="data-parallel", options={**options, "cutoff": 1})
        plan = _stage_choice(ctx, plan, replicated)
        cut = plan.meta.get("hybrid", {}).get("timed_out_stages", [])
        out += _variants(ctx, plan, family="hybrid", mapping=mapping,
                         searched=time.perf_counter() - t0,
                         microbatches=(settings.microbatches,),
                         note=f"the time limit cut the strategy search of stages {cut} "
                              f"short" if cut else "")
    return out


def _stage_choice(ctx: Context, pase: Plan, replicated: Plan) -> Plan:
    """Per stage, PaSE's configurations or every layer split by the batch over the stage's
    devices (the replicated stage, whose boundaries travel in batch shards), whichever the
    simulator finds faster with the other stages fixed: greedy over the stages from the
    faster of the two whole plans. A per-stage search sees neither what reading another
    stage's shards costs nor how the pipeline hides a stage's gradient all-reduce behind
    the other stages' backward, so its own price can prefer a stage layout the pipeline
    runs slower than the replicated one. The plan returned records its simulated iteration
    as its objective, and per stage which was kept (``meta["hybrid"]["stage_choice"]``).
    S + 2 simulations; PaSE's plan unchanged when the task's deadline stops them."""
    try:
        timed = [(_simulate(p, ctx), p) for p in (pase, replicated)]
        (secs, _, fits), best = min(timed, key=lambda t: (not t[0][2], t[0][0]))
        kinds = ["pase" if best is pase else "all-batch"] * best.num_stages
        other = replicated if best is pase else pase
        for k, st in enumerate(best.stages):
            trial = dict(best.strategy or {})
            trial.update({str(v): (other.strategy or {})[str(v)] for v in st.nodes})
            cand = replace(best, strategy=trial)
            c_secs, _, c_fits = _simulate(cand, ctx)
            if (not c_fits, c_secs) < (not fits, secs):
                best, secs, fits = cand, c_secs, c_fits
                kinds[k] = "all-batch" if kinds[k] == "pase" else "pase"
    except (TimeLimitError, ShardplanError):
        return pase
    meta = dict(pase.meta)
    meta["hybrid"] = {**dict(meta.get("hybrid", {})), "stage_choice": kinds}
    return replace(best, meta=meta, status=pase.status,
                   objective=Objective("iteration_seconds", secs, None))


#: Seconds the LLM family searches when the search has no time limit (with the capture of
#: a 1T-parameter GPT on the meta device, a plan command on 3,072 GPUs returns in a minute).
LLM_SECONDS = 35.0


def _llm(ctx: Context, task: Task) -> list[Evaluated]:
    """The LLM plan kind (tensor x pipeline x data parallelism of a transformer's blocks,
    :mod:`shardplan.planner._llm`): its branch-and-bound search in the simulator's price, the
    best layouts that fit (and the user's own) as rows."""
    from shardplan.planner._llm import family_rows, has_blocks

    if not has_blocks(ctx.graph):
        raise ShardplanError("the graph has no transformer blocks (layers.N modules) to lay "
                             "out")
    base = ctx.base
    if ctx.fixed.get("gradient_sync"):
        base = replace(base, gradient_sync=str(ctx.fixed["gradient_sync"]))
    left = LLM_SECONDS if task.left is None else max(task.left, 0.0)
    fixed = ctx.fixed.get("microbatches")
    rows = family_rows(ctx.graph, ctx.topology, base, global_batch=ctx.global_batch,
                       time_limit=left, include=ctx.include,
                       microbatches=int(fixed) if fixed else None)
    if [r.pop("timed_out") for r in rows][:1] == [True] or (
            not rows and (left <= 0.0 or _past_deadline())):
        _mark_cut()  # a limit spent before any layout was simulated is a cut, not "no fit"
    return [Evaluated(family="llm", algorithm="llm", objective="iteration_seconds", **r)
            for r in rows]


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
    "llm": _llm,
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

