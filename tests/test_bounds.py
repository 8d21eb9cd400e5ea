"""Every lower bound a plan reports is a true bound: never above the plan's own value, for
every pipeline partitioner and mapper, over random graphs, shapes and topologies."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardplan import registry
from shardplan.errors import InfeasibleError
from shardplan.generate import layered
from shardplan.ir import Graph
from shardplan.topology import build

PARTITIONERS = ["parmesan", "pipedream", "pipedream-sequence", "uniform", "params", "metis"]


def _topology(kind: int, devices: int):
    if kind == 0:
        return build("flat", num_devices=devices, bandwidth=1e10, latency=1e-6)
    if kind == 1:
        return build("hierarchical", shape=(2, devices // 2), level_names=("box", "gpu"),
                     bandwidth=(1e9, 5e10), latency=(1e-5, 1e-6))
    return build("uniform-dist", num_devices=devices, seed=kind)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), shape=st.sampled_from([(2, 4), (4, 2), (1, 8), (8, 1),
                                                            (2, 2), (3, 2)]),
       kind=st.integers(0, 2), objective=st.sampled_from(["overlap", "eq3"]),
       algorithm=st.sampled_from(PARTITIONERS), heavy=st.booleans())
def test_reported_bounds_never_exceed_values(seed, shape, kind, objective, algorithm, heavy):
    s, r = shape
    g = layered(num_nodes=40, width=4, seed=seed, skip_probability=0.3)
    if heavy:  # one operator dominates: the bound's largest-operator term must divide by R
        flops = g.fwd_flops.copy()
        flops[int(g.topological_order[len(flops) // 2])] = flops.sum() * 3
        g = g.replace(fwd_flops=flops, bwd_flops=2 * flops)
    topo = _topology(kind, 8)
    try:
        view = {} if algorithm == "pipedream" else {"objective": objective}  # its own value
        plan = registry.run("partition", algorithm, g, topo, stages=s, replicas=r,
                            **view).plan
    except InfeasibleError:
        return
    assert plan.objective.lower_bound <= plan.objective.value * (1 + 1e-12)
    for mapper in ("consecutive", "optimal"):
        mapped = registry.run("map", mapper, g, topo, plan=plan, time_limit=2,
                              judge=False) if mapper == "optimal" else \
            registry.run("map", mapper, g, topo, plan=plan)
        if mapped.plan.objective.lower_bound is not None:
            assert mapped.plan.objective.lower_bound <= mapped.plan.objective.value * (1 + 1e-9)


def test_largest_operator_over_replicas():
    """Stage 0 holds an operator of 10 s; with 8 replicas sharing it, the stage takes 1.25 s,
    so a bound of 10 s would be wrong (it was, before replicas divided it)."""
    g = Graph.from_arrays(name="g", fwd_flops=[10e12 / 3, 1e9], src=[0], dst=[1])
    topo = build("flat", num_devices=16, flops=1e12)
    plan = registry.run("partition", "uniform", g, topo, stages=2, replicas=8).plan
    assert plan.objective.lower_bound == pytest.approx(10.0 / 8, rel=1e-9)
    assert plan.objective.lower_bound <= plan.objective.value
    assert math.isfinite(plan.objective.value)
    assert np.isclose(plan.objective.value, 10.0 / 8 + 0.0, rtol=0.2)
