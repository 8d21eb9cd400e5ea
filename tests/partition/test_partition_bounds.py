"""The pipeline partitioners' lower bound (``max(W / D, w_max / R)``, see
:func:`shardplan.cost.lower_bound_seconds`) and brute force's bounds pinned to exact values
on hand-made problems: a looser bound that stays valid would pass the tests that only check
bound <= value."""

from __future__ import annotations

import numpy as np
import pytest

from shardplan import registry
from shardplan.cost import lower_bound_seconds
from shardplan.ir import Device, Graph, Topology
from shardplan.partition.brute_force import imbalance_lower_bound
from shardplan.topology import build

#: Every pipeline partitioner that reports the work bound as its plan's lower bound.
PIPELINE = ["parmesan", "pipedream-sequence", "uniform", "params", "metis"]


def _chain() -> Graph:
    # Forward 1, 2, 1, 4, 1, 3 TFLOP (backward twice forward): 3, 6, 3, 12, 3, 9 s at 1e12,
    # 36 s in all, the largest node 12 s.
    return Graph.from_arrays(name="g", fwd_flops=[1e12, 2e12, 1e12, 4e12, 1e12, 3e12],
                             src=range(5), dst=range(1, 6))


@pytest.mark.parametrize(("shape", "bound"), [((4, 1), 12.0), ((2, 2), 9.0), ((1, 4), 9.0),
                                              ((2, 1), 18.0)])
@pytest.mark.parametrize("algorithm", PIPELINE)
def test_work_bound_by_hand(algorithm: str, shape: tuple[int, int], bound: float) -> None:
    # 4 stages x 1: the largest node alone (12 > 36 / 4); 2 x 2 and 1 x 4: its replicas
    # share it (12 / 2 < 36 / 4 = 9); 2 stages on 2 of the 4 devices: 36 / 2.
    g, t = _chain(), build("flat", num_devices=4, flops=1e12)
    s, r = shape
    plan = registry.run("partition", algorithm, g, t, stages=s, replicas=r).plan
    assert plan.objective.lower_bound == pytest.approx(bound, rel=1e-12)
    assert plan.objective.lower_bound <= plan.objective.value * (1 + 1e-12)


def test_work_bound_prices_all_work_at_the_fastest_device() -> None:
    devs = (Device("slow", 1e12, 1e12), Device("fast", 1e12, 3e12))
    t = Topology(name="t", devices=devs, bandwidth=[[0, 1e9], [1e9, 0]],
                 latency=[[0, 0], [0, 0]])
    g = _chain()  # 36 s at 1e12: 12 s at 3e12, largest node 4 s
    assert lower_bound_seconds(g, t) == pytest.approx(6.0)
    assert lower_bound_seconds(g, t, replicas=2) == pytest.approx(6.0)
    assert lower_bound_seconds(g, t, 1) == pytest.approx(12.0)
    assert g.lower_bounds(2)["bound"] == pytest.approx(18e12)
    assert g.lower_bounds(4) == pytest.approx(
        {"average": 9e12, "largest_node": 12e12, "bound": 12e12})


def test_a_partition_cut_short_keeps_the_work_bound() -> None:
    from shardplan.generate import layered

    g = layered(200, width=8, seed=0)
    t = build("flat", num_devices=8)
    plan = registry.run("partition", "parmesan", g, t, stages=8, time_limit=1e-3).plan
    trivial = lower_bound_seconds(g, t, 8)
    assert plan.objective.lower_bound is not None
    assert plan.objective.lower_bound >= trivial * (1 - 1e-12)


def test_water_filling_bound_more_cases() -> None:
    # Nothing left: the bound is the loads' own imbalance.
    assert imbalance_lower_bound([1.0, 5.0], 0.0, 3.0) == 8.0
    # 3 left over loads (2, 2, 8), mean 5: level 2 -> 3.5 each: 2 * 1.5^2 + 3^2.
    assert imbalance_lower_bound([2.0, 8.0, 2.0], 3.0, 5.0) == pytest.approx(13.5)
    # Level rises past the middle load: (0, 1, 9) with 5 left, mean 5: level 3.
    assert imbalance_lower_bound([9.0, 0.0, 1.0], 5.0, 5.0) == pytest.approx(2 * 4 + 16)


def test_brute_force_records_its_optimum_as_bound() -> None:
    g = Graph.from_arrays(name="c", fwd_flops=np.ones(4), src=range(3), dst=range(1, 4),
                          weight=[1.0, 1.0, 1.0, 1.0])
    plan = registry.run("partition", "brute-force", g,
                        build("flat", num_devices=2, latency=1.0)).plan
    assert plan.status == "optimal"
    assert plan.objective.value == plan.objective.lower_bound == 1.0


def test_water_filling_for_a_level_that_is_not_the_mean() -> None:
    # The bound holds for any reference level, not only the loads' final mean: the filled
    # loads do not depend on it (the sum is fixed), only the squares do.
    assert imbalance_lower_bound([5.0, 1.0], 0.0, 1.0) == 16.0
    # Loads (0, 2) with 2 left fill to (2, 2); against level 0: 4 + 4.
    assert imbalance_lower_bound([2.0, 0.0], 2.0, 0.0) == 8.0
