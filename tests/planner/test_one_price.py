"""``plan`` in one price (issue 33): PaSE, the hybrid and paper 000's partitions searched in
the simulator's terms, their rows saying how far their own cost is from the simulation, and
uneven replicas named as they are."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shardplan.cost import CostModel
from shardplan.generate import layered, transformer
from shardplan.ir import ExecutionSettings
from shardplan.planner import Evaluated, search, shape_label
from shardplan.planner._families import Context, sharding_inputs
from shardplan.strategy import hybrid_plan
from shardplan.topology import build


def _row(devices: list[int], objective: str = "x", value: float = 1.0,
         seconds: float = 2.0) -> Evaluated:
    plan = {"stages": [{"nodes": [i], "devices": list(range(d))} for i, d in
                       enumerate(devices)]}
    return Evaluated("pipedream", "pipedream", len(devices), max(devices), "1f1b", 4,
                     "pipedream", "end", seconds, 1.0, 0.0, True, 0.0, plan,
                     objective=objective, objective_value=value)


def test_uneven_replicas_are_named_per_stage() -> None:
    """PipeDream's stages of 10, 2, 2 and 2 devices read ``4 x [10, 2, 2, 2]`` (they read
    ``4 x 10``: 40 devices on a 16-device cluster); even ones keep ``S x R``."""
    assert shape_label(_row([10, 2, 2, 2])) == "4 x [10, 2, 2, 2]"
    assert shape_label(_row([4, 4])) == "2 x 4"
    assert _row([10, 2, 2, 2]).row()["replicas_per_stage"] == [10, 2, 2, 2]


def test_rows_say_how_far_their_own_cost_is_from_the_simulation() -> None:
    """A row whose objective estimates the iteration carries objective / simulated; one of
    another quantity (a stage's seconds) carries None."""
    it = _row([4], "iteration_seconds", 1.5, 2.0).row()["objective"]
    assert it == {"name": "iteration_seconds", "value": 1.5, "over_simulated": 0.75}
    assert _row([4], "max_stage_seconds", 1.5, 2.0).row()["objective"]["over_simulated"] \
        is None


def test_sharding_inputs_are_seconds_of_the_simulators_cost_model() -> None:
    """Paper 000's weights become each node's forward + backward seconds over sqrt(T / k),
    and its cost matrix twice the seconds of moving the mean edge tensor between two
    devices (it weighed parameters and charged latencies only)."""
    g = layered(num_nodes=12, width=3, seed=1, params_per_weight=1e3)
    t = build("hierarchical", shape=(2, 2), level_names=("box", "gpu"),
              bandwidth=(1e9, 2e10), latency=(1e-5, 1e-6))
    s = ExecutionSettings(microbatch_size=g.batch_size * 2, microbatches=2)
    ctx = Context(g, t, g.batch_size * 4, s)
    graph, topo = sharding_inputs(ctx, s)
    cm = CostModel.from_settings(g, t, s)
    f, b = cm.node_seconds(0)
    work = f + b
    assert graph.weight * math.sqrt(work.sum() / 4) == pytest.approx(work, rel=1e-12)
    mean = float(np.mean(cm.graph.edge_bytes))
    want = 2 * (t.latency + mean * cm.inverse_bandwidth)
    np.fill_diagonal(want, 0.0)
    assert topo.cost == pytest.approx(want, rel=1e-12)
    assert topo.name == t.name and graph.num_nodes == g.num_nodes


def test_pase_is_never_slower_than_data_parallelism_in_the_search() -> None:
    """PaSE's space holds data parallelism and it searches in the simulator's price, so its
    best row simulates no slower than the data-parallel family's best (2%)."""
    g = transformer(num_layers=1)
    t = build("hierarchical", shape=(2, 2), level_names=("box", "gpu"),
              bandwidth=(1e9, 2e10), latency=(1e-5, 1e-6))
    res = search(g, t, global_batch=g.batch_size, families=["data-parallel", "pase"],
                 workers=1)
    best = {f: min(r.iteration_seconds for r in res.ranked if r.family == f and r.fits)
            for f in ("data-parallel", "pase")}
    assert best["pase"] <= best["data-parallel"] * 1.02
    for r in res.ranked:
        if r.family == "pase":
            assert r.objective == "iteration_seconds"
            assert r.objective_over_simulated == pytest.approx(1.0, abs=0.10)


def test_hybrid_records_its_own_objective_and_the_stages_cut_short() -> None:
    """The hybrid's objective is its own (the slowest stage's iteration in the simulator's
    price, stretched by the pipeline's fill and drain), not Parmesan's; a time limit that
    cuts a stage's search short is said per stage."""
    from shardplan import registry

    g = transformer(num_layers=2)
    t = build("flat", num_devices=4)
    s = ExecutionSettings(microbatch_size=g.batch_size // 4, microbatches=4, schedule="1f1b")
    pipe = registry.run("partition", "parmesan", g, t, seed=0, time_limit=None, stages=2,
                        replicas=2).plan.with_settings(s)
    plan = hybrid_plan(pipe, g, t, options={"cost_model": "default",
                                            "execution": s.to_dict()})
    stages = plan.meta["hybrid"]["stages"]
    assert plan.objective.name == "iteration_seconds"
    assert plan.objective.value == pytest.approx(
        max(r["value"] for r in stages) * (4 + 2 - 1) / 4, rel=1e-12)
    assert plan.meta["hybrid"]["timed_out_stages"] == []
    cut = hybrid_plan(pipe, g, t, time_limit=1e-9,
                      options={"cost_model": "default", "execution": s.to_dict()})
    assert cut.status == "timed_out"
    assert cut.meta["hybrid"]["timed_out_stages"] == [r["stage"] for r in
                                                      cut.meta["hybrid"]["stages"]
                                                      if r["status"] == "timed_out"]
    assert cut.meta["hybrid"]["timed_out_stages"]


def test_a_hybrid_row_says_its_stage_searches_were_cut_short() -> None:
    """A hybrid whose per-stage strategy searches the task's time cut short says so in its
    row's note (and its plan's status is timed_out)."""
    from shardplan.planner._families import Task, run_task

    g = transformer(num_layers=2)
    t = build("flat", num_devices=4)
    ctx = Context(g, t, g.batch_size, ExecutionSettings().resolve(g))
    rows, err, _ = run_task(ctx, Task("hybrid", 2, 2, budget=1e-9))
    assert not err and rows
    for r in rows:
        assert r.plan["status"] == "timed_out"
        assert r.note.startswith("the time limit cut the strategy search of stages [")
    rows, err, _ = run_task(ctx, Task("hybrid", 2, 2, budget=None))
    assert not err and rows and all(r.note == "" for r in rows)


def test_the_hybrid_is_no_slower_than_the_same_stages_replicated() -> None:
    """Per stage the hybrid keeps PaSE's configurations or the all-batch ones (the stage's
    replicas, boundaries in batch shards), whichever the simulator finds faster: at every
    micro-batch count its best row is no slower than Parmesan's same stages replicated
    (2%), and its plan says which it kept and records its simulated iteration."""
    from shardplan.planner._families import Task, run_task

    g = transformer(num_layers=2)
    t = build("dgx1", boxes=1)
    ctx = Context(g, t, g.batch_size, ExecutionSettings().resolve(g))
    hybrid, err, _ = run_task(ctx, Task("hybrid", 2, 4, budget=None))
    assert not err and hybrid
    parmesan, err, _ = run_task(ctx, Task("parmesan", 2, 4, budget=None))
    assert not err and parmesan
    for m in {r.microbatches for r in hybrid}:
        h = min(r.iteration_seconds for r in hybrid if r.microbatches == m)
        p = min(r.iteration_seconds for r in parmesan if r.microbatches == m
                and r.schedule in {x.schedule for x in hybrid})
        assert h <= p * 1.02, (m, h, p)
    for r in hybrid:
        assert set(r.plan["hybrid"]["stage_choice"]) <= {"pase", "all-batch"}
        assert r.objective == "iteration_seconds"
