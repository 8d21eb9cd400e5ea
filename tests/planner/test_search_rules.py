"""The rules of ``shardplan plan``'s search (:func:`shardplan.planner.search`), held against
hand-built candidates: the families' own pricing is replaced by rows whose times, memory and
fit are chosen here, so each rule is checked where it decides the answer (issue 38).

- a candidate that does not fit in memory never ranks first nor wins, even the fastest;
- the speed-ups are against plain data parallelism (DDP's buckets) and the best *fitting* plan
  of any other family, each figure asserted;
- every task's searches get an equal share of the time limit (capped, with a floor), and the
  seconds left the search hands each task are what remains of the limit;
- the micro-batch counts offered split the global batch into micro-batches the replicas can
  share evenly, also where nothing divides nicely.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardplan.errors import InfeasibleError, ShardplanError
from shardplan.generate import layered
from shardplan.ir import Objective, Plan, Stage
from shardplan.planner import Evaluated, Task, _search, microbatch_choices, search
from shardplan.topology import build


def _inputs(devices: int = 4):
    g = layered(num_nodes=12, width=2, seed=1, params_per_weight=1e3)
    return g, build("flat", num_devices=devices)


def _row(family: str, seconds: float, *, fits: bool = True, sync: str = "end",
         stages: int = 1, replicas: int = 4, microbatches: int = 2,
         peak: float = 1e6, label: str = "") -> Evaluated:
    """A candidate with the given simulated time and fit; its plan names it (``label``)."""
    plan = Plan(graph="g", topology="t", algorithm=family,
                stages=(Stage((0,), tuple(range(replicas))),),
                objective=Objective("max_stage_seconds_overlap", seconds),
                meta={"label": label or f"{family}/{sync}/{seconds}"})
    return Evaluated(family, family, stages, replicas, "gpipe", microbatches, "consecutive",
                     sync, seconds, 8 / seconds, peak, fits, 0.0, plan.to_dict())


@dataclass
class _Fake:
    """Stands in for the families: the task of each family with the fewest stages (1 x D for
    data parallelism, 2 x D/2 for a pipeline family) returns that family's hand-made rows,
    its other shapes none; records the tasks (with their budgets and seconds
    left) and contexts it was handed."""

    rows: dict[str, list[Evaluated]]
    errors: dict[str, str] = field(default_factory=dict)
    cut: set[str] = field(default_factory=set)
    seen: list[Task] = field(default_factory=list)
    contexts: list[object] = field(default_factory=list)
    clock: list[float] | None = None
    step: float = 0.0

    def __call__(self, ctx, task):
        first = task.stages <= 2
        self.seen.append(task)
        self.contexts.append(ctx)
        if self.clock is not None:
            self.clock[0] += self.step
        # budget and seconds left travel back in the row (forked workers cannot append here)
        rows = [Evaluated(**{**r.__dict__, "search_seconds": task.budget,
                             "note": repr(task.left)})
                for r in (self.rows.get(task.family, []) if first else [])]
        return rows, self.errors.get(task.family, ""), task.family in self.cut


class _Clock:
    """A ``time`` module whose ``monotonic()`` reads a value the test sets."""

    def __init__(self, now: list[float]) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now[0]


def _search_with(monkeypatch, fake: _Fake, families, **kw):
    monkeypatch.setattr(_search, "run_task", fake)
    g, t = _inputs(kw.pop("devices", 4))
    return search(g, t, families=families, **{"workers": 1, "global_batch": 8, **kw})


# ---------------------------------------------------------------------------- ranking
def test_the_fastest_candidate_that_does_not_fit_never_wins(monkeypatch):
    fake = _Fake({
        "data-parallel": [_row("data-parallel", 3.0, sync="end"),
                          _row("data-parallel", 4.0, sync="bucketed")],
        # the fastest of all, and the lightest, but it does not fit
        "parmesan": [_row("parmesan", 0.5, fits=False, peak=1.0, label="too big")],
        "uniform": [_row("uniform", 2.0, label="winner"), _row("uniform", 2.5)],
    })
    res = _search_with(monkeypatch, fake, ["data-parallel", "parmesan", "uniform"])
    assert res.winner is not None and res.winner.meta["label"] == "winner"
    assert res.ranked[0].family == "uniform" and res.ranked[0].iteration_seconds == 2.0
    assert [r.iteration_seconds for r in res.ranked] == [2.0, 2.5, 3.0, 4.0, 0.5]
    assert not res.ranked[-1].fits  # infeasible last, whatever its time
    assert not res.timed_out and res.errors == ()
    # 1 x 4 data parallelism, 2 x 2 and 4 x 1 pipelines of each pipeline family
    assert res.tasks == res.done == 5


def test_speedups_are_against_plain_data_parallelism_and_the_best_other_family(monkeypatch):
    fake = _Fake({
        # the fastest data-parallel row is not the plain one (DDP's buckets)
        "data-parallel": [_row("data-parallel", 3.0, sync="end"),
                          _row("data-parallel", 5.0, sync="bucketed"),
                          _row("data-parallel", 2.5, sync="sharded", fits=False)],
        # faster than every other fitting family, but it does not fit
        "parmesan": [_row("parmesan", 0.5, fits=False)],
        "params": [_row("params", 6.0)],
        "uniform": [_row("uniform", 2.0), _row("uniform", 2.2)],
    })
    res = _search_with(monkeypatch, fake, ["data-parallel", "parmesan", "params", "uniform"])
    comp = res.comparisons
    assert comp["winner"]["family"] == "uniform"
    assert comp["winner"]["iteration_seconds"] == 2.0
    assert comp["speedup_over_data_parallel"] == pytest.approx(5.0 / 2.0)
    assert comp["speedup_over_best_other_family"] == pytest.approx(3.0 / 2.0)
    per = comp["best_per_family"]
    assert set(per) == {"data-parallel", "params", "uniform"}  # parmesan fits nowhere
    assert per["data-parallel"]["iteration_seconds"] == 3.0
    assert per["data-parallel"]["speedup_of_winner"] == pytest.approx(1.5)
    assert per["params"]["speedup_of_winner"] == pytest.approx(3.0)
    assert per["uniform"] == {"iteration_seconds": 2.0, "speedup_of_winner": 1.0}
    assert res.to_dict()["comparisons"] == comp


def test_data_parallel_winner_is_compared_with_its_plain_form_and_other_families(monkeypatch):
    fake = _Fake({
        "data-parallel": [_row("data-parallel", 2.0, sync="sharded"),
                          _row("data-parallel", 3.0, sync="bucketed")],
        "uniform": [_row("uniform", 8.0), _row("uniform", 4.0, fits=False)],
    })
    res = _search_with(monkeypatch, fake, ["data-parallel", "uniform"])
    comp = res.comparisons
    assert comp["winner"]["gradient_sync"] == "sharded"
    assert comp["speedup_over_data_parallel"] == pytest.approx(1.5)
    assert comp["speedup_over_best_other_family"] == pytest.approx(4.0)


def test_comparisons_are_left_out_when_there_is_no_rival(monkeypatch):
    # no bucketed data parallelism (only the end-of-step all-reduce) and one family
    fake = _Fake({"data-parallel": [_row("data-parallel", 2.0, sync="end")]})
    res = _search_with(monkeypatch, fake, ["data-parallel"])
    assert "speedup_over_data_parallel" not in res.comparisons
    assert "speedup_over_best_other_family" not in res.comparisons
    assert res.comparisons["best_per_family"] == {
        "data-parallel": {"iteration_seconds": 2.0, "speedup_of_winner": 1.0}}


def test_rows_that_fit_but_have_no_finite_time_never_win(monkeypatch):
    fake = _Fake({"data-parallel": [_row("data-parallel", math.inf, sync="bucketed")],
                  "uniform": [_row("uniform", 7.0)]})
    res = _search_with(monkeypatch, fake, ["data-parallel", "uniform"])
    assert res.ranked[0].family == "uniform" and res.winner.algorithm == "uniform"
    assert "speedup_over_data_parallel" not in res.comparisons
    assert set(res.comparisons["best_per_family"]) == {"uniform"}
    only_inf = _Fake({"data-parallel": [_row("data-parallel", math.inf)]})
    with pytest.raises(InfeasibleError, match="no candidate fits in device memory"):
        _search_with(monkeypatch, only_inf, ["data-parallel"])


def test_ties_are_broken_by_what_the_row_is(monkeypatch):
    fake = _Fake({"uniform": [_row("uniform", 2.0, peak=5.0, label="heavy"),
                              _row("uniform", 2.0, peak=3.0, label="light")],
                  "params": [_row("params", 2.0, peak=3.0, label="params")]})
    res = _search_with(monkeypatch, fake, ["uniform", "params"])
    # same time: less memory first, then the family's name
    assert [r.family for r in res.ranked[:2]] == ["params", "uniform"]
    assert res.winner.meta["label"] == "params" and res.ranked[2].peak_memory_bytes == 5.0


def test_nothing_fits_names_the_first_error(monkeypatch):
    fake = _Fake({"uniform": [_row("uniform", 1.0, fits=False)]},
                 errors={"data-parallel": "data-parallel 1x4: boom"})
    with pytest.raises(InfeasibleError, match="no plan fits: data-parallel 1x4: boom"):
        _search_with(monkeypatch, fake, ["data-parallel", "uniform"])
    res = _search_with(monkeypatch, _Fake({"uniform": [_row("uniform", 1.0)]},
                                          errors={"data-parallel": "dp: no"}),
                       ["data-parallel", "uniform"])
    assert res.errors == ("dp: no",) and res.winner is not None


def test_a_task_cut_short_marks_the_search_timed_out(monkeypatch):
    fake = _Fake({"uniform": [_row("uniform", 1.0, fits=False)]}, cut={"uniform"})
    res = _search_with(monkeypatch, fake, ["uniform"])  # nothing fits, but it was cut short
    assert res.timed_out and res.winner is None and res.comparisons == {}
    assert res.to_dict()["winner"] is None and res.to_dict()["timed_out"] is True
    res = _search_with(monkeypatch, _Fake({"uniform": [_row("uniform", 1.0)]}), ["uniform"])
    assert not res.timed_out


def test_context_and_progress(monkeypatch):
    fake = _Fake({"uniform": [_row("uniform", 2.0)], "data-parallel": []})
    calls = []
    g, t = _inputs()
    monkeypatch.setattr(_search, "run_task", fake)
    res = search(g, t, families=["data-parallel", "uniform"], workers=1,
                 fixed={"schedule": "1f1b"}, seed=7,
                 progress=lambda label, done, total: calls.append((label, done, total)))
    ctx = fake.contexts[0]
    assert res.global_batch == ctx.global_batch == g.batch_size * 4  # the default batch
    assert tuple(ctx.schedules) == ("1f1b",) and ctx.seed == 7
    assert [(d, n) for _, d, n in calls] == [(0, 3), (1, 3), (2, 3), (3, 3)]
    assert calls[0][0] == calls[1][0] == "candidates"  # data parallelism gave no row
    assert calls[2][0] == "candidates (best 2000 ms/iteration)"
    search(g, t, families=["uniform"], workers=1, global_batch=8)
    assert tuple(fake.contexts[-1].schedules) == ("gpipe", "1f1b", "interleaved-1f1b")
    with pytest.raises(ShardplanError, match="positive integer"):
        search(g, t, families=["uniform"], workers=1, global_batch=-3)


# ------------------------------------------------------------------------- time limit
@pytest.mark.parametrize("limit, budget", [
    (1000.0, 10.0),                # the cap: TASK_SECONDS
    (30.0, 30.0 * 0.95 / 3),       # 3 tasks one after another share 95% of the limit
    (1.2, 0.5),                    # the floor
])
def test_each_task_gets_an_equal_share_of_the_time_limit(monkeypatch, limit, budget):
    now = [100.0]
    monkeypatch.setattr(_search, "time", _Clock(now))
    fake = _Fake({"data-parallel": [_row("data-parallel", 1.0)],
                  "uniform": [_row("uniform", 2.0)]})
    res = _search_with(monkeypatch, fake, ["data-parallel", "uniform"], time_limit=limit)
    assert [t.budget for t in fake.seen] == pytest.approx([budget] * 3)
    # seconds left: the limit less the slack kept for the result and the grace to hand back
    assert [t.left for t in fake.seen] == pytest.approx([limit * (0.95 - 0.02)] * 3)
    assert not res.timed_out and res.done == 3


def test_no_time_limit_gives_each_task_the_cap_and_no_deadline(monkeypatch):
    fake = _Fake({"uniform": [_row("uniform", 2.0)]})
    _search_with(monkeypatch, fake, ["uniform"])
    assert [(t.budget, t.left) for t in fake.seen] == [(10.0, None), (10.0, None)]


def test_seconds_left_shrink_as_tasks_run_and_the_deadline_stops_them(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(_search, "time", _Clock(now))
    # each task takes 40 s of a 100 s limit: the deadline (95 s) passes during the third
    fake = _Fake({"uniform": [_row("uniform", 2.0)]}, clock=now, step=40.0)
    res = _search_with(monkeypatch, fake, ["uniform"], devices=8, time_limit=100.0)
    assert [t.stages for t in fake.seen] == [2, 4, 8]
    assert [t.left for t in fake.seen] == pytest.approx([93.0, 53.0, 13.0])
    assert res.tasks == 3 and res.done == 3 and not res.timed_out
    now[0] = 0.0
    fake = _Fake({"uniform": [_row("uniform", 2.0)]}, clock=now, step=47.5)
    res = _search_with(monkeypatch, fake, ["uniform"], devices=8, time_limit=100.0)
    # the second task ends exactly at the deadline: the third still starts
    assert len(fake.seen) == 3 and fake.seen[2].left == pytest.approx(0.0)
    now[0] = 0.0
    fake = _Fake({"uniform": [_row("uniform", 2.0)]}, clock=now, step=50.0)
    res = _search_with(monkeypatch, fake, ["uniform"], devices=8, time_limit=100.0)
    assert len(fake.seen) == 2 and res.timed_out and res.done == 2
    assert res.winner is not None  # the best so far


def test_the_share_counts_tasks_per_worker(monkeypatch):
    """Two workers run the 3 tasks in 2 rounds: each task's share is half the limit's 95%."""
    now = [100.0]
    monkeypatch.setattr(_search, "time", _Clock(now))
    fake = _Fake({"data-parallel": [_row("data-parallel", 1.0)],
                  "uniform": [_row("uniform", 2.0)]})
    res = _search_with(monkeypatch, fake, ["data-parallel", "uniform"], workers=2,
                       time_limit=12.0)
    budgets = sorted(r.search_seconds for r in res.ranked)  # recorded in the workers
    assert budgets == pytest.approx([12.0 * 0.95 / 2] * 2)
    assert all(float(r.note) == pytest.approx(12.0 * 0.93) for r in res.ranked)
    assert res.done == 3 and res.winner.algorithm == "data-parallel"


# ---------------------------------------------------------------------- micro-batches
@pytest.mark.parametrize("batch, stages, replicas, want", [
    (24, 2, 3, [2, 4, 8]),       # 16 does not divide 24
    (36, 4, 3, [4]),             # 8: 36 / 8 is not whole; 12 is not offered (not S x 2^k)
    (40, 4, 5, [4, 8]),          # 16, 32 do not divide 40
    (30, 4, 1, [1]),             # no S x 2^k divides 30: the fewest that does
    (30, 4, 2, [1]),             # 30 / 1 = 30 samples, 15 per replica
    (18, 1, 3, [1, 2]),          # one stage: 1, 2, 4; 4 does not divide 18
    (12, 1, 5, []),              # no split gives 5 replicas equal shares
    (6, 2, 4, []),
    (8, 4, 2, [4]),              # 8 micro-batches would leave 1 sample for 2 replicas
    (4, 8, 1, [1]),              # more stages than samples: the fewest that divides
])
def test_microbatch_counts_are_ones_the_replicas_can_share(batch, stages, replicas, want):
    assert microbatch_choices(batch, stages, replicas) == want


@given(st.integers(1, 200), st.integers(1, 16), st.integers(1, 16))
def test_every_offered_count_splits_the_batch_evenly_over_the_replicas(batch, stages, reps):
    got = microbatch_choices(batch, stages, reps)
    shareable = [m for m in range(1, batch + 1)
                 if batch % m == 0 and (batch // m) % reps == 0]
    for m in got:
        assert batch % m == 0 and (batch // m) % reps == 0
    wanted = [1, 2, 4] if stages == 1 else [stages * f for f in (1, 2, 4, 8)]
    preferred = [m for m in wanted if m in shareable]
    assert got == (preferred or shareable[:1])


def test_a_fixed_count_is_kept_only_when_it_divides_the_batch():
    assert microbatch_choices(24, 4, 3, fixed=6) == [6]
    assert microbatch_choices(24, 4, 3, fixed=5) == []


def test_search_rows_use_counts_the_replicas_can_share():
    """The real families on a batch that 4 devices' shapes do not all divide nicely: every
    runnable row's micro-batches split the batch evenly over its replicas."""
    g, t = _inputs()
    res = search(g, t, families=["data-parallel", "uniform"], workers=1, global_batch=12)
    assert {(r.stages, r.replicas) for r in res.ranked} >= {(1, 4), (2, 2), (4, 1)}
    for r in res.ranked:
        assert 12 % r.microbatches == 0
        assert (12 // r.microbatches) % r.replicas == 0, r.row()
    # 1 x 4: 1 (3 per replica); 2 micro-batches of 6 leave 1.5 per replica, not offered
    assert {r.microbatches for r in res.ranked if r.stages == 1} == {1}
    assert {r.microbatches for r in res.ranked if r.stages == 2} == {2}
    assert {r.microbatches for r in res.ranked if r.stages == 4} == {4}


def test_progress_reports_the_best_fitting_time(monkeypatch):
    fake = _Fake({"data-parallel": [_row("data-parallel", 0.5, fits=False),
                                    _row("data-parallel", 3.0)]})
    calls = []
    _search_with(monkeypatch, fake, ["data-parallel"],
                 progress=lambda label, done, total: calls.append(label))
    assert calls == ["candidates", "candidates (best 3000 ms/iteration)"]


def test_the_result_as_json(monkeypatch):
    fake = _Fake({"data-parallel": [_row("data-parallel", 3.0, sync="bucketed")],
                  "uniform": [_row("uniform", 2.0), _row("uniform", 2.5)]},
                 errors={"uniform": "uniform 4x1: no"})
    res = _search_with(monkeypatch, fake, ["data-parallel", "uniform"])
    data = res.to_dict(top=2)
    assert data["winner"] == res.winner.to_dict()
    assert [r["iteration_seconds"] for r in data["ranked"]] == [2.0, 2.5]
    assert data["ranked"][0] == res.ranked[0].row()
    assert (data["global_batch"], data["tasks"], data["tasks_done"], data["candidates"]) == (
        8, 3, 3, 3)
    assert data["errors"] == ["uniform 4x1: no", "uniform 4x1: no"]
    assert data["timed_out"] is False and data["seconds"] == res.seconds >= 0
    assert data["comparisons"]["speedup_over_data_parallel"] == pytest.approx(1.5)
    assert len(res.to_dict()["ranked"]) == 3


@pytest.mark.parametrize("cpus, rounds", [(16, 2), (3, 2), (1, 5), (None, 5)])
def test_the_default_worker_count_is_the_cpus_at_most_4(monkeypatch, cpus, rounds):
    """5 tasks on 4 devices: 4 workers (16 CPUs) or 3 run them in 2 rounds, 1 in 5."""
    now = [100.0]
    monkeypatch.setattr(_search, "time", _Clock(now))
    monkeypatch.setattr(_search.os, "cpu_count", lambda: cpus)
    fake = _Fake({"data-parallel": [_row("data-parallel", 1.0)],
                  "uniform": [_row("uniform", 2.0)], "params": [_row("params", 3.0)]})
    res = _search_with(monkeypatch, fake, ["data-parallel", "uniform", "params"],
                       workers=None, time_limit=20.0)
    assert res.tasks == 5
    assert [r.search_seconds for r in res.ranked] == pytest.approx([20.0 * 0.95 / rounds] * 3)


# ------------------------------------------------------------------------------ refusals
def test_clusters_larger_than_the_search_prices_are_refused(monkeypatch):
    """At most MAX_PLAN_DEVICES devices for the operator-graph families and
    MAX_LLM_PLAN_DEVICES for the LLM family alone (lowered here to 4 and 6 so the test
    stays small): up to its limit a search runs, beyond it the search is refused in one line
    before any family runs."""
    monkeypatch.setattr(_search, "MAX_PLAN_DEVICES", 4)
    monkeypatch.setattr(_search, "MAX_LLM_PLAN_DEVICES", 6)
    message = (r"^topology 'flat-{n}' has {n} devices; plan searches at most 6 by the LLM "
               r"family alone \(a transformer\) and 4 by the others \(their candidates are "
               r"priced from per-pair matrices, O\(devices\^2\) memory\)$")
    fake = _Fake({"uniform": [_row("uniform", 2.0)]})
    assert _search_with(monkeypatch, fake, ["uniform"], devices=4).winner is not None
    fake = _Fake({"uniform": [_row("uniform", 2.0)], "llm": [_row("llm", 2.0)]})
    for families in (["uniform"], ["uniform", "llm"]):
        with pytest.raises(ShardplanError, match=message.format(n=5)):
            _search_with(monkeypatch, fake, families, devices=5)
    assert fake.seen == []
    assert _search_with(monkeypatch, fake, ["llm"], devices=6).winner is not None
    with pytest.raises(ShardplanError, match=message.format(n=7)):
        _search_with(monkeypatch, fake, ["llm"], devices=7)


def test_an_empty_graph_is_refused(monkeypatch):
    import numpy as np

    from shardplan.ir import Graph

    empty = Graph.from_arrays(name="e", fwd_flops=np.zeros(0), src=np.zeros(0, int),
                              dst=np.zeros(0, int))
    with pytest.raises(ShardplanError, match=r"^graph 'e' has no nodes: nothing to plan$"):
        search(empty, build("flat", num_devices=2), families=["uniform"], workers=1)


class _Ref:
    def __init__(self, value):
        self.value = value

    def future(self):
        from concurrent.futures import Future

        f = Future()
        f.set_result(self.value)
        return f


class _Ray:
    """A stand-in for Ray that runs each task when it is submitted, in this process but as
    a fresh worker would: the search's module state (its context) is cleared first, so a
    task sees only what its worker was given."""

    def __init__(self):
        self.inits, self.puts, self.calls = [], [], 0

    def is_initialized(self):
        return False

    def init(self, **kw):
        self.inits.append(kw)

    def remote(self, **options):
        ray = self

        class _Remote:
            def __init__(self, fn):
                self.fn = fn

            def remote(self, *args):
                ray.calls += 1
                saved = dict(_search._CTX)
                _search._CTX.clear()  # another process: nothing inherited
                try:
                    return _Ref(self.fn(*[a.value if isinstance(a, _Ref) else a
                                          for a in args]))
                finally:
                    _search._CTX.clear()
                    _search._CTX.update(saved)

        return _Remote

    def put(self, obj):
        self.puts.append(obj)
        return _Ref(obj)

    def cancel(self, ref, force=False):
        pass

    def shutdown(self):
        pass


def test_a_ray_search_hands_the_tasks_to_ray(monkeypatch):
    """With ``ray`` the tasks go to Ray even with one worker (here a stand-in running them at
    once), with the context sent once, and rank as a local search does."""
    import sys

    ray = _Ray()
    monkeypatch.setitem(sys.modules, "ray", ray)
    rows = {"data-parallel": [_row("data-parallel", 3.0, sync="bucketed")],
            "uniform": [_row("uniform", 2.0, label="winner")]}
    res = _search_with(monkeypatch, _Fake(rows), ["data-parallel", "uniform"], ray="local")
    assert len(ray.inits) == 1 and ray.calls == 3  # every task, on Ray
    # the context once (the pool's initializer argument), then each task
    assert ray.puts[0].global_batch == 8
    assert sorted(p.family for p in ray.puts[1:]) == ["data-parallel", "uniform", "uniform"]
    assert res.winner.meta["label"] == "winner" and res.done == 3
    local = _search_with(monkeypatch, _Fake(rows), ["data-parallel", "uniform"])
    assert [r.row() for r in res.ranked] == [r.row() for r in local.ranked]
    assert res.comparisons == local.comparisons


def test_search_defaults_and_what_it_passes_on(monkeypatch):
    """Seed 0 by default; the user's included layouts reach the families; a batch of one
    sample is a batch; without families named, every family but the LLM one for a graph
    that is no transformer."""
    from shardplan.planner import FAMILIES

    fake = _Fake({"uniform": [_row("uniform", 2.0)]})
    res = _search_with(monkeypatch, fake, ["uniform"], global_batch=1,
                       include=[("layout", "settings")])
    assert res.global_batch == 1 and res.winner is not None
    assert fake.contexts[0].seed == 0
    assert fake.contexts[0].include == (("layout", "settings"),)
    fake = _Fake({"uniform": [_row("uniform", 2.0)]})
    _search_with(monkeypatch, fake, None)
    assert {t.family for t in fake.seen} == set(FAMILIES) - {"llm"}


def test_one_round_of_tasks_shares_the_whole_limit(monkeypatch):
    """One task (2 devices: the 2 x 1 pipeline alone) gets 95% of a 10 s limit."""
    now = [0.0]
    monkeypatch.setattr(_search, "time", _Clock(now))
    fake = _Fake({"uniform": [_row("uniform", 2.0)]})
    res = _search_with(monkeypatch, fake, ["uniform"], devices=2, time_limit=10.0)
    assert res.tasks == 1 and [t.budget for t in fake.seen] == pytest.approx([9.5])


@pytest.mark.parametrize("step, done, cut", [
    (40.0, 2, True),      # the third task ends past the deadline (95 s): its rows are dropped
    (47.5, 1, True),      # the second ends exactly at it: the search stops there
    (47.25, 2, True),     # half a second before it: the second's rows count
    (30.0, 3, False),     # all three within the limit
])
def test_the_deadline_stops_a_pool_search(monkeypatch, step, done, cut):
    """The pool's loop (here on the stand-in Ray, one worker, tasks handed out one at a
    time as the worker frees up) stops at the deadline: tasks finished after it are not
    counted, and the search says it was cut short."""
    import sys

    monkeypatch.setitem(sys.modules, "ray", _Ray())
    now = [0.0]
    monkeypatch.setattr(_search, "time", _Clock(now))
    fake = _Fake({"uniform": [_row("uniform", 2.0)]}, clock=now, step=step)
    res = _search_with(monkeypatch, fake, ["uniform"], devices=8, time_limit=100.0,
                       ray="local")
    assert res.done == done and res.timed_out is cut and res.winner is not None
    # each task handed out with the seconds then left (less the 2 s grace)
    assert [t.left for t in fake.seen] == pytest.approx(
        [max(0.0, 93.0 - k * step) for k in range(len(fake.seen))])


def test_the_search_reports_its_wall_time_and_why_nothing_fits(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(_search, "time", _Clock(now))
    fake = _Fake({"uniform": [_row("uniform", 2.0)]}, clock=now, step=40.0)
    res = _search_with(monkeypatch, fake, ["uniform"], devices=8)  # no limit: 3 tasks
    assert res.seconds == pytest.approx(120.0) and res.to_dict()["seconds"] == res.seconds
    with pytest.raises(InfeasibleError, match=r"^no plan fits: no candidate fits in device "
                                              r"memory$"):
        _search_with(monkeypatch, _Fake({"uniform": [_row("uniform", 1.0, fits=False)]}),
                     ["uniform"])


def test_a_transformer_is_searched_by_every_family_by_default(monkeypatch):
    from shardplan.planner import FAMILIES
    from tests.cost.llm_graph import gpt_graph

    monkeypatch.setattr(_search, "run_task", _Fake({}))
    fake = _search.run_task
    g = gpt_graph(layers=2, hidden=16, seq=8, vocab=32)
    with pytest.raises(InfeasibleError):  # the stand-in gives no rows
        search(g, build("flat", num_devices=4), workers=1, global_batch=8)
    assert {t.family for t in fake.seen} == set(FAMILIES)
