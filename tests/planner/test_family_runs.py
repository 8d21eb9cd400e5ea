"""What each plan family of ``shardplan plan`` builds and simulates (issue 38), held against
a stand-in simulator whose times follow from the settings it is handed and a stand-in
registry that records what the families ask of the algorithms: the variants each plan is
simulated under, exactly; what a family passes to its partitioner, mapper or strategy
search; how the task's deadline and the simulator's refusals shape the rows."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from shardplan import registry
from shardplan.errors import ShardplanError, TimeLimitError
from shardplan.generate import layered
from shardplan.ir import ExecutionSettings, Objective, Plan, Stage
from shardplan.planner import _families
from shardplan.planner._families import Context, Task, microbatch_choices, run_task
from shardplan.topology import build


def _ctx(devices: int = 4, batch: int = 32, nodes: int = 8, seed: int = 0) -> Context:
    g = layered(num_nodes=nodes, width=1, seed=0)
    return Context(g, build("flat", num_devices=devices), batch,
                   ExecutionSettings().resolve(g), seed=seed)


def _plan(stage_devices: list[int], nodes: int = 8, algorithm: str = "uniform") -> Plan:
    """``len(stage_devices)`` stages over consecutive nodes and devices; its objective a
    stage's 0.25 s."""
    per, first, stages = -(-nodes // len(stage_devices)), 0, []
    for k, d in enumerate(stage_devices):
        stages.append(Stage(tuple(range(k * per, min(nodes, (k + 1) * per))),
                            tuple(range(first, first + d))))
        first += d
    return Plan(graph="layered-8", topology="flat-4", algorithm=algorithm,
                stages=tuple(stages), objective=Objective("max_stage_seconds", 0.25))


class _Clock:
    """Stands in for the ``time`` module: ``monotonic`` and ``perf_counter`` read ``now``."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now


def _seconds(m: int) -> float:
    return 1.0 + m / 16


class _Sim:
    """Stands in for ``_families._simulate``: records (schedule, M, sync, micro-batch size)
    and returns 1 + M / 16 seconds, 1000 M bytes, fitting below M = 8; ``raise_at``: call
    number -> exception; ``step``: seconds each call moves ``clock`` on."""

    def __init__(self, clock: _Clock | None = None, step: float = 0.0,
                 raise_at: dict[int, Exception] | None = None) -> None:
        self.calls: list[tuple[str, int, str, int | None]] = []
        self.plans: list[Plan] = []
        self.clock, self.step, self.raise_at = clock, step, raise_at or {}

    def __call__(self, plan: Plan, ctx: Context) -> tuple[float, float, bool]:
        s = plan.settings
        self.calls.append((s.schedule, s.microbatches, s.gradient_sync, s.microbatch_size))
        self.plans.append(plan)
        if self.clock is not None:
            self.clock.now += self.step
        if len(self.calls) in self.raise_at:
            raise self.raise_at[len(self.calls)]
        return _seconds(s.microbatches), 1000.0 * s.microbatches, s.microbatches < 8


@pytest.fixture
def sim(monkeypatch) -> _Sim:
    fake = _Sim()
    monkeypatch.setattr(_families, "_simulate", fake)
    return fake


def _variants(rows) -> list[tuple[str, int, str]]:
    return [(r.schedule, r.microbatches, r.gradient_sync) for r in rows]


# ------------------------------------------------------------------------- variants
def test_a_pipeline_is_simulated_under_every_schedule_count_and_sync(sim) -> None:
    """Four stages: GPipe, 1F1B and interleaved 1F1B at 4, 8, 16 and 32 micro-batches of the
    32 samples, under each sync asked for; every row carries what its simulation said and
    a plan that runs exactly that variant."""
    ctx = _ctx()
    plan = _plan([1, 1, 1, 1])
    rows = _families._variants(ctx, plan, family="uniform", mapping="consecutive",
                               searched=0.5, syncs=("end", "bucketed"))
    want = [(sc, m, sy) for sc in ("gpipe", "1f1b", "interleaved-1f1b")
            for m in (4, 8, 16, 32) for sy in ("end", "bucketed")]
    assert _variants(rows) == want
    assert sim.calls == [(sc, m, sy, 32 // m) for sc, m, sy in want]
    for r in rows:
        m = r.microbatches
        assert (r.family, r.algorithm, r.stages, r.replicas, r.mapping) == \
            ("uniform", "uniform", 4, 1, "consecutive")
        assert r.iteration_seconds == _seconds(m)
        assert r.throughput == 32 / _seconds(m)
        assert (r.peak_memory_bytes, r.fits) == (1000.0 * m, m < 8)
        assert (r.search_seconds, r.runnable, r.note) == (0.5, True, "")
        assert (r.objective, r.objective_value) == ("max_stage_seconds", 0.25)
        got = Plan.from_dict(r.plan)
        assert got.stages == plan.stages
        s = got.settings
        assert (s.schedule, s.microbatches, s.microbatch_size, s.gradient_sync) == \
            (r.schedule, m, 32 // m, r.gradient_sync)


def test_the_context_gives_the_schedules_and_syncs_default_to_the_end(sim) -> None:
    ctx = _ctx()
    ctx.schedules = ("1f1b",)
    rows = _families._variants(ctx, _plan([1, 1]), family="f", mapping="m", searched=0.0)
    assert _variants(rows) == [("1f1b", m, "end") for m in (2, 4, 8, 16)]
    rows = _families._variants(ctx, _plan([1, 1]), family="f", mapping="m", searched=0.0,
                               schedules=("gpipe",))
    assert _variants(rows) == [("gpipe", m, "end") for m in (2, 4, 8, 16)]


def test_one_stage_runs_gpipe_alone_at_counts_its_replicas_share(sim) -> None:
    """One stage of 4 devices: every schedule is GPipe; of 1, 2, 4 micro-batches of 8
    samples only 1 and 2 leave the 4 replicas whole shares, unless the plan is not runnable
    (its replicas are not the runtime's), when 4 is tried too."""
    ctx = _ctx(batch=8)
    plan = _plan([4])
    rows = _families._variants(ctx, plan, family="f", mapping="m", searched=0.0,
                               schedules=("1f1b", "interleaved-1f1b"))
    assert _variants(rows) == [("gpipe", 1, "end"), ("gpipe", 2, "end")]
    rows = _families._variants(ctx, plan, family="f", mapping="m", searched=0.0,
                               runnable=False, note="uneven")
    assert _variants(rows) == [("gpipe", m, "end") for m in (1, 2, 4)]
    assert all(not r.runnable and r.note == "uneven" for r in rows)
    rows = _families._variants(ctx, plan, family="f", mapping="m", searched=0.0,
                               microbatches=(4, 2))
    assert _variants(rows) == [("gpipe", 4, "end"), ("gpipe", 2, "end")]


def test_one_replica_per_stage_shares_nothing(sim) -> None:
    """Two stages of one device: 2, 4, 8, 16 micro-batches of 16 samples (a count is offered
    when the replicas share its micro-batches: one replica always does)."""
    rows = _families._variants(_ctx(batch=16), _plan([1, 1]), family="f", mapping="m",
                               searched=0.0, schedules=("gpipe",))
    assert [r.microbatches for r in rows] == [2, 4, 8, 16]


@pytest.mark.parametrize("devices, batch, fixed, interleaved", [
    ([1, 1], 32, None, []),                  # two stages: too few to interleave
    ([1, 1, 1, 1, 1], 40, None, []),         # five: an odd count
    ([1, 1, 1, 1], 40, 5, []),               # 5 micro-batches are not whole rounds of 2
    ([1, 1, 1, 1], 24, 6, [6]),              # 6 are 3 rounds of 2
    ([1, 1, 1, 1], 24, 3, [3]),              # 3: one round (torch's rule)
    ([1, 1, 1, 1, 1, 1], 36, 9, [9]),        # 9: 3 rounds of 3
    ([1, 1, 1, 1, 1, 1], 40, 10, []),        # 10: 3 rounds of 3 leave 1 over
])
def test_interleaving_needs_an_even_pipeline_and_whole_rounds(sim, devices, batch, fixed,
                                                              interleaved) -> None:
    ctx = _ctx(devices=sum(devices), batch=batch, nodes=8)
    if fixed is not None:
        ctx.fixed = {"microbatches": fixed}
    rows = _families._variants(ctx, _plan(devices), family="f", mapping="m", searched=0.0)
    counts = [fixed] if fixed is not None else microbatch_choices(batch, len(devices), 1)
    assert [r.microbatches for r in rows if r.schedule == "gpipe"] == counts
    assert [r.microbatches for r in rows if r.schedule == "1f1b"] == counts
    assert [r.microbatches for r in rows if r.schedule == "interleaved-1f1b"] == interleaved


def test_the_users_gradient_sync_replaces_the_familys(sim) -> None:
    ctx = _ctx(batch=8)
    ctx.fixed = {"gradient_sync": "sharded", "microbatches": 2}
    rows = _families._variants(ctx, _plan([4]), family="f", mapping="m", searched=0.0,
                               syncs=("end", "bucketed"))
    assert _variants(rows) == [("gpipe", 2, "sharded")]


def test_a_variant_the_simulator_refuses_is_a_row_that_does_not_fit(monkeypatch) -> None:
    fake = _Sim(raise_at={2: ShardplanError("no room for it")})
    monkeypatch.setattr(_families, "_simulate", fake)
    rows = _families._variants(_ctx(batch=8), _plan([4]), family="f", mapping="m",
                               searched=1.5, schedules=("gpipe",), runnable=False)
    assert _variants(rows) == [("gpipe", 1, "end"), ("gpipe", 2, "end"), ("gpipe", 4, "end")]
    bad = rows[1]
    assert (bad.family, bad.algorithm, bad.stages, bad.replicas, bad.mapping) == \
        ("f", "uniform", 1, 4, "m")
    assert (bad.iteration_seconds, bad.throughput, bad.peak_memory_bytes, bad.fits) == \
        (math.inf, 0.0, math.inf, False)
    assert (bad.search_seconds, bad.plan, bad.runnable, bad.note) == \
        (1.5, {}, False, "no room for it")
    assert bad.objective == "" and math.isnan(bad.objective_value)
    assert rows[2].fits and rows[2].plan


@pytest.mark.parametrize("seconds, throughput", [(0.0, math.inf), (0.5, 16.0)])
def test_throughput_is_the_batch_over_the_iteration(monkeypatch, seconds, throughput) -> None:
    """8 samples in 0.5 s: 16 a second; an iteration of no time has no finite throughput."""
    monkeypatch.setattr(_families, "_simulate", lambda plan, ctx: (seconds, 1.0, True))
    rows = _families._variants(_ctx(batch=8), _plan([4]), family="f", mapping="m",
                               searched=0.0, microbatches=(1,))
    assert [r.throughput for r in rows] == [throughput]


def _with_clock(monkeypatch, end: float | None, sim: _Sim):
    clock = sim.clock
    monkeypatch.setattr(_families, "time", clock)
    monkeypatch.setattr(_families, "_simulate", sim)
    task = _families._TaskClock(end)
    return task, _families._TASK.set(task)


def test_the_deadline_leaves_the_variants_not_yet_simulated_out(monkeypatch) -> None:
    """Each simulation takes 1 s of a task whose deadline is 3 s away: the 4th starts at
    3 s (not past it) and is kept; the 5th would start past it, and is left out."""
    sim = _Sim(_Clock(), step=1.0)
    task, token = _with_clock(monkeypatch, 3.0, sim)
    try:
        rows = _families._variants(_ctx(), _plan([1, 1, 1, 1]), family="f", mapping="m",
                                   searched=0.0)
    finally:
        _families._TASK.reset(token)
    assert _variants(rows) == [("gpipe", m, "end") for m in (4, 8, 16, 32)]
    assert task.cut
    task, token = _with_clock(monkeypatch, None, _Sim(_Clock(), step=1.0))
    try:
        rows = _families._variants(_ctx(), _plan([1, 1, 1, 1]), family="f", mapping="m",
                                   searched=0.0)
    finally:
        _families._TASK.reset(token)
    assert len(rows) == 12 and not task.cut


def test_a_simulation_stopped_by_the_deadline_ends_the_task(monkeypatch) -> None:
    sim = _Sim(_Clock(), raise_at={3: TimeLimitError("deadline")})
    task, token = _with_clock(monkeypatch, 100.0, sim)
    try:
        rows = _families._variants(_ctx(), _plan([1, 1, 1, 1]), family="f", mapping="m",
                                   searched=0.0)
    finally:
        _families._TASK.reset(token)
    assert _variants(rows) == [("gpipe", 4, "end"), ("gpipe", 8, "end")]
    assert task.cut and len(sim.calls) == 3


# ------------------------------------------------------------------ the simulation
def test_simulate_hands_the_task_deadline_to_the_simulator(monkeypatch) -> None:
    import shardplan.simulate as simulate_module

    ctx = _ctx(batch=8)
    plan = _plan([2, 2]).with_settings(ExecutionSettings(microbatch_size=4, microbatches=2))
    real = simulate_module.simulate(plan, ctx.graph, ctx.topology, timeline=False)
    assert _families._simulate(plan, ctx) == (real.iteration_seconds,
                                              max(real.peak_memory_bytes),
                                              bool(real.fits_memory))
    seen = []

    def spy(p, g, t, **kw):
        seen.append((p, g, t, kw))
        return real

    monkeypatch.setattr(simulate_module, "simulate", spy)
    token = _families._TASK.set(_families._TaskClock(12.5))
    try:
        _families._simulate(plan, ctx)
    finally:
        _families._TASK.reset(token)
    assert seen == [(plan, ctx.graph, ctx.topology, {"timeline": False, "deadline": 12.5})]


def test_a_peak_is_the_largest_devices(monkeypatch) -> None:
    import shardplan.simulate as simulate_module

    res = SimpleNamespace(iteration_seconds=2.0, peak_memory_bytes=[3.0, 7.0, 5.0],
                          fits_memory=0)
    monkeypatch.setattr(simulate_module, "simulate", lambda *a, **k: res)
    got = _families._simulate(_plan([1]), _ctx())
    assert got == (2.0, 7.0, False) and type(got[2]) is bool


# ------------------------------------------------------------------------- families
def test_data_parallelism_is_one_stage_on_every_device_under_each_sync(sim) -> None:
    ctx = _ctx(batch=8)
    rows, err, cut = run_task(ctx, Task("data-parallel", 1, 4))
    assert (err, cut) == ("", False)
    assert _variants(rows) == [("gpipe", m, s) for m in (1, 2)
                               for s in ("end", "bucketed", "sharded")]
    plan = sim.plans[0]
    assert plan.stages == (Stage(tuple(range(8)), (0, 1, 2, 3)),)
    assert (plan.graph, plan.topology, plan.algorithm, plan.status) == \
        ("layered-8", "flat-4", "data-parallel", "feasible")
    assert plan.objective == Objective("max_stage_seconds_overlap", 0.0)
    assert {(r.family, r.algorithm, r.mapping, r.search_seconds) for r in rows} == \
        {("data-parallel", "data-parallel", "consecutive", 0.0)}
    rows, _, _ = run_task(_ctx(devices=2, batch=8), Task("data-parallel", 1, 2))
    assert _variants(rows) == [("gpipe", m, s) for m in (1, 2, 4)
                               for s in ("end", "bucketed", "sharded")]
    rows, _, _ = run_task(_ctx(devices=1, batch=8), Task("data-parallel", 1, 1))
    assert _variants(rows) == [("gpipe", m, "end") for m in (1, 2, 4)]


class _Registry:
    """Stands in for ``registry.run``: records each call; partitions (and strategy searches)
    are the real ones unless ``plans`` names one; a mapping is ``mapped`` (an exception is
    raised); every call moves ``clock`` on by ``step[family]``."""

    def __init__(self, real, plans=None, mapped=None, clock=None, step=None) -> None:
        self.real, self.plans, self.mapped = real, plans or {}, mapped
        self.clock, self.step = clock, step or {}
        self.calls: list[tuple] = []

    def __call__(self, family, name, graph, topology, **kw):
        self.calls.append((family, name, graph, topology, kw))
        if self.clock is not None:
            self.clock.now += self.step.get(family, 0.0)
        if family == "map":
            if isinstance(self.mapped, Exception):
                raise self.mapped
            return SimpleNamespace(plan=self.mapped)
        if (family, name) in self.plans:
            return SimpleNamespace(plan=self.plans[family, name])
        return self.real(family, name, graph, topology, **kw)


@pytest.fixture
def reg(monkeypatch):
    def make(**kw) -> _Registry:
        fake = _Registry(registry.run, **kw)
        monkeypatch.setattr(registry, "run", fake)
        return fake
    return make


def test_a_pipeline_family_partitions_at_the_middle_count_then_simulates(sim, reg) -> None:
    """``uniform`` on 2 x 2: the partitioner gets the shape, the seed, the task's budget and
    the settings of the middle count of 2, 4, 8, 16 (8 micro-batches of 4, 1F1B); no
    mapping is searched (``uniform`` keeps consecutive devices)."""
    ctx = _ctx(seed=7)
    fake = reg()
    rows, err, _ = run_task(ctx, Task("uniform", 2, 2, budget=3.0))
    assert not err and len(fake.calls) == 1
    family, name, graph, topology, kw = fake.calls[0]
    assert (family, name, graph, topology) == ("partition", "uniform", ctx.graph, ctx.topology)
    want = ctx.base.override(microbatches=8, microbatch_size=4, schedule="1f1b")[0].to_dict()
    del want["global_batch"]
    assert kw == {"seed": 7, "time_limit": 3.0, **want, "stages": 2, "replicas": 2}
    assert {(r.family, r.algorithm, r.mapping, r.stages, r.replicas) for r in rows} == \
        {("uniform", "uniform", "consecutive", 2, 2)}
    assert {r.microbatches for r in rows} == {2, 4, 8, 16}


def test_a_family_of_its_own_shape_gets_no_shape_and_one_stages_settings(sim, reg,
                                                                        monkeypatch) -> None:
    """PipeDream picks its shape: its partitioner is handed none, and the settings of one
    stage (GPipe, the middle of 1, 2, 4 micro-batches); stages of unequal replica counts
    make rows the runtime cannot run, simulated at counts one replica shares; the rows'
    search time is the partitioner's."""
    ctx = _ctx(batch=8)
    clock = _Clock()
    clock.now = 10.0
    monkeypatch.setattr(_families, "time", clock)
    uneven = _plan([2, 1, 1], algorithm="pipedream")
    fake = reg(plans={("partition", "pipedream"): uneven}, clock=clock,
               step={"partition": 2.0})
    rows, err, _ = run_task(ctx, Task("pipedream", 0, 0, budget=None))
    assert not err and {r.search_seconds for r in rows} == {2.0}
    kw = fake.calls[0][4]
    assert "stages" not in kw and "replicas" not in kw and kw["time_limit"] is None
    assert (kw["microbatches"], kw["microbatch_size"], kw["schedule"]) == (2, 4, "gpipe")
    assert {(r.family, r.algorithm, r.mapping, r.runnable, r.note) for r in rows} == \
        {("pipedream", "pipedream", "pipedream", False,
          "stages differ in replica count: the runtime cannot run it")}
    # three stages: none of 3, 6, 12, 24 divides 8 samples, so the fewest that does, 1
    assert {r.microbatches for r in rows} == set(microbatch_choices(8, 3, 1))
    even = _plan([2, 2], algorithm="pipedream")
    reg(plans={("partition", "pipedream"): even})
    rows, err, _ = run_task(ctx, Task("pipedream", 0, 0))
    assert not err and {(r.runnable, r.note) for r in rows} == {(True, "")}
    assert {r.microbatches for r in rows} == set(microbatch_choices(8, 2, 2))


def _mapped_plan(plan: Plan, kept: str | None) -> Plan:
    from dataclasses import replace

    stages = tuple(Stage(st.nodes, tuple(reversed(st.devices))) for st in plan.stages)
    meta = {} if kept is None else {"judge": {"kept": kept}}
    return replace(plan, stages=stages, meta=meta)


@pytest.mark.parametrize("kept, label", [(None, "optimal"), ("optimal", "optimal"),
                                         ("consecutive", "consecutive*")])
def test_parmesan_is_simulated_as_partitioned_and_as_mapped(sim, reg, monkeypatch, kept,
                                                             label) -> None:
    """Parmesan's rows: its partition on consecutive devices, then on the devices the optimal
    mapping gives it (half the task's budget; ``consecutive*`` when the mapper's judge kept
    the consecutive order); each row's search time counts what was searched before it."""
    ctx = _ctx(seed=3)
    clock = _Clock()
    clock.now = 10.0
    monkeypatch.setattr(_families, "time", clock)
    part = _plan([2, 2], algorithm="parmesan")
    mapped = _mapped_plan(part, kept)
    fake = reg(plans={("partition", "parmesan"): part}, mapped=mapped, clock=clock,
               step={"partition": 2.0, "map": 3.0})
    rows, err, _ = run_task(ctx, Task("parmesan", 2, 2, budget=8.0))
    assert not err
    family, name, graph, topology, kw = fake.calls[1]
    assert (family, name, graph, topology) == ("map", "optimal", ctx.graph, ctx.topology)
    assert kw == {"plan": part, "time_limit": 4.0, "seed": 3}
    first = [r for r in rows if r.mapping == "consecutive"]
    then = [r for r in rows if r.mapping == label]
    assert len(first) + len(then) == len(rows) and first and then
    assert {r.search_seconds for r in first} == {2.0}
    assert {r.search_seconds for r in then} == {5.0}
    assert {Plan.from_dict(r.plan).stages for r in first} == {part.stages}
    assert {Plan.from_dict(r.plan).stages for r in then} == {mapped.stages}
    assert {r.algorithm for r in rows} == {"parmesan"}
    assert {r.family for r in rows} == {"parmesan"}


def test_no_mapping_without_a_budget_limit_is_unlimited(sim, reg) -> None:
    part = _plan([1, 1], algorithm="parmesan")
    fake = reg(plans={("partition", "parmesan"): part}, mapped=_mapped_plan(part, None))
    run_task(_ctx(), Task("parmesan", 2, 1, budget=None))
    assert fake.calls[1][4]["time_limit"] is None


def test_an_unmappable_or_single_device_plan_keeps_its_consecutive_rows(sim, reg) -> None:
    part = _plan([1, 1], algorithm="pipedream-sequence")
    fake = reg(plans={("partition", "pipedream-sequence"): part},
               mapped=ShardplanError("cannot map"))
    rows, err, _ = run_task(_ctx(), Task("pipedream-sequence", 2, 1))
    assert not err and rows and {r.mapping for r in rows} == {"consecutive"}
    assert [c[0] for c in fake.calls] == ["partition", "map"]
    one = _plan([1], algorithm="parmesan")
    fake = reg(plans={("partition", "parmesan"): one}, mapped=_mapped_plan(one, None))
    rows, err, _ = run_task(_ctx(devices=1), Task("parmesan", 1, 1))
    assert not err and rows and [c[0] for c in fake.calls] == ["partition"]


@pytest.mark.parametrize("family", ["params", "uniform"])
def test_the_plain_pipelines_are_not_mapped(sim, reg, family) -> None:
    fake = reg(plans={("partition", family): _plan([1, 1], algorithm=family)},
               mapped=_mapped_plan(_plan([1, 1]), None))
    rows, err, _ = run_task(_ctx(), Task(family, 2, 1))
    assert not err and rows and [c[0] for c in fake.calls] == ["partition"]


def _parmesan_past_its_deadline(reg, monkeypatch, loads: list[int]):  # noqa: ANN202
    """A registry whose Parmesan partition takes 2 s of a clock the families read."""
    clock = _Clock()
    monkeypatch.setattr(_families, "time", clock)
    part = _plan(loads, algorithm="parmesan")
    return reg(plans={("partition", "parmesan"): part}, mapped=_mapped_plan(part, None),
               clock=clock, step={"partition": 2.0})


def test_no_mapping_is_searched_past_the_deadline(sim, reg, monkeypatch) -> None:
    fake = _parmesan_past_its_deadline(reg, monkeypatch, [1, 1])
    rows, err, cut = run_task(_ctx(), Task("parmesan", 2, 1, left=1.0))
    assert (rows, err, cut) == ([], "", True)
    assert [c[0] for c in fake.calls] == ["partition"]


@pytest.mark.parametrize("devices, batch, fixed, m0", [
    (4, 64, None, 16),  # 4 stages: 4, 8, 16, 32
    (4, 32, None, 16),  # 32 micro-batches of 1: one device each needs no share
    (4, 64, 32, 32),    # the user's 32
    (4, 64, 5, 1),      # the user's 5 does not divide 64: one micro-batch (and no row)
    (1, 64, None, 2),   # one device: one stage's 1, 2, 4
])
def test_sharding_partitions_in_the_simulators_seconds_one_device_a_part(
        sim, reg, monkeypatch, devices, batch, fixed, m0) -> None:
    """Paper 000's search is handed :func:`sharding_inputs` at the middle micro-batch count
    of a pipeline of min(devices, nodes) stages, the seed, 10 s when the task has no budget,
    and the acyclicity constraint; its plan runs GPipe; its rows' search time is the
    partitioner's."""
    ctx = _ctx(devices=devices, batch=batch, seed=5)
    if fixed:
        ctx.fixed = {"microbatches": fixed}
    clock = _Clock()
    clock.now = 10.0
    monkeypatch.setattr(_families, "time", clock)
    fake = reg(clock=clock, step={"partition": 2.0})
    rows, err, _ = run_task(ctx, Task("sharding", 0, 0))
    assert not err and bool(rows) == (fixed != 5)
    family, name, graph, topology, kw = fake.calls[0]
    assert (family, name, kw) == ("partition", "heuristic",
                                  {"seed": 5, "time_limit": 10.0, "acyclic": True})
    settings = ctx.base.override(microbatches=m0, microbatch_size=batch // m0,
                                 schedule="gpipe")[0]
    want_graph, want_topo = _families.sharding_inputs(ctx, settings)
    assert graph.weight.tolist() == want_graph.weight.tolist()
    assert topology.cost.tolist() == want_topo.cost.tolist()
    assert {(r.family, r.mapping, r.schedule, r.search_seconds) for r in rows} <= \
        {("sharding", "sharding", "gpipe", 2.0)}
    reg()
    run_task(ctx, Task("sharding", 0, 0, budget=2.5))
    assert registry.run.calls[0][4]["time_limit"] == 2.5


def test_sharding_inputs_never_cut_across_an_unusable_pair() -> None:
    """A pair of devices with no bandwidth costs 1e9 s to cut across; a device with itself
    costs nothing; the graph is weighed at k = min(devices, nodes) components."""
    import dataclasses

    import numpy as np

    from shardplan.cost import CostModel

    ctx = _ctx(devices=4, nodes=3, batch=8)
    bw = np.full((4, 4), 1e9)
    bw[0, 1] = bw[1, 0] = 0.0
    topo = dataclasses.replace(ctx.topology, bandwidth=bw)
    ctx.topology = topo
    s = ctx.base
    graph, out = _families.sharding_inputs(ctx, s)
    assert out.cost[0, 1] == out.cost[1, 0] == 1e9
    assert np.all(np.diag(out.cost) == 0.0) and np.all(np.isfinite(out.cost))
    f, b = CostModel.from_settings(ctx.graph, topo, s).node_seconds(0)
    work = np.asarray(f + b)
    assert graph.weight == pytest.approx(work / math.sqrt(work.sum() / 3), rel=1e-12)


def test_pase_searches_once_per_variant_and_simulates_that_variant(sim, reg,
                                                                   monkeypatch) -> None:
    """On 4 devices and 8 samples PaSE runs at 1, 2 and 4 micro-batches, each under the
    end-of-step and bucketed syncs: six searches of a sixth of the budget each, priced at
    the settings their one row is simulated with; a row's search time is its search's."""
    ctx = _ctx(batch=8, seed=2)
    clock = _Clock()
    clock.now = 10.0
    monkeypatch.setattr(_families, "time", clock)
    fake = reg(plans={("strategy", "pase"): _plan([4], algorithm="pase")}, clock=clock,
               step={"strategy": 2.0})
    rows, err, _ = run_task(ctx, Task("pase", 0, 0, budget=12.0))
    assert not err and {r.search_seconds for r in rows} == {2.0}
    runs = _families._strategy_runs(ctx, 1)
    assert [(c[0], c[1], c[2], c[3]) for c in fake.calls] == \
        [("strategy", "pase", ctx.graph, ctx.topology)] * 6
    assert [c[4] for c in fake.calls] == [
        {"seed": 2, "time_limit": 2.0, "cost_model": "default", "execution": s.to_dict()}
        for s in runs]
    assert _variants(rows) == [("gpipe", s.microbatches, s.gradient_sync) for s in runs]
    assert {(r.family, r.mapping) for r in rows} == {("pase", "pase")}
    fake = reg(plans={("strategy", "pase"): _plan([4], algorithm="pase")})
    rows, err, _ = run_task(ctx, Task("pase", 0, 0, microbatches=2, gradient_sync="bucketed"))
    assert _variants(rows) == [("gpipe", 2, "bucketed")]
    assert [c[4]["time_limit"] for c in fake.calls] == [None]


def test_pase_stops_searching_at_the_deadline(reg, monkeypatch) -> None:
    """The first search ends at the deadline (not past it) and its row is simulated; the
    next search would start past it: none does, and the task says it was cut."""
    clock = _Clock()
    monkeypatch.setattr(_families, "time", clock)
    monkeypatch.setattr(_families, "_simulate", _Sim(clock, step=0.5))
    fake = reg(plans={("strategy", "pase"): _plan([4], algorithm="pase")}, clock=clock,
               step={"strategy": 2.0})
    rows, err, cut = run_task(_ctx(batch=8), Task("pase", 0, 0, left=2.0))
    assert (len(rows), err, cut) == (1, "", True) and len(fake.calls) == 1


# ------------------------------------------------------------------------- hybrid
def _coded(plan: Plan, code: int, **kw) -> Plan:
    """``plan`` with every node configured as ``(code,)``."""
    from dataclasses import replace

    nodes = [v for st in plan.stages for v in st.nodes]
    return replace(plan, strategy={str(v): (code,) for v in nodes}, **kw)


class _Priced:
    """Stands in for ``_families._simulate`` on two-stage plans whose stages are configured
    all one way: ``seconds[codes]`` for the stages' codes (stages priced together: a mixed
    plan may pay for resharding between its stages); the peak memory falls as the time
    grows (a choice by memory would differ); ``fits(codes)`` says whether it fits."""

    def __init__(self, seconds, fits=lambda codes: True, raise_at=None) -> None:
        self.seconds, self.fits, self.raise_at, self.calls = seconds, fits, raise_at, 0

    def __call__(self, plan: Plan, ctx: Context) -> tuple[float, float, bool]:
        self.calls += 1
        if self.raise_at and self.calls == self.raise_at[0]:
            raise self.raise_at[1]
        codes = []
        for st in plan.stages:
            (code,) = {plan.strategy[str(v)] for v in st.nodes}  # one way per stage
            codes.append(code[0])
        secs = self.seconds[tuple(codes)]
        return secs, 100.0 - secs, self.fits(tuple(codes))


def _pair(meta=None):
    pipe = _plan([2, 2])
    meta = {"hybrid": {"timed_out_stages": [1]}, "x": 1} if meta is None else meta
    pase = _coded(pipe, 1, algorithm="hybrid-pase", status="timed_out", meta=meta)
    return pase, _coded(pipe, 2, algorithm="hybrid-dp", meta={"y": 2})


def _table(pp: float, aa: float, pa: float, ap: float) -> dict[tuple[int, int], float]:
    """Seconds of the plans PaSE-PaSE, all-batch-all-batch, PaSE-all-batch, all-batch-PaSE
    (code 1: PaSE's stage layout, 2: all-batch)."""
    return {(1, 1): pp, (2, 2): aa, (1, 2): pa, (2, 1): ap}


@pytest.mark.parametrize("seconds, fits, codes, kinds", [
    # all-batch is faster whole (5 s against 6); then stage 0 PaSE's: 3 s; stage 1 stays
    (_table(6.0, 5.0, 3.0, 8.0), None, (1, 2), ["pase", "all-batch"]),
    # PaSE's is faster whole (4 s against 5); then stage 1 all-batch: 2 s
    (_table(4.0, 5.0, 2.0, 7.0), None, (1, 2), ["pase", "all-batch"]),
    # PaSE's (1 s) does not fit unless stage 0 is all-batch: all-batch (5 s), then stage 1
    # PaSE's (3 s); stage 0 PaSE's (3 s) does not fit
    (_table(1.0, 5.0, 3.0, 3.0), lambda c: c[0] == 2, (2, 1), ["all-batch", "pase"]),
    # a tie keeps PaSE's, and a trial no faster is not taken
    (_table(3.0, 3.0, 3.0, 3.0), None, (1, 1), ["pase", "pase"]),
    # all-batch is faster whole (though it takes more memory) and mixing stages is slower
    (_table(5.0, 4.0, 5.0, 8.0), None, (2, 2), ["all-batch", "all-batch"]),
    # PaSE's whole plan alone does not fit: the greedy starts from all-batch (3 s), which
    # takes stage 0 PaSE's (2 s); from PaSE's it would have ended at all-batch's 3 s
    (_table(1.0, 3.0, 2.0, 4.0), lambda c: c != (1, 1), (1, 2), ["pase", "all-batch"]),
])
def test_each_stage_keeps_the_faster_of_pases_and_the_all_batch_layout(
        monkeypatch, seconds, fits, codes, kinds) -> None:
    fake = _Priced(seconds, **({"fits": fits} if fits else {}))
    monkeypatch.setattr(_families, "_simulate", fake)
    pase, replicated = _pair()
    got = _families._stage_choice(_ctx(), pase, replicated)
    assert fake.calls == 2 + 2  # both whole plans, then one trial per stage
    for k, st in enumerate(got.stages):
        assert {got.strategy[str(v)] for v in st.nodes} == {(codes[k],)}
    assert got.objective == Objective("iteration_seconds", seconds[codes], None)
    assert got.status == "timed_out"  # PaSE's: a stage's search was cut short
    assert got.meta == {"hybrid": {"timed_out_stages": [1], "stage_choice": kinds}, "x": 1}
    assert got.stages == pase.stages


def test_the_stage_choice_is_recorded_without_earlier_hybrid_meta(monkeypatch) -> None:
    monkeypatch.setattr(_families, "_simulate", _Priced(_table(6.0, 5.0, 3.0, 8.0)))
    pase, replicated = _pair(meta={})
    got = _families._stage_choice(_ctx(), pase, replicated)
    assert got.meta == {"hybrid": {"stage_choice": ["pase", "all-batch"]}}


@pytest.mark.parametrize("error", [TimeLimitError("deadline"), ShardplanError("refused")])
@pytest.mark.parametrize("at", [1, 3])
def test_a_stopped_or_refused_simulation_keeps_pases_plan(monkeypatch, error, at) -> None:
    monkeypatch.setattr(_families, "_simulate",
                        _Priced(_table(6.0, 5.0, 3.0, 8.0), raise_at=(at, error)))
    pase, replicated = _pair()
    assert _families._stage_choice(_ctx(), pase, replicated) is pase


class _Hybrid:
    """Stands in for ``hybrid_plan``: records its calls; PaSE's plan is every node ``(1,)``
    (its meta naming ``cut`` as the stages cut short), the all-batch one ``(2,)``."""

    def __init__(self, cut=()) -> None:
        self.calls: list[tuple] = []
        self.cut = list(cut)

    def __call__(self, plan, graph, topology, **kw):
        self.calls.append((plan, graph, topology, kw))
        if kw.get("algorithm") == "data-parallel":
            return _coded(plan, 2)
        return _coded(plan, 1, meta={"hybrid": {"timed_out_stages": self.cut}})


@pytest.mark.parametrize("kept, mapping", [("optimal", "optimal"), (None, "optimal"),
                                           ("consecutive", "consecutive")])
def test_the_hybrid_configures_parmesans_mapped_stages_at_each_count(
        reg, monkeypatch, kept, mapping) -> None:
    """Parmesan's 2 x 2 stages (half the budget), on the devices the optimal mapping orders
    (a quarter of it to the mapper; unless its judge kept the consecutive order); at each
    of 2, 4, 8, 16 micro-batches PaSE's stage layouts (the other half of the budget, shared)
    and the all-batch ones (PaSE's cutoff 1, no limit), one row per schedule."""
    import shardplan.strategy as strategy_module

    clock = _Clock()
    clock.now = 10.0
    monkeypatch.setattr(_families, "time", clock)
    monkeypatch.setattr(_families, "_simulate", _Priced(_table(2.0, 4.0, 3.0, 3.0)))
    hybrid = _Hybrid()
    monkeypatch.setattr(strategy_module, "hybrid_plan", hybrid)
    ctx = _ctx(seed=4)
    part = _plan([2, 2], algorithm="parmesan")
    mapped = _mapped_plan(part, kept)
    fake = reg(plans={("partition", "parmesan"): part}, mapped=mapped, clock=clock,
               step={"partition": 1.0, "map": 2.0})
    rows, err, cut = run_task(ctx, Task("hybrid", 2, 2, budget=16.0))
    assert (err, cut) == ("", False)
    assert [c[0] for c in fake.calls] == ["partition", "map"]
    p_kw, m_kw = fake.calls[0][4], fake.calls[1][4]
    assert (p_kw["stages"], p_kw["replicas"], p_kw["time_limit"], p_kw["seed"]) == \
        (2, 2, 8.0, 4)
    assert m_kw == {"plan": part, "time_limit": 2.0, "seed": 4}
    runs = _families._strategy_runs(ctx, 2)
    assert [s.microbatches for s in runs] == [2, 4, 8, 16]
    stages = part.stages if kept == "consecutive" else mapped.stages
    want = []
    for s in runs:
        options = {"cost_model": "default", "execution": s.to_dict()}
        want += [(s, {"time_limit": 2.0, "options": options}),
                 (s, {"algorithm": "data-parallel", "options": {**options, "cutoff": 1}})]
    assert [(c[0].settings, c[3]) for c in hybrid.calls] == want
    assert all(c[0].stages == stages and c[1] is ctx.graph and c[2] is ctx.topology
               for c in hybrid.calls)
    assert _variants(rows) == [(sc, s.microbatches, "end") for s in runs
                               for sc in ("gpipe", "1f1b")]
    for r in rows:
        assert (r.family, r.mapping, r.note, r.search_seconds) == ("hybrid", mapping, "", 3.0)
        assert r.plan["hybrid"]["stage_choice"] == ["pase", "pase"]
        assert Plan.from_dict(r.plan).stages == stages


def test_a_hybrid_says_which_stage_searches_were_cut_and_has_no_limit_without_budget(
        sim, reg, monkeypatch) -> None:
    import shardplan.strategy as strategy_module

    hybrid = _Hybrid(cut=[0, 1])
    monkeypatch.setattr(strategy_module, "hybrid_plan", hybrid)
    part = _plan([2, 2], algorithm="parmesan")
    fake = reg(plans={("partition", "parmesan"): part}, mapped=ShardplanError("no"))
    rows, err, _ = run_task(_ctx(), Task("hybrid", 2, 2))
    assert not err and rows
    assert fake.calls[0][4]["time_limit"] is None and fake.calls[1][4]["time_limit"] is None
    assert {c[3].get("time_limit") for c in hybrid.calls} == {None}
    assert {(r.note, r.mapping) for r in rows} == {
        ("the time limit cut the strategy search of stages [0, 1] short", "consecutive")}


def test_a_hybrid_past_its_deadline_searches_no_more_stages(sim, reg, monkeypatch) -> None:
    """Parmesan's search ends past the deadline: no mapping, no stage search, no row."""
    import shardplan.strategy as strategy_module

    hybrid = _Hybrid()
    monkeypatch.setattr(strategy_module, "hybrid_plan", hybrid)
    fake = _parmesan_past_its_deadline(reg, monkeypatch, [2, 2])
    rows, err, cut = run_task(_ctx(), Task("hybrid", 2, 2, left=1.0))
    assert (rows, err, cut) == ([], "", True)
    assert [c[0] for c in fake.calls] == ["partition"] and hybrid.calls == []


def test_a_hybrid_stops_between_its_counts_at_the_deadline(reg, monkeypatch) -> None:
    """Each simulation takes 1 s, six a count (both whole plans, a trial per stage, then the
    two schedules' rows): the first count's rows are simulated before the deadline (5.5 s);
    the next count would start past it: it is not searched, and the task says it was cut."""
    import shardplan.strategy as strategy_module

    clock = _Clock()
    monkeypatch.setattr(_families, "time", clock)
    monkeypatch.setattr(_families, "_simulate", _Sim(clock, step=1.0))
    hybrid = _Hybrid()
    monkeypatch.setattr(strategy_module, "hybrid_plan", hybrid)
    part = _plan([1, 1], algorithm="parmesan")
    reg(plans={("partition", "parmesan"): part}, mapped=ShardplanError("no"))
    rows, err, cut = run_task(_ctx(), Task("hybrid", 2, 1, left=5.5))
    assert (err, cut) == ("", True) and len(hybrid.calls) == 2
    assert _variants(rows) == [("gpipe", 2, "end"), ("1f1b", 2, "end")]


# ---------------------------------------------------------------------------- LLM
def _llm_row(seconds: float, timed_out: bool) -> dict:
    return {"stages": 2, "replicas": 2, "schedule": "1f1b", "microbatches": 4,
            "mapping": "tp2 pp2", "gradient_sync": "end", "iteration_seconds": seconds,
            "throughput": 8 / seconds, "peak_memory_bytes": 1e9, "fits": True,
            "search_seconds": 0.5, "plan": {"stages": []}, "note": "tp2 pp2",
            "objective_value": seconds, "timed_out": timed_out}


@pytest.mark.parametrize("left, limit", [(None, 35.0), (5.0, 5.0), (-2.0, 0.0)])
def test_the_llm_family_searches_the_seconds_left_and_wraps_its_rows(monkeypatch, left,
                                                                     limit) -> None:
    from shardplan.planner import _llm

    seen = []

    def rows(graph, topology, settings, **kw):
        seen.append((graph, topology, settings, kw))
        return [_llm_row(2.0, False), _llm_row(3.0, True)]

    monkeypatch.setattr(_llm, "family_rows", rows)
    monkeypatch.setattr(_llm, "has_blocks", lambda g: True)
    ctx = _ctx(batch=8)
    ctx.include = ("mine",)
    got, err, cut = run_task(ctx, Task("llm", 0, 0, left=left))
    assert (err, cut) == ("", False)  # only the first row says whether the search was cut
    assert seen == [(ctx.graph, ctx.topology, ctx.base,
                     {"global_batch": 8, "time_limit": limit, "include": ("mine",),
                      "microbatches": None})]
    want = {k: v for k, v in _llm_row(2.0, False).items() if k != "timed_out"}
    assert got[0] == _families.Evaluated(family="llm", algorithm="llm",
                                         objective="iteration_seconds", **want)
    assert [r.iteration_seconds for r in got] == [2.0, 3.0]


def test_the_llm_family_keeps_the_users_sync_and_says_when_it_was_cut(monkeypatch) -> None:
    from shardplan.planner import _llm

    seen = []

    def rows(graph, topology, settings, **kw):
        seen.append(settings)
        return [_llm_row(2.0, True)]

    monkeypatch.setattr(_llm, "family_rows", rows)
    monkeypatch.setattr(_llm, "has_blocks", lambda g: True)
    ctx = _ctx(batch=8)
    ctx.fixed = {"gradient_sync": "bucketed"}
    got, err, cut = run_task(ctx, Task("llm", 0, 0))
    assert (len(got), err, cut) == (1, "", True)
    assert seen[0].gradient_sync == "bucketed"
    assert seen[0] == ctx.base.override(gradient_sync="bucketed")[0]
    monkeypatch.setattr(_llm, "family_rows",
                        lambda *a, **k: [_llm_row(2.0, True), _llm_row(3.0, True)])
    assert run_task(ctx, Task("llm", 0, 0))[2] is True  # every row says it
    monkeypatch.setattr(_llm, "family_rows", lambda *a, **k: [])
    assert run_task(ctx, Task("llm", 0, 0)) == ([], "", False)
    # no rows because no time was left (the capture spent it): a cut, not "none fits"
    assert run_task(ctx, Task("llm", 0, 0, left=0.0)) == ([], "", True)


def test_the_llm_family_needs_transformer_blocks() -> None:
    rows, err, cut = run_task(_ctx(), Task("llm", 0, 0))
    assert (rows, cut) == ([], False)
    assert err == "llm 0x0: the graph has no transformer blocks (layers.N modules) to lay out"


def test_a_shape_no_count_suits_is_partitioned_at_one_micro_batch(sim, reg) -> None:
    """12 samples over 5 replicas: no count gives them whole shares; the partitioner is
    handed one micro-batch of 12."""
    fake = reg(plans={("partition", "params"): _plan([1, 1], algorithm="params")})
    run_task(_ctx(devices=10, batch=12), Task("params", 2, 5))
    kw = fake.calls[0][4]
    assert (kw["microbatches"], kw["microbatch_size"], kw["stages"], kw["replicas"]) == \
        (1, 12, 2, 5)


@pytest.mark.parametrize("task, batch, fixed, want", [
    (Task("pipedream", 0, 0), 6, None, (2, "gpipe")),    # 1, 2 of 6 (one replica): 2
    (Task("params", 2, 1), 8, None, (4, "1f1b")),         # 2, 4, 8 of 8: 4
    (Task("params", 1, 4), 8, None, (2, "gpipe")),        # one stage: 1, 2 of 8: 2
    (Task("params", 2, 1), 8, 2, (2, "1f1b")),            # the user's 2
    (Task("params", 2, 2), 16, 8, (8, "1f1b")),
])
def test_the_partitioner_is_handed_the_middle_count_or_the_users(sim, reg, task, batch,
                                                                 fixed, want) -> None:
    ctx = _ctx(batch=batch)
    if fixed:
        ctx.fixed = {"microbatches": fixed}
    fake = reg(plans={("partition", task.family): _plan([1, 1], algorithm=task.family)})
    run_task(ctx, task)
    kw = fake.calls[0][4]
    assert (kw["microbatches"], kw["schedule"]) == want
    assert kw["microbatch_size"] == batch // want[0]


def test_sharding_inputs_of_a_graph_without_edges_charge_the_latency_alone() -> None:
    """One node, no edge: no tensor crosses a cut, so a pair costs twice its latency; the
    graph is one component (k = 1), weighed by sqrt of its whole work."""
    import numpy as np

    from shardplan.cost import CostModel

    g = layered(num_nodes=1, width=1, seed=0)
    t = build("flat", num_devices=2)
    ctx = Context(g, t, 8, ExecutionSettings().resolve(g))
    graph, topo = _families.sharding_inputs(ctx, ctx.base)
    want = 2.0 * np.asarray(t.latency)
    np.fill_diagonal(want, 0.0)
    assert topo.cost.tolist() == want.tolist()
    f, b = CostModel.from_settings(g, t, ctx.base).node_seconds(0)
    work = float((f + b)[0])
    assert graph.weight.tolist() == pytest.approx([work / math.sqrt(work)], rel=1e-12)


def test_sharding_inputs_weigh_the_first_devices_seconds() -> None:
    """On a cluster whose second device is half as fast, a node weighs what it takes on the
    first (device 0)."""
    import dataclasses

    import numpy as np

    from shardplan.cost import CostModel

    g = layered(num_nodes=4, width=1, seed=0)
    t = build("flat", num_devices=2)
    slow = dataclasses.replace(t.devices[1], flops=t.devices[1].flops / 2)
    t = dataclasses.replace(t, devices=(t.devices[0], slow))
    ctx = Context(g, t, 8, ExecutionSettings().resolve(g))
    graph, _ = _families.sharding_inputs(ctx, ctx.base)
    cm = CostModel.from_settings(g, t, ctx.base)
    first, second = (np.add(*cm.node_seconds(d)) for d in (0, 1))
    assert not np.allclose(first, second)
    assert graph.weight == pytest.approx(first / math.sqrt(first.sum() / 2), rel=1e-12)


@pytest.mark.parametrize("shape, devices, mapped", [((2, 1), 2, True), ((1, 1), 1, False)])
def test_a_hybrid_maps_its_pipeline_unless_it_is_one_device(reg, sim, monkeypatch, shape,
                                                            devices, mapped) -> None:
    """Two stages of one device each are ordered by the optimal mapping as larger shapes
    are; a pipeline on one device has nothing to map."""
    import shardplan.strategy as strategy_module

    monkeypatch.setattr(strategy_module, "hybrid_plan", _Hybrid())
    part = _plan([1] * shape[0], algorithm="parmesan")
    fake = reg(plans={("partition", "parmesan"): part}, mapped=_mapped_plan(part, None))
    rows, err, _ = run_task(_ctx(devices=devices), Task("hybrid", *shape))
    assert not err and rows
    assert [c[0] for c in fake.calls] == ["partition", "map"][:1 + mapped]
    assert {r.mapping for r in rows} == {"optimal" if mapped else "consecutive"}


def test_variants_go_on_past_what_they_leave_out(monkeypatch) -> None:
    """A schedule that cannot run, a count that is not whole rounds and a variant the
    simulator refuses each leave out that one: the schedules, counts and syncs after them
    are still simulated."""
    fake = _Sim(raise_at={1: ShardplanError("refused")})
    monkeypatch.setattr(_families, "_simulate", fake)
    ctx = _ctx(batch=24)
    ctx.schedules = ("interleaved-1f1b", "gpipe")
    rows = _families._variants(ctx, _plan([1, 1]), family="f", mapping="m", searched=0.0,
                               syncs=("end", "bucketed"), microbatches=(2,))
    assert _variants(rows) == [("gpipe", 2, "end"), ("gpipe", 2, "bucketed")]
    assert [r.fits for r in rows] == [False, True]
    rows = _families._variants(ctx, _plan([1, 1, 1, 1]), family="f", mapping="m",
                               searched=0.0, schedules=("interleaved-1f1b",),
                               microbatches=(5, 6))
    assert _variants(rows) == [("interleaved-1f1b", 6, "end")]


def test_a_plan_the_runtime_cannot_run_is_simulated_at_every_count(sim) -> None:
    """Not runnable: its replicas need no even share, so 1, 2 and 4 micro-batches of 4
    samples are all tried (a runnable plan of 2 replicas would leave out 4)."""
    ctx = _ctx(batch=4)
    rows = _families._variants(ctx, _plan([2]), family="f", mapping="m", searched=0.0,
                               runnable=False)
    assert [r.microbatches for r in rows] == [1, 2, 4]
    rows = _families._variants(ctx, _plan([2]), family="f", mapping="m", searched=0.0)
    assert [r.microbatches for r in rows] == [1, 2]


def test_the_llm_family_keeps_the_users_micro_batch_count(monkeypatch) -> None:
    from shardplan.planner import _llm

    seen = []
    monkeypatch.setattr(_llm, "family_rows",
                        lambda *a, **k: seen.append(k.get("microbatches")) or [])
    monkeypatch.setattr(_llm, "has_blocks", lambda g: True)
    ctx = _ctx(batch=8)
    ctx.fixed = {"microbatches": 4}
    run_task(ctx, Task("llm", 0, 0))
    ctx.fixed = {}
    run_task(ctx, Task("llm", 0, 0))
    assert seen == [4, None]
